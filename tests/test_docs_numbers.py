"""The outcome columns the pages quote equal the committed artifacts they come from.

The README and the getting-started page quote the quick witness run's table; its source
is ``docs/_static/witness-quick/summary.md`` (with its ``provenance.json``), written by
``minip-learn reproduce docs-artifacts --only witness-quick``. The scaling page quotes
the full grid's ``docs/_static/scaling/summary.csv`` as a table. Times are not compared
(they belong to the machine); every outcome column is.
"""

import functools
import json
import re
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


# What the causal page says the mixers leaderboard found, each with the artifact cells
# that back it: (words on the page, family, mixer, column of table.csv, stored value).
MIXER_FINDINGS = [
    ("14 on the exact\n  ``m = 8`` family for every seed (none at 13 or 7)", "exact-m8",
     "kernel", "solved per state (k/n)", "7:0/3 13:0/3 14:3/3 28:3/3 56:3/3"),
    ("20 on its ``m = 12`` sibling\n  (one seed; none at 19 or 10)", "exact-m12-20w",
     "kernel", "solved per state (k/n)", "10:0/1 19:0/1 20:1/1 40:1/1 80:1/1"),
    ("and 80 on the whole exact ``m = 12`` family (every\n  seed; none at 79 or 40)",
     "exact-m12", "kernel", "solved per state (k/n)",
     "40:0/3 79:0/3 80:3/3 160:3/3 320:0/3"),
    ("and 80 on the whole exact ``m = 12`` family", "exact-m12", "kernel",
     "cannot: below the proven bound", "40 79"),
    ("first solve at twice", "small-m24", "kernel", "smallest solving state", "16"),
    ("first solve at twice", "small-m24-every-order", "positional",
     "smallest solving state", "16"),
    ("first solve at twice", "small-m24-every-order", "retnet", "smallest solving state",
     "16"),
    ("state, 4, for every seed", "small-m24", "positional", "solved per state (k/n)",
     "4:3/3 7:3/3 8:3/3 16:3/3 32:3/3"),
    ("7 of 14\n  at ``m = 8``", "exact-m8", "positional", "smallest solving state", "7"),
    ("10 of 20 at ``m = 12``", "exact-m12-20w", "positional", "smallest solving state",
     "10"),
    ("40 of 80 on all of them, every\n  seed", "exact-m12", "positional",
     "solved per state (k/n)", "40:3/3 79:3/3 80:3/3 160:3/3 320:2/3"),
    ("(280 sequences) it first solves\n  at 16", "small-m24-every-order", "positional",
     "smallest solving state", "16"),
    ("witness at state 4 in both orders, for every seed", "small-m24", "mamba",
     "solved per state (k/n)", "4:3/3 7:3/3 8:3/3 16:3/3 32:3/3"),
    ("witness at state 4 in both orders, for every seed", "small-m24-every-order", "mamba",
     "solved per state (k/n)", "4:3/3 7:3/3 8:3/3 16:3/3 32:3/3"),
    ("family at state 7 (two seeds of three; 56 floats", "exact-m8", "deltanet",
     "solved per state (k/n)", "7:2/3 13:2/3 14:3/3 28:3/3 56:3/3"),
    ("family at state 7 (two seeds of three; 56 floats", "exact-m8", "deltanet",
     "state floats there", "56"),
    ("the 20-word exact ``m = 12`` family at 19", "exact-m12-20w", "deltanet",
     "smallest solving state", "19"),
    ("and the whole one at 40, half\n  its exact rank (one seed of three)", "exact-m12",
     "deltanet", "solved per state (k/n)", "40:1/3 79:1/3 80:1/3 160:2/3 320:2/3"),
    ("``m = 8`` family at 13 for one seed of three", "exact-m8", "gla",
     "solved per state (k/n)", "7:0/3 13:1/3 14:1/3 28:1/3 56:0/3"),
    ("gave DeltaNet 0.1 (6 of 6 fits solved, against 5 of 6 at 0.01 and 0.03)",
     "exact-m8", "deltanet", "lr sweep (solved per lr)", "0.01:5/6 0.03:5/6 0.1:6/6"),
    ("gave DeltaNet 0.1", "small-m24", "deltanet", "lr", "0.1"),
    ("did not train on either ``m = 24`` witness (0 of 30 fits)", "small-m24", "deltanet",
     "did not train (unsolved/n)", "4:3/3 7:3/3 8:3/3 16:3/3 32:3/3"),
    ("did not train on either ``m = 24`` witness (0 of 30 fits)", "small-m24-every-order",
     "deltanet", "did not train (unsolved/n)", "4:3/3 7:3/3 8:3/3 16:3/3 32:3/3"),
    ("GLA at the sweep's 0.01", "small-m24", "gla", "lr", "0.01"),
    ("solves the ``m = 24`` witness from state 8", "small-m24", "gla",
     "smallest solving state", "8"),
    ("its ``-every-order`` family at 16 and\n  32 for every seed", "small-m24-every-order",
     "gla", "solved per state (k/n)", "4:0/3 7:0/3 8:0/3 16:3/3 32:3/3"),
    ("linear attention solved nothing at any of the three\n  rates", "exact-m8", "linear",
     "lr sweep (solved per lr)", "0.01:0/6 0.03:0/6 0.1:0/6"),
    ("the 20-word exact ``m = 12`` family at every state of the grid", "exact-m12-20w",
     "softmax", "solved per state (k/n)", "10:1/1 19:1/1 20:1/1 40:1/1 80:1/1"),
    ("the whole one at\n  every state (three seeds of 3 at each but 320, two)", "exact-m12",
     "softmax", "solved per state (k/n)", "40:3/3 79:3/3 80:3/3 160:3/3 320:2/3"),
    ("R6 at every state (2, 3, 3 and 1 seeds of 3 at 8, 17, 34 and\n  68)", "auto-m24",
     "softmax", "solved per state (k/n)", "8:2/3 17:3/3 34:3/3 68:1/3"),
    ("first solve at state 68 (certified 17, constructive 46), one seed of\n  three each",
     "auto-m24", "kernel", "solved per state (k/n)", "8:0/3 17:0/3 34:0/3 68:1/3"),
    ("first solve at state 68 (certified 17, constructive 46), one seed of\n  three each",
     "auto-m24", "retnet", "solved per state (k/n)", "8:0/3 17:0/3 34:0/3 68:1/3"),
]


