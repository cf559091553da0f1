"""The formats page (docs/formats.rst) states the versions and limits the readers use."""

import importlib
import json
import re
from pathlib import Path

from minip_learn import compact
from minip_learn.model_selection import _records

certify_module = importlib.import_module("minip_learn.theory.certificate")
PAGE = (Path(__file__).resolve().parents[1] / "docs" / "formats.rst").read_text()


def test_family_limits_and_marker_on_the_page_are_the_loader_s():
    assert f'``"{compact.NPZ_FORMAT}"``' in PAGE
    assert f"equal to {compact.NPZ_VERSION}" in PAGE
    assert compact.MAX_FAMILY_BYTES == 2**33 and "``2**33`` bytes, 8 GiB" in PAGE
    assert compact.MAX_SEQ_LEN == 2**20 and "(``2**20``)" in PAGE


def test_certificate_format_and_versions_on_the_page_are_the_reader_s():
    assert f'Format ``"{certify_module.JSON_FORMAT}"``' in PAGE
    versions = ", ".join(map(str, certify_module.JSON_VERSIONS))
    assert f"version {versions} (the versions" in PAGE
    assert f"nesting deeper than {certify_module.MAX_JSON_DEPTH} levels" in PAGE


def test_results_folder_depth_on_the_page_is_the_reader_s():
    assert f"nesting deeper\nthan {_records.MAX_JSON_DEPTH} levels" in PAGE


def test_every_certificate_field_is_on_the_page():

    from minip_learn.datasets import make_witness_suite
    fields = json.loads(make_witness_suite(construction="small").certificate.to_json())
    listed = set(re.findall(r"^   \* - ``(\w+)``(?:, ``(\w+)``)?", PAGE, flags=re.M))
    on_page = {name for pair in listed for name in pair if name}
    assert set(fields) <= on_page, set(fields) - on_page
