"""The one-off "interpreter and libraries" probe (adapters/runtime_base.py), run for real on this interpreter."""
from __future__ import annotations

import json
import sys

from adapters import runtime_base


def test_probe_reads_each_process_after_its_imports(tmp_path, monkeypatch):
    """Two processes as vLLM has them: the second forked from the first, importing more on top."""
    plain, heavy = runtime_base.probe(sys.executable, [[]]), runtime_base.probe(sys.executable, [["torch"]])
    assert 5 << 20 < plain[0] < heavy[0] - (50 << 20)  # torch's libraries are resident, and counted
    first, second = runtime_base.probe(sys.executable, [["json"], ["torch"]])
    assert second > first + (50 << 20)  # the forked child holds its own imports


def test_cached_probes_once_per_engine_version_and_interpreter(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERLAB_CACHE", str(tmp_path))
    monkeypatch.setenv("INFERLAB_RUNTIME_PROBE", "0")
    assert runtime_base.cached("e", "1.0", sys.executable, [["json"]]) is None  # probing off, nothing cached: a dash
    monkeypatch.setenv("INFERLAB_RUNTIME_PROBE", "1")
    got, how = runtime_base.cached("e", "1.0", sys.executable, [["json"]])
    assert got > 0 and "json" in how and "e 1.0" in how
    monkeypatch.setenv("INFERLAB_RUNTIME_PROBE", "0")  # read back, not probed again
    assert runtime_base.cached("e", "1.0", sys.executable, [["json"]])[0] == got
    assert len(json.loads((tmp_path / "runtime_base.json").read_text())) == 1
    assert runtime_base.cached("e", "2.0", sys.executable, [["json"]]) is None  # another version: probed anew
    monkeypatch.setenv("INFERLAB_RUNTIME_PROBE", "1")
    assert runtime_base.cached("e", "1.0", sys.executable, [["no_such_module_x"]]) is None  # a failed probe: a dash
