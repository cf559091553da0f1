"""Mutation score of the test suite over the library's numerical core.

Run from the repository root, in the environment of the README's test command with the
``mutation`` extra added (``pip install -e ".[mutation]"``)::

    python benchmarks/mutation_score.py                      # every area (hours on 2 cores)
    python benchmarks/mutation_score.py --only nn/mixers/    # one area
    python benchmarks/mutation_score.py --tally-only         # tally the last runs again

mutmut changes one operator, constant, argument or call at a time in the modules of an
area and runs the tests of the area that reach the changed function; a mutant is
*killed* when one of them fails (or runs past mutmut's timeout). Each area runs in its
own copy of the working tree, ``mutation-runs/<area>/``, whose ``[tool.mutmut]`` (see
``pyproject.toml``) names the area's modules and tests (:data:`AREAS`). The survivors
that no test can kill, because the change does not change what the code computes, are
listed with the reason in ``docs/_static/mutation/equivalent.json``; the score of an
area is

    killed / (mutants - equivalent - not run)

(*not run*: mutants an interrupted run did not reach, shown in their own column)

and is printed per area, with the survivors not yet listed, and written to
``docs/_static/mutation/score.json`` and ``score.csv`` (the table of
``docs/testing.rst``). The run exits with status 1 when an area scores below
``--min-score`` (default 0.9), or when the list names a mutant of a run area that no
longer exists or that a test now kills.
"""

import argparse
import json
import re
import shutil
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "_static" / "mutation"

#: the areas the score is reported for: label, the module prefix of its mutants' names,
#: mutmut's ``only_mutate`` patterns and the tests that may kill them
AREAS = [
    ("nn/feature_maps.py", "minip_learn.nn.feature_maps", ["minip_learn/nn/feature_maps.py"],
     ["tests/nn/test_map_formulas.py", "tests/nn/test_nn.py",
      "tests/nn/test_feature_map_table.py", "tests/nn/test_user_maps.py"]),
    ("nn/literature_maps.py", "minip_learn.nn.literature_maps",
     ["minip_learn/nn/literature_maps.py"],
     ["tests/nn/test_map_formulas.py", "tests/nn/test_literature_maps.py"]),
    # (not tests/nn/test_reference_independence.py: it parses the source, which mutmut
    # rewrites)
    ("nn/ops/", "minip_learn.nn.ops.", ["minip_learn/nn/ops/*"],
     ["tests/nn/test_ops.py", "tests/nn/test_causal.py", "tests/nn/test_last_position.py"]),
    ("nn/mixers/", "minip_learn.nn.mixers.", ["minip_learn/nn/mixers/*"],
     ["tests/nn/test_mixer_references.py", "tests/nn/test_mixers.py",
      "tests/nn/test_mamba_final_query.py"]),
    ("nn/readout.py", "minip_learn.nn.readout", ["minip_learn/nn/readout.py"],
     ["tests/nn/test_nn.py", "tests/nn/test_mixer_references.py"]),
    ("theory/bounds.py", "minip_learn.theory.bounds", ["minip_learn/theory/bounds.py"],
     ["tests/theory/test_theory.py", "tests/theory/test_theory_soundness.py",
      "tests/theory/test_certificates.py", "tests/test_properties.py"]),
    ("datasets/_minip.py", "minip_learn.datasets._minip", ["minip_learn/datasets/_minip.py"],
     ["tests/datasets/test_minip.py", "tests/datasets/test_minip_formulas.py",
      "tests/datasets/test_every_order.py", "tests/datasets/test_full_task.py",
      "tests/test_properties.py"]),
]
KILLED = {"killed", "timeout"}
#: a mutant name: module, ``.x`` and the mangled function (``xǁClassǁmethod`` for methods)
_NAME = re.compile(r"^(?P<module>[\w.]+?)\.x(?:ǁ|_)")


def _toml_list(items):
    return "[" + ", ".join(f'"{item}"' for item in items) + "]"


def prepare(workdir, only_mutate, tests):
    """A copy of the working tree (tracked and untracked files that git does not ignore)
    in ``workdir`` whose ``[tool.mutmut]`` mutates ``only_mutate`` and runs ``tests``."""
    if workdir.exists():
        shutil.rmtree(workdir)
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                            "--exclude-standard"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (workdir / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, workdir / name)
    config = (workdir / "pyproject.toml").read_text()
    config = re.sub(r"only_mutate = \[.*?\]", "only_mutate = " + _toml_list(only_mutate),
                    config, flags=re.S)
    config = re.sub(r"pytest_add_cli_args_test_selection = \[.*?\]",
                    "pytest_add_cli_args_test_selection = " + _toml_list(tests),
                    config, flags=re.S)
    (workdir / "pyproject.toml").write_text(config)


def run_mutmut(workdir, max_children):
    """Run ``mutmut run`` in ``workdir`` (its results land in ``workdir/mutants``)."""
    cmd = ["mutmut", "run"] + ([f"--max-children={max_children}"] if max_children else [])
    return subprocess.run(cmd, cwd=workdir).returncode


