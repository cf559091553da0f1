"""Sphinx configuration of the minip_learn documentation.

Build (offline, warnings are errors, examples executed)::

    python -m sphinx -W --keep-going -b html docs docs/_build/html

``MINIP_EXAMPLES_FAST=1`` in the environment shrinks every example's grid (what the
test suite uses); without it the gallery runs each example's small default. With
``-D plot_gallery=0`` (sphinx-gallery's switch) the examples are not executed: a quick
check of the pages.
"""

import os
import pkgutil
import re
import sys
from pathlib import Path

os.environ.setdefault("MPLBACKEND", "Agg")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import minip_learn  # noqa: E402

project = "minip_learn"
author = "minip_learn developers"
copyright = "minip_learn developers (BSD-3-Clause)"
release = version = minip_learn.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "numpydoc",
    "sphinx_gallery.gen_gallery",
    "sphinx_copybutton",
]

templates_path = ["_templates"]
exclude_patterns = ["_build", "README.md", "**.ipynb_checkpoints", "auto_examples/*.md5",
                    "auto_examples/*.py", "auto_examples/*.ipynb", "auto_examples/*.zip"]
root_doc = "index"
default_role = "literal"
pygments_style = "sphinx"

# -- autodoc / autosummary / numpydoc ------------------------------------------------
autosummary_generate = True
autosummary_imported_members = False
autodoc_default_options = {"members": False}
autodoc_typehints = "none"
numpydoc_show_class_members = False
numpydoc_show_inherited_class_members = False
numpydoc_class_members_toctree = False
numpydoc_attributes_as_param_list = True
numpydoc_xref_param_type = False

# -- sphinx-gallery -------------------------------------------------------------------
sphinx_gallery_conf = {
    "examples_dirs": "../examples",
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"/plot_",
    "ignore_pattern": r"__init__\.py",
    "backreferences_dir": "gen_modules/backreferences",
    "doc_module": ("minip_learn",),
    "reference_url": {"minip_learn": None},
    "abort_on_example_error": True,
    "image_scrapers": ("matplotlib",),
    "within_subsection_order": "FileNameSortKey",
    "download_all_examples": False,
    "remove_config_comments": True,
    "min_reported_time": 0,
    "write_computation_times": False,  # that page loads CSS/JS from CDNs
}

# -- sphinx-copybutton ----------------------------------------------------------------
# The copy button of a code block copies what to paste: the prompts of doctest and
# shell lines (">>> ", "... ", "$ ") are removed and, in a block that has prompts, only
# the prompted lines are copied (the output lines are left out). A block without
# prompts is copied whole.
copybutton_prompt_text = r">>> |\.\.\. |\$ "
copybutton_prompt_is_regexp = True
copybutton_only_copy_prompt_lines = True

# -- HTML -----------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = f"minip_learn {release}"
html_static_path = []
html_theme_options = {
    "navigation_with_keys": False,
    "show_prev_next": True,
    "icon_links": [],
    "navbar_end": ["theme-switcher", "navbar-icon-links"],
    "secondary_sidebar_items": ["page-toc"],
}
html_sidebars = {"**": ["sidebar-nav-bs"]}
html_show_sourcelink = False
html_copy_source = False


# -- a public object missing from the API reference is a build warning ----------------
# The package and every public module in it, at any depth (a new module is checked as
# soon as it exists); tests/test_public_api.py checks the same without Sphinx.
PUBLIC_MODULES = ["minip_learn"] + sorted(
    info.name
    for info in pkgutil.walk_packages(minip_learn.__path__, "minip_learn.")
    if not any(part.startswith("_") for part in info.name.split("."))
)


def _check_api_reference(app):
    import importlib

    from sphinx.util import logging

    logger = logging.getLogger("minip_learn.api")
    text = (HERE / "api.rst").read_text()
    listed = set()
    module = None
    for line in text.splitlines():
        m = re.match(r"\.\. currentmodule:: (\S+)", line.strip())
        if m:
            module = m.group(1)
            continue
        m = re.match(r"^\s{3,}([A-Za-z_][\w.]*)\s*$", line)
        if m and module and not line.strip().startswith(":"):
            listed.add(f"{module}.{m.group(1)}")
    for name in PUBLIC_MODULES:
        mod = importlib.import_module(name)
        for obj in getattr(mod, "__all__", []):
            if obj.startswith("__"):
                continue
            value = getattr(mod, obj)
            home = f"{name}.{obj}"
            if not callable(value):  # data (TOLERANCE, SETTINGS ...): named in the text
                if f"``{obj}" not in text:
                    logger.warning(f"public data {home} is not mentioned in docs/api.rst")
                continue
            owner = getattr(value, "__module__", None)
            # an object re-exported by a parent package may be listed under either name
            candidates = {home}
            if owner:
                candidates.add(f"{owner}.{obj}")
                candidates.update(f"{p}.{obj}" for p in PUBLIC_MODULES if owner.startswith(p))
            if not candidates & listed:
                logger.warning(f"public object {home} is missing from docs/api.rst")


