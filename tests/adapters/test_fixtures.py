"""Every recorded fixture says where it came from: each file in fixtures/<engine>/ is named in
that folder's SOURCE.md, and every facts.json entry carries its upstream source (file @
commit or tag)."""
from __future__ import annotations

import json

import pytest

from tests.adapters.replay import FIXTURES


@pytest.mark.parametrize("folder", sorted(p.name for p in FIXTURES.iterdir() if p.is_dir()))
def test_each_fixture_file_is_named_in_its_source_md(folder):
    source = (FIXTURES / folder / "SOURCE.md").read_text()
    for f in (FIXTURES / folder).iterdir():
        if f.name != "SOURCE.md":
            assert f"`{f.name}`" in source, f"{folder}/{f.name} is not described in {folder}/SOURCE.md"


@pytest.mark.parametrize("folder", sorted(p.parent.name for p in FIXTURES.glob("*/facts.json")))
def test_each_recorded_fact_names_its_upstream_source(folder):
    for key, entry in json.loads((FIXTURES / folder / "facts.json").read_text()).items():
        src = entry.get("source", "")
        assert "@" in src and ("/" in src or "." in src), (folder, key, src)
