"""Every public function and class has a numpydoc docstring with an Examples section.

The examples themselves run as doctests (pytest collects ``minip_learn`` with
``--doctest-modules``).
"""

import importlib
import inspect
import pkgutil

import pytest

import minip_learn

#: Every public module: no component of its dotted path starts with ``_``.
PUBLIC_MODULES = ["minip_learn"] + sorted(
    info.name for info in pkgutil.walk_packages(minip_learn.__path__, "minip_learn.")
    if not any(part.startswith("_") for part in info.name.split(".")))


def _public_objects():
    for modname in PUBLIC_MODULES:
        mod = importlib.import_module(modname)
        for name in getattr(mod, "__all__", []):
            obj = getattr(mod, name)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                yield f"{modname}.{name}", obj


@pytest.mark.parametrize("qualname, obj", list(_public_objects()), ids=lambda v: v if isinstance(v, str) else "")
def test_public_object_has_examples(qualname, obj):
    doc = inspect.getdoc(obj) or ""
    assert doc.strip(), f"{qualname} has no docstring"
    assert "Examples\n--------" in doc, f"{qualname} has no numpydoc Examples section"
    assert ">>>" in doc, f"{qualname}'s Examples section has no doctest"
