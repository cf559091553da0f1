"""The pages agree with each other where a number or a name could drift apart.

Plain text checks on ``README.md`` and ``docs/*.rst`` (no training, no Sphinx build):
the names of the results against the theory page, the test-install command against the
README's, the citation and license files the README links, the copy button of the
documentation site, the runtimes the pages quote against the table of
``docs/performance.rst`` that says where they were measured, and the terms a newcomer
meets before their definition.
"""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = [README, *sorted(DOCS.glob("*.rst"))]
ARXIV_ID = "2608.11427"


def _text(path):
    return path.read_text(encoding="utf-8")


def _name(path):
    return path.relative_to(ROOT).as_posix()


# --------------------------------------------------------------------------- R-names

_R_SET = re.compile(r"\bR1\s*(?:-|–|--|to)\s*R(\d+)\b")
_R_NAME = re.compile(r"\bR(\d+)\b")
#: "R1-R3" names the exact constructions; any other "R1-Rk" names the whole set
_CONSTRUCTIONS = 3


def _theory_sections():
    """The numbers of the results the theory page states, one section title each
    (``R6 -- witness families``)."""
    titles = re.findall(r"^R(\d+) -- ", _text(DOCS / "theory.rst"), flags=re.M)
    return sorted(int(n) for n in titles)


def test_r_names_agree_with_the_theory_page():
    sections = _theory_sections()
    assert sections == list(range(1, len(sections) + 1)), sections
    highest = sections[-1]
    wrong_sets, highest_used = [], {}
    for page in PAGES:
        text = _text(page)
        wrong_sets += [f"{_name(page)}: R1-R{k}" for k in _R_SET.findall(text)
                       if int(k) not in (_CONSTRUCTIONS, highest)]
        used = [int(n) for n in _R_NAME.findall(text)]
        if used:
            highest_used[_name(page)] = max(used)
    assert not wrong_sets, (
        f"the theory page states R1-R{highest}; these pages name the set otherwise: "
        f"{wrong_sets}")
    assert max(highest_used.values()) == highest, highest_used
    assert re.search(rf"results R1-R{highest}\b", _text(DOCS / "theory.rst"))


def test_the_readme_introduces_the_r_names_before_using_them():
    text = _text(README)
    first = _R_NAME.search(text)
    intro = re.search(r"R1-R\d+ \(the \*R-names\*\)", text)
    assert intro, "the README should say what the R-names are"
    assert first.start() == intro.start(), (
        f"the README uses {first.group()} before saying what the R-names are: "
        f"...{text[max(0, first.start() - 80):first.end()]}")


# --------------------------------------------------------------------------- terms


def _glossary_terms():
    """The terms of the ``.. glossary::`` directive of docs/glossary.rst."""
    terms, inside = set(), False
    for line in _text(DOCS / "glossary.rst").splitlines():
        if line.startswith(".. glossary::"):
            inside = True
        elif inside and re.match(r"^   \S", line):
            terms.add(line.strip())
        elif inside and line.strip() and not line.startswith(" "):
            inside = False
    return terms


def test_the_glossary_defines_the_words_a_newcomer_meets_first():
    missing = {"solves", "assignment trap", "R-names", "R1", "R9"} - _glossary_terms()
    assert not missing, f"docs/glossary.rst does not define {sorted(missing)}"


@pytest.mark.parametrize("term", ["solves", "assignment trap"])
def test_the_readme_explains_a_term_where_it_first_appears(term):
    """The first use of the term is followed, in the same paragraph, by its meaning."""
    text = _text(README)
    start = text.index(term)
    paragraph = " ".join(text[start:text.find("\n\n", start)].split())
    assert "within 1/2" in paragraph or "](docs/glossary.rst)" in paragraph, (
        f"the README's first '{term}' is not explained in its paragraph: {paragraph!r}")


# --------------------------------------------------------------------------- install


def _readme_test_command():
    blocks = re.findall(r"```bash\n(.*?)```", _text(README), flags=re.S)
    commands = [line for block in blocks for line in block.splitlines()
                if "install.sh test" in line and "python -m pytest" in line]
    assert len(commands) == 1, commands
    return commands[0].strip()


def test_every_test_install_command_is_the_readmes():
    readme = _readme_test_command()
    extras = re.search(r"\./install\.sh (\S+)", readme).group(1)
    assert extras == "test,fla"
    wrong = []
    for page in PAGES:
        for line in _text(page).splitlines():
            for found in re.findall(r"\./install\.sh ([\w,]*test[\w,]*)", line):
                if found != extras:
                    wrong.append(f"{_name(page)}: ./install.sh {found}")
            if "install.sh" in line and "python -m pytest" in line \
                    and "benchmark" not in line and line.strip() != readme:
                wrong.append(f"{_name(page)}: {line.strip()}")
    assert not wrong, f"the README installs the tests with '{readme}'; these differ: {wrong}"
    assert readme in _text(DOCS / "getting_started.rst")


# --------------------------------------------------------------------------- citing


@pytest.mark.parametrize("target", ["LICENSE", "CITATION.cff"])
def test_the_readme_links_an_existing_file(target):
    links = set(re.findall(r"\]\(([^)\s#]+)\)", _text(README)))
    assert target in links, f"the README does not link {target}"
    assert (ROOT / target).is_file(), f"the README links {target}, which does not exist"


