"""feature_map_table(): the registry as rows, as the documentation's table shows it."""

import pytest

from minip_learn.nn import available_feature_maps, feature_map_table, get_feature_map

LIBRARY_MAPS = {
    "dpfp", "elu+1", "exp", "favor+", "hedgehog", "identity", "rebased", "relu", "rff",
    "softplus", "squared_relu", "t2r", "table", "taylor",
}


def test_rows_are_exactly_the_registry():
    rows = feature_map_table()
    assert [row["name"] for row in rows] == available_feature_maps()
    assert LIBRARY_MAPS <= {row["name"] for row in rows}


@pytest.mark.parametrize("row", feature_map_table(), ids=lambda row: row["name"])
def test_row_matches_the_class_declarations(row):
    cls = get_feature_map(row["name"])
    assert set(row) == {"name", "paper", "nonnegative", "kernel_nonnegative", "class"}
    assert row["class"] == f"{cls.__module__}.{cls.__qualname__}"
    assert row["nonnegative"] is bool(cls.nonnegative)
    assert row["kernel_nonnegative"] is bool(cls.kernel_nonnegative)
    # nonnegative features always give a nonnegative kernel
    assert row["kernel_nonnegative"] or not row["nonnegative"]


@pytest.mark.parametrize("name", sorted(LIBRARY_MAPS))
def test_every_library_map_declares_its_paper(name):
    cls = get_feature_map(name)
    assert "paper" in vars(cls), f"{name} inherits its paper instead of declaring it"
    assert isinstance(cls.paper, str) and cls.paper.strip()
    row = next(row for row in feature_map_table() if row["name"] == name)
    assert row["paper"] == cls.paper


def test_signed_maps_and_their_kernels():
    rows = {row["name"]: row for row in feature_map_table()}
    signed = {name for name, row in rows.items() if not row["nonnegative"]}
    assert signed == set(available_feature_maps(nonnegative=False))
    # signed features whose kernel is still >= 0 (the lower bound applies to them)
    assert {n for n in signed & LIBRARY_MAPS if rows[n]["kernel_nonnegative"]} == {
        "taylor", "rebased"}
