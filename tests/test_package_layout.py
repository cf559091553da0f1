"""The package's shape rules (docs/architecture.rst, "How the rules are enforced").

import-linter checks the layers and the private modules; these tests check what it
cannot: names, sizes and who speaks of a head's parameters.
"""

import ast
import re
from pathlib import Path

import pytest

import minip_learn

PACKAGE = Path(minip_learn.__file__).parent
MODULES = sorted(PACKAGE.rglob("*.py"))
#: Most lines of code of a function or method, docstring and comments aside.
MAX_FUNCTION_LINES = 80
#: Most lines of a recipe module.
MAX_RECIPE_LINES = 450


def _relative(path):
    return path.relative_to(PACKAGE.parent).as_posix()


def _code_lines(node, lines):
    """Lines of code of a function: neither blank, nor comment, nor docstring."""
    doc = set()
    body = node.body
    if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)):
        doc = set(range(body[0].lineno, body[0].end_lineno + 1))
    count = 0
    for number in range(node.lineno, node.end_lineno + 1):
        text = lines[number - 1].strip()
        if number not in doc and text and not text.startswith("#"):
            count += 1
    return count


def test_code_line_counter():
    source = 'def f(x):\n    """Doc.\n\n    More.\n    """\n    # comment\n\n    return x\n'
    node = ast.parse(source).body[0]
    assert _code_lines(node, source.splitlines()) == 2


@pytest.mark.parametrize("path", MODULES, ids=_relative)
def test_functions_are_short(path):
    source = path.read_text()
    lines = source.splitlines()
    long = [f"{node.name} (line {node.lineno}): {_code_lines(node, lines)} lines"
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and _code_lines(node, lines) > MAX_FUNCTION_LINES]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines of code: {long}"


@pytest.mark.parametrize("path", MODULES, ids=_relative)
def test_no_private_name_imported_from_another_module(path):
    private = [f"line {node.lineno}: {alias.name}"
               for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.ImportFrom)
               for alias in node.names
               if alias.name.startswith("_") and not alias.name.startswith("__")
               # a private module of the same package (``from . import _constraints``)
               and not (node.module is None and (path.parent / f"{alias.name}.py").exists())]
    assert not private, f"underscore names imported from another module: {private}"


@pytest.mark.parametrize(
    "path", sorted((PACKAGE / "experiments").glob("*.py")), ids=_relative)
def test_recipe_modules_are_short(path):
    n_lines = len(path.read_text().splitlines())
    assert n_lines < MAX_RECIPE_LINES, f"{n_lines} lines"


def _head_parameter_patterns():
    """Regular expressions for the parameters of every head the library builds.

    For a parameter ``query_features.encoder.weight``: every dotted run of two or more of
    its parts (``query_features.encoder``, ``encoder.weight``, ...) and its own name, read
    as an attribute (``.log_table``), when it is not a generic ``weight``/``bias``.
    """
    torch = pytest.importorskip("torch")
    from minip_learn.nn import (
        KernelAttentionHead,
        KernelAttentionModel,
        SoftmaxAttentionHead,
        available_feature_maps,
    )

    heads = [SoftmaxAttentionHead(4), KernelAttentionModel(4, 2, n_heads=2)]
    for name in available_feature_maps():
        kwargs = {"vocabulary": torch.eye(4)} if name == "table" else {}
        for rank in (2, 3, 8, 16):  # some maps take only ranks of a given form
            try:
                heads.append(KernelAttentionHead(4, rank, feature_map=name,
                                                 feature_kwargs=kwargs))
                break
            except ValueError:
                continue
        else:
            raise AssertionError(f"no head with feature_map={name!r}")
    names = {n for head in heads for n, _ in head.named_parameters()}
    patterns = set()
    for name in names:
        parts = name.split(".")
        # list indices (``layers.0.0``) are not names a reader would write
        parts = [p for p in parts if not p.isdigit()]
        for start in range(len(parts)):
            for stop in range(start + 2, len(parts) + 1):
                patterns.add(r"\b" + re.escape(".".join(parts[start:stop])) + r"\b")
        if parts[-1] not in ("weight", "bias"):  # read as an attribute
            patterns.add(r"\." + re.escape(parts[-1]) + r"\b")
    return sorted(patterns)


def test_no_layer_outside_nn_names_a_head_parameter():
    patterns = [re.compile(p) for p in _head_parameter_patterns()]
    assert any(p.pattern == r"\breadout\.query_weight\b" for p in patterns)
    found = []
    for path in MODULES:
        if (PACKAGE / "nn") in path.parents:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            hits = [p.pattern for p in patterns if p.search(code)]
            if hits:
                found.append(f"{_relative(path)}:{number}: {line.strip()} {hits}")
    assert not found, "\n".join(found)