def test_the_citation_names_the_paper():
    cff = _text(ROOT / "CITATION.cff")
    assert ARXIV_ID in cff
    readme = _text(README)
    assert f"eprint        = {{{ARXIV_ID}}}" in readme
    assert "archivePrefix = {arXiv}" in readme
    assert "BSD-3-Clause" in _text(ROOT / "LICENSE") or "BSD 3-Clause" in _text(ROOT / "LICENSE")
    assert re.search(r"^## How to cite$", readme, flags=re.M)


# --------------------------------------------------------------------------- copy button


def _conf_assignments():
    tree = ast.parse(_text(DOCS / "conf.py"))
    values = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            try:
                values[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return values


def test_the_docs_have_a_copy_button_that_leaves_out_prompts_and_output():
    conf = _conf_assignments()
    assert "sphinx_copybutton" in conf["extensions"]
    prompt = re.compile(conf["copybutton_prompt_text"])
    assert conf["copybutton_prompt_is_regexp"] is True
    assert conf["copybutton_only_copy_prompt_lines"] is True
    for line in (">>> x = 1", "... y = 2", "$ ls"):
        assert prompt.match(line), line
    assert not prompt.match("17 46")


# --------------------------------------------------------------------------- runtimes

_RUNTIME = re.compile(r"\b\d[\d,.]*(?:-\d[\d,.]*)? ?(?:ms|s|min|minutes|seconds|hours|days)\b")


def _measured_runtimes():
    """The table of docs/performance.rst "Timings on these pages": run -> wall time."""
    text = _text(DOCS / "performance.rst")
    section = text[text.index(".. _timings:"):text.index("What is measured\n")]
    rows = re.findall(r"^   \* - (.*?)\n     - (.*?)$", section, flags=re.M | re.S)
    return {" ".join(run.split()): time.strip() for run, time in rows[1:]}


def _one(pattern, text, where):
    found = set(re.findall(pattern, text))
    assert len(found) == 1, f"{where}: expected one runtime for {pattern!r}, found {found}"
    return found.pop()


def test_quoted_runtimes_are_the_measured_ones():
    measured = _measured_runtimes()
    quick, full, sweep, bench = (
        next(t for run, t in measured.items() if key in run)
        for key in ("witness --quick", "--ensemble", "GridSearchCV", "benchmark-only"))
    readme, started = _text(README), _text(DOCS / "getting_started.rst")
    performance = _text(DOCS / "performance.rst")
    for where, text in (("README.md", readme), ("getting_started.rst", started)):
        assert _one(r"(\d+ s) wall", text, where) == quick
        flat = " ".join(text.split())
        assert _one(r"five seeds[:( ]+(\d+ min \d+ s)", flat, where) == full
        assert re.search(rf"\({re.escape(sweep)}\b", flat), f"{where}: the sweep's {sweep}"
    assert _one(r"`benchmarks/` \((\d+ min \d+ s) on", readme, "README.md") == bench
    assert _one(r"\((\d+ min \d+ s) on the idle 2-core", performance,
                "performance.rst") == bench
    assert _one(r"the whole suite takes (\d+ min \d+ s)", performance,
                "performance.rst") == bench
    assert f"**{full}** wall" in performance
    low, high = map(int, re.search(r"\((\d+)-(\d+) s for the whole quick command",
                                   " ".join(performance.split())).groups())
    assert low <= int(quick.split()[0]) <= high


def test_every_page_with_runtimes_says_where_they_were_measured():
    """A page that quotes a runtime links the timings of docs/performance.rst and says
    how much slower a loaded machine can be (the README: its "Timings" note)."""
    missing = []
    for page in PAGES:
        text = _text(page)
        if page.name in ("performance.rst", "changelog.rst") or not _RUNTIME.search(text):
            continue
        if page == README:
            note = re.search(r"\*\*Timings\.\*\*(.*?)\n\n", text, flags=re.S)
            ok = note and "3 to 6 times" in note.group(1) \
                and "docs/performance.rst" in note.group(1)
        else:
            ok = ":ref:`timings`" in text and "3 to 6 times" in text
        if not ok:
            missing.append(_name(page))
    assert not missing, f"pages that quote runtimes without the timings note: {missing}"
    assert "3 to 6 times" in _text(DOCS / "performance.rst")
    assert ".. _timings:" in _text(DOCS / "performance.rst")


# --------------------------------------------------------------------------- the sweep


def test_the_sweep_example_reads_solved_per_rank_over_seeds():
    """``mean_test_solved`` is 0 or 1 per (rank, seed) row of ``cv_results_``: the
    pages average it over the seeds of a rank, and call only that mean a fraction."""
    for page in (README, DOCS / "getting_started.rst"):
        flat = " ".join(_text(page).split())
        assert 'groupby("param_rank")["mean_test_solved"].mean()' in flat, _name(page)
        assert not re.search(r"mean_test_solved\W*\s(?:is|gives) the fraction", flat), (
            f"{_name(page)}: calls mean_test_solved itself a fraction of seeds")
