"""Every Python block of the README and the narrative pages runs on its own.

The blocks are read from the files at test time: ```python fences in ``README.md``;
``.. code-block:: python`` (also ``code``/``sourcecode``, ``py``/``python3``/``pycon``)
directives, doctest blocks (``>>>`` paragraphs) and ``::`` literal blocks that hold
doctests on the rST pages. Each block is one test, with an id ``page:line`` (the line of
the fence, directive or ``::`` paragraph, or of the first ``>>>``), and runs alone in a
fresh namespace, as if pasted into a new interpreter: in an empty temporary working
directory, with ``MPLBACKEND=Agg`` and torch on one thread. Blocks written as
doctests (``>>>``) also have their shown output compared (``ELLIPSIS`` and
``NORMALIZE_WHITESPACE``); other blocks must run without raising.

A block that genuinely takes minutes may be marked on its page with an rST comment
right before it, ``.. snippet: skip (takes N minutes)``; the test reports it as skipped
with that reason. Shell blocks (``bash``, ``text``, ...) are not run, and a bare ``::``
literal block that is valid Python but not a doctest fails ``test_no_untested_python``:
it should say which it is (``.. code-block:: python`` or ``.. code-block:: text``).

Identical blocks on two pages (the README's GridSearchCV sweep is repeated in
getting started) run once per session; selected alone, each runs.
"""

import ast
import doctest
import linecache
import re
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

#: page -> the number of Python blocks counted on it: the parser must find at least
#: these, so that a regression in it cannot silently test nothing.
MIN_BLOCKS = {
    "README.md": 1,
    "getting_started.rst": 1,
    "user_guide.rst": 6,
    "results_folders.rst": 0,
    "bad_input.rst": 0,
    "theory.rst": 8,
    "results.rst": 0,
    "glossary.rst": 0,
    "exact.rst": 5,
    "causal.rst": 8,
}

PYTHON_LANGUAGES = {"python", "python3", "py", "pycon"}

_DIRECTIVE = re.compile(r"^(?P<indent>\s*)\.\.\s+(?:code-block|code|sourcecode)::\s*(?P<lang>\S*)\s*$")
_SKIP = re.compile(r"^\s*\.\.\s+snippet:\s*skip\b\s*(?:\((?P<reason>.*)\))?\s*$")
_LITERAL = re.compile(r"^(?P<indent>\s*)(?!\.\.\s)\S.*::\s*$")
_FENCE = re.compile(r"^(?P<indent>\s*)```\s*(?P<lang>[\w+-]*)\s*$")


@dataclass
class Block:
    page: str           # file name, e.g. "user_guide.rst"
    path: Path
    line: int           # 1-based line of the directive, fence, "::" or first ">>>" line
    first_line: int     # 1-based line of the first line of ``source``
    source: str         # dedented code
    kind: str           # "python" (code), "doctest", or "literal" (bare ``::``, not Python)
    skip: str | None = None

    @property
    def id(self):
        return f"{self.page}:{self.line}"


def _indent(line):
    return len(line) - len(line.lstrip())


def _indented_body(lines, start, parent_indent):
    """Lines from ``start`` on that are blank or indented deeper than ``parent_indent``.

    Returns ``(first, end)``: the index of the first non-blank line and the index after
    the last non-blank line of the body (``first == end`` for an empty body)."""
    end = first = None
    i = start
    while i < len(lines):
        line = lines[i]
        if line.strip():
            if _indent(line) <= parent_indent:
                break
            if first is None:
                first = i
            end = i + 1
        i += 1
    if first is None:
        return start, start
    return first, end


def _dedent(lines):
    body = [ln for ln in lines if ln.strip()]
    cut = min(_indent(ln) for ln in body) if body else 0
    return "\n".join(ln[cut:] if ln.strip() else "" for ln in lines) + "\n"


def _is_doctest(source):
    stripped = source.lstrip()
    return stripped.startswith(">>>")


def rst_blocks(path):
    """The code blocks of an rST page (Python ones, and bare ``::`` blocks as ``literal``)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, skip, i = [], None, 0
    while i < len(lines):
        line = lines[i]
        if (m := _SKIP.match(line)):
            skip = m.group("reason") or "marked on the page"
            i += 1
            continue
        if (m := _DIRECTIVE.match(line)):
            indent = len(m.group("indent"))
            j = i + 1
            while j < len(lines) and re.match(r"^\s+:[\w-]+:", lines[j]):  # options
                j += 1
            first, end = _indented_body(lines, j, indent)
            if m.group("lang").lower() in PYTHON_LANGUAGES and first < end:
                source = _dedent(lines[first:end])
                kind = "doctest" if _is_doctest(source) else "python"
                blocks.append(Block(path.name, path, i + 1, first + 1, source, kind, skip))
            skip = None
            i = max(end, i + 1)
            continue
        if (m := _LITERAL.match(line)) and not line.strip().startswith(".."):
            first, end = _indented_body(lines, i + 1, len(m.group("indent")))
            if first < end:
                source = _dedent(lines[first:end])
                kind = "doctest" if _is_doctest(source) else "literal"
                blocks.append(Block(path.name, path, i + 1, first + 1, source, kind, skip))
                skip = None
                i = end
                continue
        if line.lstrip().startswith(">>>") and (i == 0 or not lines[i - 1].strip()):
            # a doctest block: a paragraph starting with ">>>", up to the next blank line
            end = i
            while end < len(lines) and lines[end].strip():
                end += 1
            blocks.append(Block(path.name, path, i + 1, i + 1, _dedent(lines[i:end]), "doctest", skip))
            skip = None
            i = end
            continue
        if line.strip() and not line.lstrip().startswith(".."):
            skip = None  # a skip marker applies to the block right after it only
        i += 1
    return blocks


def markdown_blocks(path):
    """The ```python fences of a markdown file."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith("```"):
            end += 1
        if m.group("lang").lower() in PYTHON_LANGUAGES and end > i + 1:
            source = _dedent(lines[i + 1:end])
            kind = "doctest" if _is_doctest(source) else "python"
            blocks.append(Block(path.name, path, i + 1, i + 2, source, kind))
        i = end + 1
    return blocks