@functools.cache
def _mixers_table():
    import csv

    path = ROOT / "docs" / "_static" / "extended" / "mixers" / "table.csv"
    with path.open(newline="") as f:
        return {(row["family"], row["mixer"]): row for row in csv.DictReader(f)}


@pytest.mark.parametrize("words, family, mixer, column, value", MIXER_FINDINGS)
def test_causal_page_findings_equal_the_mixers_artifact(words, family, mixer, column, value):
    page = (ROOT / "docs" / "causal.rst").read_text()
    assert words in page, words
    assert _mixers_table()[family, mixer][column] == value, (family, mixer, column)


def test_causal_page_counts_of_the_mixers_artifact():
    table = _mixers_table()
    page = (ROOT / "docs" / "causal.rst").read_text()
    # "Nothing the proof covers solved below its line"
    proven = [row for row in table.values() if row["bound proven here"] == "yes"]
    assert proven and all(row["below the bound"] == "no" for row in proven)
    assert "Nothing the proof covers solved below its line, and the kernel mixer" in page
    # "only once in 30 fits": causal softmax on the m = 24 witness, both orders

    def solved(row):
        return [tuple(map(int, cell.split(":")[1].split("/")))
                for cell in row["solved per state (k/n)"].split()]

    cells = solved(table["small-m24", "softmax"]) + \
        solved(table["small-m24-every-order", "softmax"])
    assert (sum(k for k, _ in cells), sum(n for _, n in cells)) == (1, 30)
    assert "only once in 30 fits" in page
    # the control solved every family it is expected to
    summary = (ROOT / "docs" / "_static" / "extended" / "mixers" / "summary.md").read_text()
    assert "- [x] the control (softmax) solved every family it solved before" in summary
    assert "INVALID" not in summary and "softmax, the control" in page
    # "the kernel head's proven 14 x 10": 10 floats per unit of rank on exact m = 8
    kernel = table["exact-m8", "kernel"]
    assert "14 x 10" in page and kernel["certified rank"] == "14"
    assert int(kernel["state floats there"]) == 10 * int(kernel["smallest solving state"])


WHOLE_FAMILY = ROOT / "docs" / "_static" / "extended" / "mixers" / "runs"
#: sequences of the whole exact m = 12 family in final-query form
WHOLE_FAMILY_SIZE = 12_720


