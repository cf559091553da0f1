"""The plain R4 constraint builder shares no code with the fast one it checks.

``constraints_reference`` is what the tests of ``constraints`` compare it with
(``test_certificates.py``, ``test_final_query_certify.py``, ``test_positional_certify.py``);
if it went through the fast builder's filters (the S1 check, the gap filter, the
denominators) a wrong filter would pass its own check. The module is read with
:mod:`ast`: every helper the fast builder reaches, directly or through other helpers, is
collected, and the reference (with any private helper of its own) must use none of them
but the output type :class:`~minip_learn.theory._constraints.Constraints`. A family built
by hand from the definition of R4 pins the reference's answers.
"""

import ast
from pathlib import Path

import numpy as np
import pytest

from minip_learn.theory import _constraints

SOURCE = Path(_constraints.__file__)

#: what both builders may name: the class of their result
SHARED_TYPE = "Constraints"


def _definitions():
    """Module-level functions and classes of the module, and the names it imports from
    the library (relative imports), each as an AST node (None for imports)."""
    tree = ast.parse(SOURCE.read_text())
    defs = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defs[node.name] = node
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            for alias in node.names:
                defs[alias.asname or alias.name] = None
    return defs


def _names(node):
    """Every bare name a node reads (module-level helpers are reached by bare name;
    ``X.token_ids`` is an attribute of the family, not the helper ``token_ids``)."""
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _reached(start, defs, *, into_shared_type):
    """The library helpers ``start`` uses, directly or through one another."""
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        node = defs[name]
        if node is None or (name == SHARED_TYPE and not into_shared_type):
            continue
        for used in _names(node) & set(defs):
            if used not in seen and used != start:
                seen.add(used)
                todo.append(used)
    return seen


def test_the_reference_builder_uses_no_helper_of_the_fast_builder():
    defs = _definitions()
    fast = _reached("constraints", defs, into_shared_type=True) - {SHARED_TYPE}
    # the walk finds the fast builder's filters and denominators (not a vacuous check)
    assert {"_finish", "_slot_constraints", "_Overlaps", "_Membership", "isin", "token_ids",
            "is_compact", "step_denominators", "_keep_triples", "every_order_triples",
            "_empty"} <= fast
    ref = _reached("constraints_reference", defs, into_shared_type=False)
    assert not ref & fast, sorted(ref & fast)


def _family(rows, tokens):
    return np.array([[tokens[t] for t in row] for row in rows], dtype=np.uint8)


# x = 1100, y = 0011, z = 1110: <x, y> = 0, <x, z> = 2, gap 2; w = 1000: <x, w> = 1
TOKENS = {"x": [1, 1, 0, 0], "y": [0, 0, 1, 1], "z": [1, 1, 1, 0], "w": [1, 0, 0, 0]}


@pytest.mark.parametrize("N", [3, 4, 5])
def test_the_reference_builder_by_hand(N):
    s1 = ("x",) + ("y",) * (N - 1)
    s2 = ("x",) + ("z",) * (N - 1)
    s3 = ("x", "y") + ("z",) * (N - 2)
    cons = _constraints.constraints_reference(_family([s1, s2, s3], TOKENS))
    ids = {name: int(np.flatnonzero((cons.tokens == TOKENS[name]).all(1))[0])
           for name in ("x", "y", "z")}
    # one triple (x, y, z), gap 2, K = (N - 2)(2 - 1)
    assert [cons.x.tolist(), cons.y.tolist(), cons.z.tolist()] == [
        [ids["x"]], [ids["y"]], [ids["z"]]]
    assert cons.gap.tolist() == [2] and cons.K.tolist() == [N - 2]
    # S3 in any order of its slots is the same multiset
    shuffled = _family([s1, s2, s3[::-1]], TOKENS)
    assert len(_constraints.constraints_reference(shuffled)) == 1
    # ... but with the query last only when x is the final token
    assert len(_constraints.constraints_reference(shuffled, "last")) == 0
    last = _family([row[1:] + row[:1] for row in (s1, s2, s3)], TOKENS)
    assert len(_constraints.constraints_reference(last, "last")) == 1
    # without either S1, or without S3, nothing
    for rows in ([s2, s3], [s1, s3], [s1, s2]):
        assert len(_constraints.constraints_reference(_family(rows, TOKENS))) == 0
    # gap 1 (w instead of z): nothing
    gap1 = [tuple("w" if t == "z" else t for t in row) for row in (s1, s2, s3)]
    assert len(_constraints.constraints_reference(_family(gap1, TOKENS))) == 0
