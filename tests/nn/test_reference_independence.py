"""The quadratic references of :mod:`minip_learn.nn.ops.naive` share no code with the
fast attention forms they check.

The references are the definitions the fast forms are held to (``tests/nn/test_ops.py``);
if they imported a helper of the fast forms, a wrong helper would pass its own check. The
module's source is parsed with :mod:`ast`: it may import torch and the standard library
only. The one piece of logic both sides must agree on, the denominator guard, is compared
value by value and gradient by gradient with
:func:`~minip_learn.nn.ops.spec.guard_denominator`, so that the two definitions cannot
drift apart silently.
"""

import ast
from pathlib import Path

import pytest
import torch

from minip_learn.nn.ops import naive
from minip_learn.nn.ops.spec import guard_denominator

NAIVE = Path(naive.__file__)

#: helpers of the fast forms that a reference would be tempted to reuse, by name
FAST_HELPERS = {"guard_denominator", "AttentionSpec", "guard", "log_decay"}


def _imports(tree):
    """``(module, level, names)`` of every import statement anywhere in ``tree``."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, 0, (alias.name,)) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((node.module or "", node.level, tuple(a.name for a in node.names)))
    return out


def test_the_reference_module_imports_nothing_from_the_library():
    tree = ast.parse(NAIVE.read_text())
    imports = _imports(tree)
    assert imports, "the module should at least import torch"
    for module, level, names in imports:
        assert level == 0, f"relative import from {'.' * level}{module} {names}"
        assert module.split(".")[0] in {"torch", "math", "itertools"}, (module, names)
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    used |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert not used & FAST_HELPERS, sorted(used & FAST_HELPERS)


def _edge_values(dtype, eps):
    """Denominators at and around the places where the guard changes form."""
    tiny = torch.finfo(dtype).tiny
    return torch.tensor([0.0, -0.0, tiny, -tiny, 1e-12, -1e-12, eps / 2, -eps / 2, eps, -eps,
                         eps * (1 + 1e-6), -eps * (1 + 1e-6), 0.3, -0.3, 2.0, -2.0, 1e30,
                         -1e30, float("inf"), -float("inf"), float("nan")], dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("nonnegative", [True, False])
@pytest.mark.parametrize("eps", [1e-3, 0.25])
def test_the_reference_guard_is_the_library_guard(dtype, nonnegative, eps):
    eps = float(torch.tensor(eps, dtype=dtype))         # exactly representable in dtype
    den = _edge_values(dtype, eps)
    a = den.clone().requires_grad_(True)
    b = den.clone().requires_grad_(True)
    ref = naive._guard(a, nonnegative=nonnegative, eps=eps)
    lib = guard_denominator(b, nonnegative=nonnegative, eps=eps)
    assert ref.dtype == lib.dtype == dtype
    torch.testing.assert_close(ref, lib, rtol=0, atol=0, equal_nan=True)
    # the signs are the library's too (sign(0) = +1 for signed kernels)
    number = ~lib.isnan()
    assert torch.equal(torch.signbit(ref[number]), torch.signbit(lib[number]))
    (ga,) = torch.autograd.grad(ref[number].sum(), a)
    (gb,) = torch.autograd.grad(lib[number].sum(), b)
    torch.testing.assert_close(ga, gb, rtol=0, atol=0)


def test_the_reference_guard_by_hand():
    den = torch.tensor([0.0, 1e-9, -1e-9, -0.5, 0.5, -3.0], dtype=torch.float64)
    # nonnegative: a positive denominator is kept, every other one becomes 1
    assert naive._guard(den, nonnegative=True).tolist() == [1.0, 1e-9, 1.0, 1.0, 0.5, 1.0]
    # signed: the sign of den (+ at 0) times max(|den|, eps)
    assert naive._guard(den, nonnegative=False, eps=0.1).tolist() == [
        0.1, 0.1, -0.1, -0.5, 0.5, -3.0]