@functools.cache
def _whole_family_records():
    # every fit record of the whole exact m = 12 family in the committed run folder
    # ("mixers-exact-m12-<mixer>-<hash>"; the 20-word family's folders start with a digit)
    return tuple(json.loads(path.read_text())
                 for path in WHOLE_FAMILY.glob("mixers-exact-m12-[a-z]*/fit-*.json"))


def _causal_words():
    # the causal page with its line breaks and indents as single spaces
    return " ".join((ROOT / "docs" / "causal.rst").read_text().split())


def test_mixers_table_whole_family_rows_equal_the_run_folder():
    # the table's rows of the whole family were written from every one of its fits in
    # the committed run folder: 8 mixers x 5 states x 3 seeds, and per mixer the seeds
    # solved at each state
    records = _whole_family_records()
    assert len(records) == 120
    solved = {}
    for r in records:
        solved.setdefault(r["mixer"], {}).setdefault(r["state_size"], []).append(
            bool(r["solved"]))
    table = _mixers_table()
    assert sorted(solved) == sorted(m for f, m in table if f == "exact-m12")
    for mixer, by in solved.items():
        assert sorted(by) == [40, 79, 80, 160, 320]
        assert table["exact-m12", mixer]["solved per state (k/n)"] == " ".join(
            f"{s}:{sum(v)}/{len(v)}" for s, v in sorted(by.items())), mixer
    assert "The table shows the six families" in _causal_words()


def _record_value(record, field):
    """A field of a whole-family fit record as the page gives it: ``"right"`` and
    ``"wrong"`` count sequences of the family's 12,720, errors to two decimals."""
    if field in ("right", "wrong"):
        right = round(record["exact_match"] * WHOLE_FAMILY_SIZE)
        return right if field == "right" else WHOLE_FAMILY_SIZE - right
    if field == "max_abs_error":
        return round(record[field], 2)
    return record[field]


def _per_seed(mixer, state, field):
    rows = sorted((r for r in _whole_family_records()
                   if (r["mixer"], r["state_size"]) == (mixer, state)),
                  key=lambda r: r["seed"])
    return tuple(_record_value(r, field) for r in rows)


#: the causal page's prose on the whole family's fits: (words on the page, mixer, state,
#: field of the fit records, its value for seeds 0, 1, 2)
WHOLE_FAMILY_FINDINGS = [
    ("at its exact rank 80 for every seed (1,414, 1,068 and\n  1,375 epochs", "kernel", 80,
     "n_epochs", (1414, 1068, 1375)),
    ("and at 160, and at neither 40 nor 79", "kernel", 160, "solved", (True,) * 3),
    ("and at 160, and at neither 40 nor 79", "kernel", 40, "solved", (False,) * 3),
    ("79 every seed leaves 2 of the 12,720 sequences wrong", "kernel", 79, "wrong",
     (2, 2, 2)),
    ("(maximum error 1.94, 1.92 and\n  1.94)", "kernel", 79, "max_abs_error",
     (1.94, 1.92, 1.94)),
    ("At 320 each seed leaves one sequence wrong after\n  1,500 epochs", "kernel", 320,
     "wrong", (1, 1, 1)),
    ("At 320 each seed leaves one sequence wrong after\n  1,500 epochs", "kernel", 320,
     "n_epochs", (1500, 1500, 1500)),
    ("(at\n  320, seed 2 leaves 2 sequences wrong)", "softmax", 320, "wrong", (0, 0, 2)),
    ("solves it at every state for every seed but one", "softmax", 160, "solved",
     (True,) * 3),
    ("at 80 its seeds leave 1, 4 and 1\n  sequences wrong", "retnet", 80, "wrong",
     (1, 4, 1)),
    ("and up to 6 at the other states from 79 up", "retnet", 79, "wrong", (5, 3, 6)),
    ("and up to 6 at the other states from 79 up", "retnet", 160, "wrong", (1, 4, 3)),
    ("and up to 6 at the other states from 79 up", "retnet", 320, "wrong", (1, 2, 3)),
    ("state, at 40 too (seed 2, 1,137 epochs)", "deltanet", 40, "n_epochs",
     (1500, 1500, 1137)),
    ("five of them with the same 10,752 sequences wrong", "deltanet", 40, "wrong",
     (10752, 12640, 0)),
    ("five of them with the same 10,752 sequences wrong", "deltanet", 80, "wrong",
     (0, 10752, 10752)),
    ("five of them with the same 10,752 sequences wrong", "deltanet", 160, "wrong",
     (0, 10752, 0)),
    ("five of them with the same 10,752 sequences wrong", "deltanet", 320, "wrong",
     (0, 10752, 0)),
    ("(at 40: 745, 162 and 123 epochs)", "positional", 40, "n_epochs", (745, 162, 123)),
    ("but one at 320 (2 sequences wrong,\n  maximum error 0.60)", "positional", 320,
     "wrong", (2, 0, 0)),
    ("but one at 320 (2 sequences wrong,\n  maximum error 0.60)", "positional", 320,
     "max_abs_error", (0.6, 0.48, 0.48)),
    ("(maximum error 5.05 to 239.12\n  after 1,500 epochs)", "linear", 40, "max_abs_error",
     (7.85, 32.53, 5.05)),
    ("(maximum error 5.05 to 239.12\n  after 1,500 epochs)", "linear", 320, "max_abs_error",
     (44.9, 239.12, 17.87)),
    ("GLA solves it at no state for any seed", "gla", 160, "solved", (False,) * 3),
    ("at most 904 of the 12,720 sequences are right", "gla", 40, "wrong",
     (12641, 12642, 12412)),
    ("at most 904 of the 12,720 sequences are right", "gla", 320, "wrong",
     (12202, 11816, 12571)),  # 518, 904 and 149 right
    ("(maximum error 3.35 to 5.00)", "gla", 40, "max_abs_error", (3.35, 3.58, 3.61)),
    ("(maximum error 3.35 to 5.00)", "gla", 160, "max_abs_error", (4.05, 5.0, 4.54)),
]