def read_results(workdir):
    """Every mutant's status from ``mutmut results --all true``: ``{name: status}``."""
    out = subprocess.run(["mutmut", "results", "--all", "true"], cwd=workdir, check=True,
                         capture_output=True, text=True).stdout
    results = {}
    for line in out.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep and _NAME.match(name):
            results[name] = status
    return results


def area_of(name):
    module = _NAME.match(name)["module"]
    for label, prefix, _, _ in AREAS:
        if module == prefix or (prefix.endswith(".") and module.startswith(prefix)):
            return label
    return None


def tally(results, equivalent):
    """Per area: mutants, killed, equivalent, survivors not listed and the score."""
    rows, unlisted = {}, defaultdict(list)
    counts = defaultdict(Counter)
    for name, status in results.items():
        area = area_of(name)
        if area is None:
            continue
        c = counts[area]
        c["mutants"] += 1
        if status == "not checked":      # an interrupted run: not counted either way
            c["not checked"] += 1
        elif status in KILLED:
            c["killed"] += 1
        elif name in equivalent:
            c["equivalent"] += 1
        else:
            c["survived"] += 1
            unlisted[area].append(f"{name} ({status})")
    for label, *_ in AREAS:
        c = counts[label]
        scored = c["mutants"] - c["equivalent"] - c["not checked"]
        rows[label] = {
            "mutants": c["mutants"], "killed": c["killed"], "equivalent": c["equivalent"],
            "survived": c["survived"], "not checked": c["not checked"],
            "score": round(c["killed"] / scored, 4) if scored else None,
        }
    return rows, unlisted


def _slug(label):
    return label.strip("/").replace("/", "-").replace(".py", "")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="AREA",
                        choices=[label for label, *_ in AREAS],
                        help="run these areas only (the other rows of score.json are kept)")
    parser.add_argument("--tally-only", action="store_true",
                        help="tally the last run's results (mutation-runs/) without running")
    parser.add_argument("--max-children", type=int, default=None,
                        help="parallel mutant runs (mutmut's default: the CPU count)")
    parser.add_argument("--min-score", type=float, default=0.9)
    args = parser.parse_args(argv)
    listed = json.loads((OUT / "equivalent.json").read_text())
    equivalent = {name: entry["reason"] for name, entry in listed.items()}
    score_file = OUT / "score.json"
    rows = json.loads(score_file.read_text())["areas"] if score_file.exists() else {}
    results = {}
    for label, _, only_mutate, tests in AREAS:
        if args.only and label not in args.only:
            continue
        workdir = ROOT / "mutation-runs" / _slug(label)
        if not args.tally_only:
            prepare(workdir, only_mutate, tests)
            run_mutmut(workdir, args.max_children)
        if (workdir / "mutants").is_dir():
            found = read_results(workdir)
            results.update(found)
    new_rows, unlisted = tally(results, equivalent)
    rows.update({label: row for label, row in new_rows.items()
                 if row["mutants"] > row["not checked"]})
    stale = [f"{name}: {results[name] if name in results else 'no such mutant'}"
             for name in equivalent
             if area_of(name) in {area_of(n) for n in results}
             and (name not in results or results[name] in KILLED)]
    print(f"{'module':<24}{'mutants':>9}{'killed':>8}{'equiv.':>8}{'survived':>10}"
          f"{'unrun':>7}{'score':>8}")
    for label, row in rows.items():
        score = "-" if row["score"] is None else f"{100 * row['score']:.1f}%"
        print(f"{label:<24}{row['mutants']:>9}{row['killed']:>8}{row['equivalent']:>8}"
              f"{row['survived']:>10}{row.get('not checked', 0):>7}{score:>8}")
    for label, names in unlisted.items():
        print(f"\n{label}: {len(names)} survivors not listed as equivalent "
              f"(mutmut show NAME, in mutation-runs/{_slug(label)}, prints the change)")
        print("\n".join(f"  {n}" for n in sorted(names)))
    if stale:
        print("\nequivalent.json lists mutants that are gone or killed:\n  " + "\n  ".join(stale))
    OUT.mkdir(parents=True, exist_ok=True)
    rows = {label: rows[label] for label, *_ in AREAS if label in rows}
    score_file.write_text(json.dumps(
        {"command": "python benchmarks/mutation_score.py", "areas": rows}, indent=1) + "\n")
    lines = ["module,mutants,killed,equivalent,survived,not run,score"] + [
        f"{label},{row['mutants']},{row['killed']},{row['equivalent']},{row['survived']},"
        f"{row.get('not checked', 0)},"
        + ("-" if row["score"] is None else f"{100 * row['score']:.1f} %")
        for label, row in rows.items()]
    (OUT / "score.csv").write_text("\n".join(lines) + "\n")
    low = [label for label, row in rows.items()
           if row["score"] is not None and row["score"] < args.min_score]
    return 1 if (low or stale) else 0


if __name__ == "__main__":
    sys.exit(main())
