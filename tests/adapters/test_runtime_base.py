"""The one-off "interpreter and libraries" probe (adapters/common/runtime_base.py), run for real on this interpreter."""
from __future__ import annotations

import json
import sys

from adapters.common import runtime_base


def test_probe_reads_each_process_after_its_imports(tmp_path, monkeypatch):
    """Two processes as vLLM has them: the second forked from the first, importing more on top."""
    plain, heavy = runtime_base.probe(sys.executable, [[]]), runtime_base.probe(sys.executable, [["torch"]])
    assert 5 << 20 < plain[0] < heavy[0] - (50 << 20)  # torch's libraries are resident, and counted
    first, second = runtime_base.probe(sys.executable, [["json"], ["torch"]])
    assert second > first + (50 << 20)  # the forked child holds its own imports


def test_cached_probes_once_per_engine_version_and_interpreter(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERLAB_CACHE", str(tmp_path))
    monkeypatch.setenv("INFERLAB_RUNTIME_PROBE", "1")
    got, how = runtime_base.cached("e", "1.0", sys.executable, [["json"]])
    assert got > 0 and "json" in how and "e 1.0" in how
    path = tmp_path / "runtime_base.json"
    (key, value), = json.loads(path.read_text()).items()
    path.write_text(json.dumps({key: [123 << 20]}))  # read back, not probed again: the cached figure comes back
    assert runtime_base.cached("e", "1.0", sys.executable, [["json"]])[0] == 123 << 20
    again = runtime_base.cached("e", "2.0", sys.executable, [["json"]])[0]  # another version: probed anew
    assert abs(again - value[0]) < 1 << 20
    assert len(json.loads(path.read_text())) == 2
    assert runtime_base.cached("e", "1.0", sys.executable, [["no_such_module_x"]]) is None  # a failed probe: a dash
    monkeypatch.setenv("INFERLAB_RUNTIME_PROBE", "0")
    assert runtime_base.cached("e", "1.0", sys.executable, [["json"]]) is None  # turned off: a dash, cached or not