@pytest.mark.parametrize("words, mixer, state, field, values", WHOLE_FAMILY_FINDINGS)
def test_causal_page_whole_family_findings_equal_the_fit_records(words, mixer, state,
                                                                   field, values):
    page = _causal_words()
    assert " ".join(words.split()) in page, words
    assert _per_seed(mixer, state, field) == values, (mixer, state, field)



#: ranges the causal page gives over every fit of a mixer on the whole family: (words
#: on the page, mixer, field of the fit records, its smallest and largest value)
WHOLE_FAMILY_RANGES = [
    ("(maximum error 5.05 to 239.12\n  after 1,500 epochs)", "linear", "max_abs_error",
     (5.05, 239.12)),
    ("(maximum error 3.35 to 5.00)", "gla", "max_abs_error", (3.35, 5.0)),
    ("at most 904 of the 12,720 sequences are right", "gla", "right", (20, 904)),
    ("its fits leave 3,208 to\n  6,530 of the 12,720 sequences wrong", "mamba", "wrong",
     (3208, 6530)),
    ("(maximum error 1.74 to 3.62)", "mamba", "max_abs_error", (1.74, 3.62)),
    ("(of GLA's and Mamba's 30, none)", "gla", "n_epochs", (1500, 1500)),
    ("(of GLA's and Mamba's 30, none)", "mamba", "n_epochs", (1500, 1500)),
]


@pytest.mark.parametrize("words, mixer, field, bounds", WHOLE_FAMILY_RANGES)
def test_causal_page_whole_family_ranges_equal_the_fit_records(words, mixer, field, bounds):
    page = _causal_words()
    assert " ".join(words.split()) in page, words
    values = [_record_value(r, field) for r in _whole_family_records()
              if r["mixer"] == mixer]
    assert len(values) == 15
    assert (min(values), max(values)) == bounds, (mixer, field)


#: the causal page's epoch times of the whole family's costliest stacks (three seeds at
#: one state): (words on the page, mixer, state, seconds an epoch of the stack)
WHOLE_FAMILY_STACK_EPOCHS = [
    ("at 1.9 s an epoch for GLA", "gla", 320, 1.9),
    ("2.4 s for Mamba at state 320", "mamba", 320, 2.4),
    ("and 1.0 s for\n  GLA at 160", "gla", 160, 1.0),
]


@pytest.mark.parametrize("words, mixer, state, seconds", WHOLE_FAMILY_STACK_EPOCHS)
def test_causal_page_whole_family_stack_epochs_equal_the_fit_records(words, mixer, state,
                                                                      seconds):
    # a stack's records share its wall time out equally over its members as fit_time
    page = _causal_words()
    assert " ".join(words.split()) in page, words
    rows = [r for r in _whole_family_records()
            if (r["mixer"], r["state_size"]) == (mixer, state)]
    assert len(rows) == 3 and len({r["fit_time"] for r in rows}) == 1
    assert {r["n_epochs"] for r in rows} == {1500}
    assert round(3 * rows[0]["fit_time"] / 1500, 1) == seconds


