"""The documentation's csv-table directive shows the recipes' cells as written.

The recipes write ``-`` for "none" (and ``- (16)`` for "none up to 16"); plain docutils
parses a cell as reStructuredText, where such a cell is a bullet list. ``docs/conf.py``
overrides ``csv-table`` to escape the leading dash; this builds a table through it.
"""

import runpy
from pathlib import Path

import pytest
from docutils import nodes
from docutils.core import publish_doctree
from docutils.parsers.rst import directives

CONF = Path(__file__).resolve().parents[1] / "docs" / "conf.py"

TABLE = """\
.. csv-table:: t
   :header: map,kernel min,smallest

   rff,-1.21,-
   table,1.76,- (16)
   "multi
   - line",+,* 3
"""


def _cells(doctree):
    return [entry.astext() for entry in doctree.findall(nodes.entry)]


@pytest.fixture
def dash_table():
    conf = runpy.run_path(str(CONF), run_name="docs_conf")
    original, _ = directives.directive("csv-table", None, None)
    directives.register_directive("csv-table", conf["_csv_table_directive"]())
    yield
    directives.register_directive("csv-table", original)


def test_plain_docutils_reads_a_dash_cell_as_a_list():
    doctree = publish_doctree(TABLE, settings_overrides={"report_level": 5})
    assert any(True for _ in doctree.findall(nodes.bullet_list))


def test_dash_cells_are_shown_as_written(dash_table):
    doctree = publish_doctree(TABLE, settings_overrides={"report_level": 5})
    assert not any(True for _ in doctree.findall(nodes.bullet_list))
    assert not any(True for _ in doctree.findall(nodes.enumerated_list))
    assert _cells(doctree) == ["map", "kernel min", "smallest",
                               "rff", "-1.21", "-",
                               "table", "1.76", "- (16)",
                               "multi\n- line", "+", "* 3"]
