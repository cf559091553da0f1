"""The outcome columns the pages quote equal the committed artifacts they come from.

The README and the getting-started page quote the quick witness run's table; its source
is ``docs/_static/witness-quick/summary.md`` (with its ``provenance.json``), written by
``minip-learn reproduce docs-artifacts --only witness-quick``. The scaling page quotes
the full grid's ``docs/_static/scaling/summary.csv`` as a table. Times are not compared
(they belong to the machine); every outcome column is.
"""

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARTIFACT = ROOT / "docs" / "_static" / "witness-quick"
OUTCOMES = ("solved", "exact-match", "max error (median)", "epochs")


def _tables(text):
    """Every markdown pipe table in ``text`` (indented ones too) as a list of dicts."""
    tables, rows = [], []
    for line in text.splitlines() + [""]:
        line = line.strip()
        if line.startswith("|") and line.endswith("|"):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
            continue
        if len(rows) > 2:
            header = rows[0]
            tables.append([dict(zip(header, row)) for row in rows[2:]])
        rows = []
    return tables


def _witness_table(text):
    found = [t for t in _tables(text) if t and {"model", "rank", "solved"} <= set(t[0])]
    assert len(found) == 1, "expected one witness table"
    return {(row["model"], row["rank"]): row for row in found[0]}


def _same(quoted, stored):
    """A quoted cell equals the stored one, up to the digits it shows."""
    if quoted == stored:
        return True
    try:
        q, s = float(quoted), float(stored)
    except ValueError:
        return False
    decimals = len(quoted.split(".")[1]) if "." in quoted else 0
    return abs(q - s) <= 0.5 * 10.0 ** -decimals + 1e-12


def test_the_artifact_says_where_it_came_from():
    provenance = json.loads((ARTIFACT / "provenance.json").read_text())
    assert provenance["recipe"] == "witness" and provenance["grid"] == "quick"
    assert provenance["complete"]
    for key in ("command", "minip_learn_version", "git_commit", "settings", "cpu_count",
                "written_utc"):
        assert key in provenance


@pytest.mark.parametrize("page", ["README.md", "docs/getting_started.rst"])
def test_quoted_witness_table_equals_the_artifact(page):
    stored = _witness_table((ARTIFACT / "summary.md").read_text())
    quoted = _witness_table((ROOT / page).read_text())
    assert set(quoted) == set(stored)
    for key, row in quoted.items():
        for column in OUTCOMES:
            if column in row:
                assert _same(row[column], stored[key][column]), (page, key, column)


def test_the_comparison_can_fail():
    assert _same("2.00", "2") and _same("0.490", "0.49") and _same("126", "125.7")
    assert not _same("0.897", "0.898") and not _same("127", "125.7")
    assert not _same("2/2", "0/2")


def _list_table(text, caption):
    """The rows of the rST ``list-table`` whose caption starts with ``caption``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines)
                 if line.startswith(".. list-table:: " + caption))
    rows, cells = [], None
    for line in lines[start + 1:]:
        stripped = line.strip()
        if stripped.startswith("* - "):
            cells = [stripped[4:]]
            rows.append(cells)
        elif stripped.startswith("- ") and cells is not None:
            cells.append(stripped[2:])
        elif stripped and not stripped.startswith(":") and not line.startswith("   "):
            break
    return [dict(zip(rows[0], row)) for row in rows[1:]]


def test_scaling_page_table_equals_the_artifact():
    import pandas as pd

    folder = ROOT / "docs" / "_static" / "scaling"
    stored = pd.read_csv(folder / "summary.csv").set_index("n_bits")
    assert json.loads((folder / "provenance.json").read_text())["grid"] == "full"
    rows = _list_table((ROOT / "docs" / "scaling.rst").read_text(), "Full grid")
    assert [int(row["m"]) for row in rows] == list(stored.index)
    columns = {"sequences": "n_sequences", "certified (lower)": "certified_min_rank",
               "every probe failed at": "failed_rank_below",
               "constructive": "constructive_rank"}
    for row in rows:
        s = stored.loc[int(row["m"])]
        for quoted, column in columns.items():
            assert int(row[quoted].replace(",", "")) == int(s[column]), (row["m"], quoted)
        rank, route = row["smallest solving (upper)"].split(" ", 1)
        assert int(rank) == int(s["smallest_solving_rank"])
        assert route.strip("()") == s["upper_route"]
        assert row["softmax solved (epochs)"].startswith(
            "5/5" if s["softmax_solved"] == 1 else "")