def test_causal_page_whole_family_cpu_hours_equal_the_fit_records():
    # "its 120 fits took 7.0 CPU-hours in all", wherever the page gives the figure
    hours = sum(r["fit_cpu_time"] for r in _whole_family_records()) / 3600
    given = re.findall(r"took ([0-9.]+) CPU-hours", _causal_words())
    assert len(given) == 3 and set(given) == {f"{hours:.1f}"}, given

#: the theory page's r*(m) prose: (words on the page, m, summary.csv column, value)
FULL_TASK_FINDINGS = [
    ("exact at ``m = 2..5``: 1, 1, 2, 3", 2, "lower_bound", "1"),
    ("exact at ``m = 2..5``: 1, 1, 2, 3", 5, "lower_bound", "3"),
    ("exact at ``m = 2..5``: 1, 1, 2, 3", 5, "smallest_solving_rank", "3"),
    ("``r*(m)`` lies in 3..8,\n3..16 and 3..32", 6, "smallest_solving_rank", "8"),
    ("``r*(m)`` lies in 3..8,\n3..16 and 3..32", 8, "smallest_solving_rank", "32"),
    ("``r*(m)`` lies in 3..8,\n3..16 and 3..32", 8, "lower_bound", "3"),
    ("3 at ``m = 9, 10``", 10, "lower_bound", "3"),
    ("4 at 11 and 12", 11, "lower_bound", "4"),
    ("4 at 11 and 12", 12, "lower_bound", "4"),
    ("8\nat 16", 16, "lower_bound", "8"),
    ("12 at 20, 18 at 24", 20, "lower_bound", "12"),
    ("12 at 20, 18 at 24", 24, "lower_bound", "18"),
    ("27 at 28 and **53 at 32**", 28, "lower_bound", "27"),
    ("27 at 28 and **53 at 32**", 32, "lower_bound", "53"),
    ("rank 46 (degree 2) at ``m = 9``", 9, "smallest_solving_rank", "46"),
    ("2,517 at 16, 21,700 at 20, 190,051 at 24", 16, "smallest_solving_rank", "2517"),
    ("2,517 at 16, 21,700 at 20, 190,051 at 24", 20, "smallest_solving_rank", "21700"),
    ("2,517 at 16, 21,700 at 20, 190,051 at 24", 24, "smallest_solving_rank", "190051"),
    ("**15,033,173** (degree 8) at 32", 32, "smallest_solving_rank", "15033173"),
    ("**15,033,173** (degree 8) at 32", 32, "overlap_degree", "8"),
    ("the gap is 3..8 at ``m = 6``\nand 53..15,033,173", 6, "lower_bound", "3"),
    ("R5 certificates reach\n2 only up to ``m = 8``", 8, "certified_min_rank", "2"),
]


@functools.cache
def _full_task_summary():
    import csv

    path = ROOT / "docs" / "_static" / "full-task" / "summary.csv"
    with path.open(newline="") as f:
        return {int(row["n_bits"]): row for row in csv.DictReader(f)}


@pytest.mark.parametrize("words, m, column, value", FULL_TASK_FINDINGS)
def test_theory_page_r_star_equals_the_full_task_grid(words, m, column, value):
    page = (ROOT / "docs" / "theory.rst").read_text()
    assert words in page, words
    assert _full_task_summary()[m][column] == value, (m, column)


def test_theory_page_growth_equals_the_full_task_grid():
    import csv

    page = " ".join((ROOT / "docs" / "theory.rst").read_text().split())
    with (ROOT / "docs" / "_static" / "full-task" / "growth.csv").open(newline="") as f:
        growth = {row["bound"]: row for row in csv.DictReader(f)}
    lo, up = growth["lower"], growth["upper"]
    quoted = (f"grows by {float(lo['slope']):.3f} bits of rank per bit of token (95% "
              f"interval {float(lo['ci_low']):.3f} to {float(lo['ci_high']):.3f}) and the "
              f"upper bound by {float(up['slope']):.3f} ({float(up['ci_low']):.3f} to "
              f"{float(up['ci_high']):.3f})")
    assert quoted in page, quoted
    assert f"Over ``m = {growth['lower']['from_bits']}..32``" in page