#: pages that may not exist yet
OPTIONAL_PAGES = {"glossary.rst"}


def _pages():
    pages = [ROOT / "README.md"] + [DOCS / name for name in MIN_BLOCKS if name != "README.md"]
    return [p for p in pages if p.exists() or p.name not in OPTIONAL_PAGES]


def all_blocks():
    blocks = []
    for path in _pages():
        if not path.exists():
            continue  # reported by test_every_page_is_read
        blocks += markdown_blocks(path) if path.suffix == ".md" else rst_blocks(path)
    return blocks


BLOCKS = all_blocks()
PYTHON_BLOCKS = [b for b in BLOCKS if b.kind in ("python", "doctest")]


# --------------------------------------------------------------------------- the parser


def test_every_page_is_read():
    missing = [p.name for p in _pages() if not p.exists()]
    assert not missing, f"pages listed in MIN_BLOCKS are missing: {missing}"


@pytest.mark.parametrize("page", sorted(MIN_BLOCKS))
def test_blocks_found(page):
    if page in OPTIONAL_PAGES and not (DOCS / page).exists():
        pytest.skip(f"docs/{page} does not exist")
    found = [b.id for b in PYTHON_BLOCKS if b.page == page]
    assert len(found) >= MIN_BLOCKS[page], (
        f"found {len(found)} Python block(s) on {page}, expected at least "
        f"{MIN_BLOCKS[page]}: {found}")


def test_parser_on_a_sample(tmp_path):
    page = tmp_path / "sample.rst"
    page.write_text(
        "Title\n=====\n\n"
        ".. code-block:: python\n   :caption: x\n\n   a = 1\n\n   if a:\n       b = 2\n\nText.\n\n"
        "* item\n\n  .. code-block:: python\n\n     c = 3\n\n"
        ".. code-block:: bash\n\n   ls\n\n"
        ".. snippet: skip (takes 3 minutes)\n\n.. code-block:: python\n\n   slow()\n\n"
        ">>> 1 + 1\n2\n\n"
        "A tree::\n\n    a/\n      b\n\n"
        "Shown::\n\n    >>> 2 * 3\n    6\n",
        encoding="utf-8")
    got = [(b.line, b.kind, b.source, b.skip) for b in rst_blocks(page)]
    assert got == [
        (4, "python", "a = 1\n\nif a:\n    b = 2\n", None),
        (16, "python", "c = 3\n", None),
        (26, "python", "slow()\n", "takes 3 minutes"),
        (30, "doctest", ">>> 1 + 1\n2\n", None),
        (33, "literal", "a/\n  b\n", None),
        (38, "doctest", ">>> 2 * 3\n6\n", None),
    ]
    md = tmp_path / "sample.md"
    md.write_text("# T\n\n```bash\nls\n```\n\n```python\nx = 1\n```\n", encoding="utf-8")
    assert [(b.line, b.source) for b in markdown_blocks(md)] == [(7, "x = 1\n")]


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind == "literal"],
                         ids=lambda b: b.id)
def test_no_untested_python(block):
    """A bare ``::`` literal block that parses as Python would be shown as Python and
    never run: say ``.. code-block:: python`` (run here) or ``.. code-block:: text``."""
    try:
        ast.parse(block.source)
    except SyntaxError:
        return
    pytest.fail(f"{block.id}: this '::' block is valid Python but not run; mark it "
                "'.. code-block:: python' (tested) or '.. code-block:: text'")


# --------------------------------------------------------------------------- the blocks

#: sources that already ran successfully in this session -> the id that ran them
_PASSED = {}


@pytest.fixture
def fresh_process_state(tmp_path, monkeypatch):
    """An empty working directory, Agg, one torch thread; warnings and figures reset after."""
    import torch

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        yield tmp_path
    torch.set_num_threads(threads)
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")


def _run_code(block):
    # pad with blank lines so that tracebacks show the page's own line numbers
    filename = str(block.path)
    padded = "\n" * (block.first_line - 1) + block.source
    linecache.cache[filename] = (len(padded), None, padded.splitlines(True), filename)
    code = compile(padded, filename, "exec")
    exec(code, {"__name__": "__main__", "__builtins__": __builtins__})


def _run_doctest(block):
    parser = doctest.DocTestParser()
    test = parser.get_doctest(block.source, {"__name__": "__main__"}, block.id,
                              str(block.path), block.first_line - 1)
    runner = doctest.DocTestRunner(
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report = []
    result = runner.run(test, out=report.append, clear_globs=True)
    assert result.failed == 0, "".join(report)


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=lambda b: b.id)
def test_block_runs_alone(block, fresh_process_state, record_property):
    if block.skip:
        pytest.skip(f"{block.id}: {block.skip}")
    if block.source in _PASSED:
        record_property("same_as", _PASSED[block.source])
        return
    start = time.perf_counter()
    if block.kind == "doctest":
        _run_doctest(block)
    else:
        _run_code(block)
    record_property("seconds", round(time.perf_counter() - start, 2))
    _PASSED[block.source] = block.id
