"""One public path per object: what the public modules' ``__all__`` export.

A public module is one whose dotted path has no component starting with ``_``. Every
object is exported by exactly one public module's ``__all__`` (its public home), except
the estimators the top-level package re-exports for convenience; every exported name
resolves; and the library keeps its public surface small.
"""

import importlib
import pkgutil
import re
import warnings
from collections import defaultdict
from pathlib import Path

import pytest

import minip_learn

#: Most distinct objects the public modules may export.
MAX_PUBLIC_OBJECTS = 190
#: The names the top-level package re-exports from :mod:`minip_learn.estimators`.
TOP_LEVEL_CONVENIENCE = (
    "KernelAttentionClassifier",
    "KernelAttentionRegressor",
    "SequenceMixerRegressor",
    "SoftmaxAttentionRegressor",
)


def _public_modules():
    names = ["minip_learn"]
    for info in pkgutil.walk_packages(minip_learn.__path__, "minip_learn."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # deprecated modules
        return {name: importlib.import_module(name) for name in names}


MODULES = _public_modules()


def _exports():
    """``{id(object): [(module, name), ...]}`` and ``{id(object): object}`` over every
    name of every public module's ``__all__``."""
    homes, objects = defaultdict(list), {}
    for module_name, module in MODULES.items():
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            homes[id(obj)].append((module_name, name))
            objects[id(obj)] = obj
    return homes, objects


def _counts():
    homes, _ = _exports()
    return f"{len(homes)} objects under {sum(map(len, homes.values()))} names"


@pytest.mark.parametrize("module_name", sorted(MODULES))
def test_every_exported_name_resolves(module_name):
    module = MODULES[module_name]
    missing = [n for n in getattr(module, "__all__", ()) if not hasattr(module, n)]
    assert not missing, f"{module_name}.__all__ names what it lacks: {missing}"
    exported = list(getattr(module, "__all__", ()))
    assert len(exported) == len(set(exported)), f"{module_name}.__all__ repeats a name"


def test_public_surface_is_small():
    homes, _ = _exports()
    assert len(homes) <= MAX_PUBLIC_OBJECTS, (
        f"{_counts()}: at most {MAX_PUBLIC_OBJECTS} public objects")


def test_one_public_path_per_object():
    homes, _ = _exports()
    convenience = {("minip_learn", n) for n in TOP_LEVEL_CONVENIENCE}
    repeated = {}
    for key, paths in homes.items():
        rest = [p for p in paths if p not in convenience]
        if len(rest) != 1:
            repeated[key] = [f"{m}.{n}" for m, n in paths]
    assert not repeated, (
        f"{_counts()}; objects exported under several public paths: "
        f"{sorted(repeated.values())}")


def test_top_level_convenience_names_are_the_estimators():
    import minip_learn.estimators as estimators

    assert set(minip_learn.__all__) == {*TOP_LEVEL_CONVENIENCE, "__version__"}
    for name in TOP_LEVEL_CONVENIENCE:
        assert getattr(minip_learn, name) is getattr(estimators, name)
        assert name in estimators.__all__


def test_names_equal_objects():
    homes, _ = _exports()
    n_names = sum(map(len, homes.values()))
    assert n_names == len(homes) + len(TOP_LEVEL_CONVENIENCE), _counts()


# -- the API reference lists what ``__all__`` exports --------------------------------

API_PAGE = Path(__file__).parents[1] / "docs" / "api.rst"


def _api_listing():
    """``{(module, name)}`` of the autosummary entries of docs/api.rst, each under the
    ``currentmodule`` above it."""
    listed, module = set(), None
    for line in API_PAGE.read_text().splitlines():
        m = re.match(r"\.\. currentmodule:: (\S+)", line.strip())
        if m:
            module = m.group(1)
            continue
        m = re.match(r"^\s{3,}([A-Za-z_][\w.]*)\s*$", line)
        if m and module and not line.strip().startswith(":"):
            listed.add((module, m.group(1)))
    return listed


def test_api_page_lists_every_exported_callable_under_its_home():
    text = API_PAGE.read_text()
    listed = _api_listing()
    missing, unmentioned = [], []
    for module_name, module in MODULES.items():
        for name in getattr(module, "__all__", ()):
            if name.startswith("__"):
                continue
            places = {(module_name, name)}
            if name in TOP_LEVEL_CONVENIENCE:  # listed where users import them from
                places = {("minip_learn", name)}
            if callable(getattr(module, name)):
                if not places & listed:
                    missing.append(f"{module_name}.{name}")
            elif f"``{name}" not in text:  # data (TOLERANCE, SETTINGS ...)
                unmentioned.append(f"{module_name}.{name}")
    assert not missing, f"exported but not listed in docs/api.rst: {missing}"
    assert not unmentioned, f"exported data not named in docs/api.rst: {unmentioned}"


def test_api_page_lists_only_exported_names():
    exported = {(m, n) for m, mod in MODULES.items() for n in getattr(mod, "__all__", ())}
    extra = sorted(f"{m}.{n}" for m, n in _api_listing() if (m, n) not in exported)
    assert not extra, f"listed in docs/api.rst but exported by no __all__: {extra}"
