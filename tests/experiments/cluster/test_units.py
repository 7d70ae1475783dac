"""The cluster code's pieces without a cluster: what a task asks for, the dry run's placement, the preflight's
comparison, what the driver keeps of a pair lost mid-level, and that a run without --cluster never imports Ray."""
from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from experiments.cluster import driver, placement, preflight
from experiments.running.results import EngineDir
from experiments.workload.config import load
from tests.experiments.exp_util import write_config


def test_a_gpu_engine_asks_for_tensor_x_pipeline_gpus_and_the_pinned_kind(tmp_path, exp_model):
    cfg = load(write_config(tmp_path / "c.toml", exp_model, """
        engines = ["sglang", "reference"]
        [parallel]
        tensor = 2
        pipeline = 2
        [cluster]
        accelerator = "H100"
        resources = { rack_a = 1 }
    """))
    assert placement.ask(cfg, "sglang") == {"num_cpus": 0, "num_gpus": 4,
                                          "resources": {"rack_a": 1, "accelerator_type:H100": 0.001}}
    # a CPU engine asks for CPUs, unless the config says this cell's engines run on GPUs
    assert placement.ask(cfg, "reference")["num_gpus"] == 0 and placement.ask(cfg, "reference")["num_cpus"] == 1
    gpu = cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update={"gpus": True})})
    assert placement.ask(gpu, "reference")["num_gpus"] == 4


def test_the_placement_names_the_nodes_that_fit_and_fails_in_one_line():
    nodes = [{"NodeID": "a" * 40, "Alive": True, "NodeManagerHostname": "h1", "Resources": {"CPU": 8.0, "GPU": 8.0,
              "accelerator_type:H100": 1.0, "node:10.0.0.1": 1.0}},
             {"NodeID": "b" * 40, "Alive": True, "NodeManagerHostname": "h2", "Resources": {"CPU": 16.0}},
             {"NodeID": "c" * 40, "Alive": False, "Resources": {"CPU": 64.0, "GPU": 8.0}}]
    gpu4 = {"num_cpus": 0, "num_gpus": 4, "resources": {"accelerator_type:H100": 0.001}}
    lines, err = placement.plan([("c1", "e", gpu4), ("c2", "e", {"num_cpus": 2, "num_gpus": 0, "resources": {}})],
                                nodes)
    assert err is None and "2 alive node(s)" in lines[0] and "node:" not in lines[0]
    assert lines[1].endswith(f"-> {'a' * 12} (h1)") and lines[2].endswith(f"-> {'a' * 12} (h1), {'b' * 12} (h2)")
    lines, err = placement.plan([("c3", "e", {**gpu4, "num_gpus": 16})], nodes)
    assert err == "cell c3, engine e: no node has what it asks (GPU 16, accelerator_type:H100 0.001); 2 node(s) alive"


def test_the_preflight_names_the_first_difference():
    mine = {"commit": "abc", "python": "3.11.7", "ray": "2.60.0", "packages": {"inferlab": "0.1.0", "vllm": None},
            "models": {"m": "present"}, "ports_busy": []}
    assert preflight.difference(dict(mine), mine) is None
    assert preflight.difference({**mine, "commit": "abd-dirty"}, mine) == "commit abd-dirty, the driver has abc"
    assert preflight.difference({**mine, "ray": "2.59.0"}, mine) == "ray 2.59.0, the driver has 2.60.0"
    assert preflight.difference({**mine, "packages": {"inferlab": "0.1.0", "vllm": "0.32.0"}}, mine) == \
        "vllm 0.32.0, the driver has none"
    assert "model directory m missing" in preflight.difference({**mine, "models": {"m": "missing"}}, mine)
    assert preflight.difference({**mine, "models": {"m": "made there"}}, mine) is None
    assert preflight.difference({**mine, "ports_busy": [8000]}, mine) == "port 8000 (pinned in engine_options) is in use"
    mine["engines"] = {"vllm": "0.32.0"}  # its own venv's version, as list-engines finds it
    assert preflight.difference({**mine, "engines": {"vllm": None}}, mine) == \
        "engine vllm not installed, the driver has 0.32.0"


def _rec(level: str, rid: str, session: int = 1) -> dict:
    return {"level": level, "request_id": rid, "repeat": 1, "session": session}


def test_a_lost_pair_keeps_its_finished_levels_and_one_failing_everywhere_says_why(tmp_path, exp_model):
    cfg = load(write_config(tmp_path / "c.toml", exp_model, 'engine = "reference"\n'))
    pair = driver.Pair(cfg, "reference", tmp_path / "run", None, {})
    pair.ed = EngineDir(pair.run_dir, "reference")
    pair.attempt = 1
    stream = [("t/reference", 1, "start", {"node_id": "n1", "hostname": "h1"})]
    stream += [("t/reference", 1, "record", _rec("rate=inf", f"r{i}")) for i in range(3)]
    stream += [("t/reference", 1, "level", {"repeat": 1, "level": "rate=inf", "manifest": {"levels": {"rate=inf": {}}}})]
    stream += [("t/reference", 1, "record", _rec("rate=2", "r0")), ("t/reference", 1, "record", _rec("rate=2", "r0"))]
    fake = SimpleNamespace(take=SimpleNamespace(remote=lambda: stream))
    ray = pytest.importorskip("ray")
    real_get, ray.get = ray.get, lambda x: x
    try:
        driver.take(fake, {"t/reference": pair})
    finally:
        ray.get = real_get
    assert pair.duplicates == 1 and len(pair.written) == 4
    kept = driver.lost(pair, "NodeDiedError: node n1 died")
    assert [r["level"] for r in kept] == ["rate=inf"] * 3
    assert [json.loads(x)["level"] for x in pair.ed.requests.read_text().splitlines()] == ["rate=inf"] * 3
    assert pair.history[-1]["levels_dropped"] == ["rate=2 (repeat 1)"]
    driver.finish(pair, None, "failed on every node tried (1 attempts); the last: NodeDiedError: node n1 died")
    m = json.loads((pair.ed.path / "manifest.json").read_text())
    assert m["status"] == "failed" and m["reason"].startswith("failed on every node tried")
    assert m["levels"] == {"rate=inf": {}} and m["cluster"]["attempts"][0]["outcome"].startswith("lost: NodeDied")


def test_a_run_without_cluster_never_imports_ray(tmp_path, exp_model):
    path = write_config(tmp_path / "c.toml", exp_model, 'engine = "reference"\n')
    code = ("import sys; from experiments.commands.run import run_main; from experiments.workload.config import load; "
            f"cfg = load({str(path)!r}); assert cfg.cluster.address is None; "
            "import experiments.cli, experiments.running.runner, experiments.report.build; "
            "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_node_that_joined_after_the_preflight_is_checked_by_the_task(monkeypatch):
    mine = {"commit": "abc", "python": "3.11.7", "ray": "2.60.0", "packages": {}, "models": {}, "ports_busy": [],
            "want": {}}
    monkeypatch.setattr(preflight, "facts", lambda want, cwd: {**mine, "ray": "2.59.0", "node_id": "n" * 40,
                                                               "hostname": "late"})
    with pytest.raises(RuntimeError, match=r"^preflight: node nnnnnnnnnnnn \(late\): ray 2.59.0, the driver has 2.60.0$"):
        preflight.again(mine, ".")