# -- the registry of feature maps, as a table (``.. feature-map-table::``) ------------
# Built from minip_learn.nn.feature_map_table() whenever a page that uses it is read, so
# the documentation lists exactly the registered maps with their declarations.
def _feature_map_table_directive():
    from docutils import nodes
    from docutils.statemachine import StringList
    from sphinx.util.docutils import SphinxDirective

    def yes_no(flag):
        return "yes" if flag else "no"

    class FeatureMapTable(SphinxDirective):
        has_content = False

        def run(self):
            from minip_learn.nn import feature_map_table, feature_maps, literature_maps

            for module in (feature_maps, literature_maps):  # edits there rebuild the page
                self.env.note_dependency(module.__file__)
            lines = [
                ".. list-table:: The registered feature maps "
                "(:func:`~minip_learn.nn.feature_map_table`)",
                "   :header-rows: 1",
                "   :widths: 14 56 12 18",
                "",
                "   * - ``feature_map=``",
                "     - paper",
                "     - features >= 0",
                "     - kernel >= 0 (R4-R5 apply)",
            ]
            for row in feature_map_table():
                lines += [
                    f"   * - ``{row['name']}``",
                    f"     - {row['paper'] or 'not declared'}",
                    f"     - {yes_no(row['nonnegative'])}",
                    f"     - {yes_no(row['kernel_nonnegative'])}",
                ]
            container = nodes.container()
            self.state.nested_parse(StringList(lines, source="feature-map-table"),
                                    self.content_offset, container)
            return container.children

    return FeatureMapTable


# -- the registry of sequence mixers, as a table (``.. mixer-table::``) ----------------
# Built from minip_learn.nn.mixer_table() and each mixer's own state_floats (at the
# exact rank, bits and length of the final-query m = 8 exact family), so the page lists
# exactly the registered mixers with their declarations.
def _mixer_table_directive():
    from docutils.statemachine import StringList
    from sphinx.util.docutils import SphinxDirective

    coverage = {"yes": "yes (proven, R4-R5)",
                "positional": "in every order of the keys (proven, positional R4)",
                "no": "no"}

    class MixerTable(SphinxDirective):
        has_content = False

        def run(self):
            from docutils import nodes

            from minip_learn.datasets import make_witness_suite
            from minip_learn.nn import make_mixer, mixer_table, mixers

            self.env.note_dependency(mixers.__file__)  # edits there rebuild the page
            suite = make_witness_suite(8, construction="exact", query="last")
            r, n, m = suite.exact_min_rank, suite.X.shape[1], suite.X.shape[2]
            lines = [
                ".. list-table:: The registered sequence mixers "
                "(:func:`~minip_learn.nn.mixer_table`)",
                "   :header-rows: 1",
                "   :widths: 11 14 16 17 42",
                "",
                "   * - ``mixer=``",
                "     - state (floats)",
                f"     - floats at r = {r}, d = {m}, N = {n} (m = {m} exact family)",
                "     - theorem",
                "     - paper",
            ]
            for row in mixer_table():
                kwargs = {"max_len": n} if row["name"] == "positional" else {}
                floats = make_mixer(row["name"], m, r, **kwargs).state_floats(n)
                lines += [
                    f"   * - ``{row['name']}``",
                    f"     - ``{row['state']}``",
                    f"     - {floats:,}",
                    f"     - {coverage.get(row['theorem'], row['theorem'])}",
                    f"     - {row['paper'] or 'not declared'}",
                ]
            container = nodes.container()
            self.state.nested_parse(StringList(lines, source="mixer-table"),
                                    self.content_offset, container)
            return container.children

    return MixerTable


# -- csv-table: a cell starting with "-" (the recipes' "none") reads as text ----------
# docutils parses each cell as reStructuredText, where "-" (or "- (16)") starts a bullet
# list; the leading dash is escaped so that it is shown as written.
def _csv_table_directive():
    from docutils.parsers.rst.directives.tables import CSVTable

    class DashCSVTable(CSVTable):
        def parse_csv_data_into_rows(self, csv_data, dialect, source):
            rows, max_cols = super().parse_csv_data_into_rows(csv_data, dialect, source)
            for row in rows:
                for *_, block in row:
                    for i, line in enumerate(block):
                        if re.match(r"[-+*](\s|$)", line.lstrip()):
                            block[i] = "\\" + line.lstrip()
            return rows, max_cols

    return DashCSVTable


def setup(app):
    app.add_directive("csv-table", _csv_table_directive(), override=True)
    app.connect("builder-inited", _check_api_reference)
    app.add_directive("feature-map-table", _feature_map_table_directive())
    app.add_directive("mixer-table", _mixer_table_directive())
