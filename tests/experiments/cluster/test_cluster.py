"""Runs on a real multi-node Ray cluster on this machine (`ray.cluster_utils.Cluster`: a head and a worker node,
each a real raylet; custom resources `kind_a` / `kind_b` stand in for two GPU kinds; no dashboard), started once
for this module and shared by its tests. The test process is the Ray driver."""
from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from importlib import metadata
from pathlib import Path

import psutil
import pytest

from experiments.commands.run import run_main
from tests.experiments.exp_util import write_config

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow

# a node's death is seen in ~1.5 s instead of Ray's default ~30 s
FAST_DEATH = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500, "health_check_failure_threshold": 3}


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"kind_a": 1},
                                                      "include_dashboard": False, "_system_config": FAST_DEATH})
    c.worker = c.add_node(num_cpus=1, resources={"kind_b": 1})
    ray.init(address=c.address, log_to_driver=False)
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


MATRIX = """
engine = "reference"
same_interpreter = ["reference"]   # the engine in the runner's process (a Ray worker's, on the cluster): quicker
[workload]
num_requests = 3
input_len = 8
output_len = 6
[load]
concurrency = [2]
warmup = 0
[[cells]]
name = "c1"
[[cells]]
name = "c2"
workload = { seed = 1 }
[[cells]]
name = "c3"
load = { concurrency = [1, 3] }
[[cells]]
name = "c4"
dtype = "bfloat16"
"""


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _headings(path: Path | str) -> list[str]:
    text = path.read_text() if isinstance(path, Path) else path
    return [line for line in text.splitlines() if line.startswith("#")]


def test_a_matrix_on_the_cluster_gives_the_local_run_s_report_and_prompts(cluster, tiny_llama, tmp_path, capsys):
    cfg = write_config(tmp_path / "m.toml", tiny_llama, MATRIX, name="m")
    assert run_main([str(cfg), "--out", str(tmp_path / "local"), "--no-progress"]) == 0
    assert run_main([str(cfg), "--out", str(tmp_path / "ray"), "--no-progress", "--cluster", cluster.address]) == 0
    nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    for cell in ("c1", "c2", "c3", "c4"):
        here, there = tmp_path / "local/m" / cell, tmp_path / "ray/m" / cell
        # the same page, plus where each engine ran
        extra = [h for h in _headings(there / "report.md") if h not in _headings(here / "report.md")]
        assert extra == ["## Where it ran (Ray cluster)"], extra
        assert [h for h in _headings(there / "report.md") if h not in extra] == _headings(here / "report.md")
        key = lambda r: (r["level"], r["request_id"])  # noqa: E731
        a, b = sorted(_records(here / "reference/requests.jsonl"), key=key), \
            sorted(_records(there / "reference/requests.jsonl"), key=key)
        assert [(key(r), r["prompt_token_ids"]) for r in a] == [(key(r), r["prompt_token_ids"]) for r in b]
        m = json.loads((there / "reference/manifest.json").read_text())
        assert m["status"] == "ok" and m["cluster"]["node"]["node_id"] in nodes and m["cluster"]["node"]["device"]
        assert len(m["cluster"]["attempts"]) == 1 and m["cluster"]["records"] == len(b)
    local, remote = (tmp_path / "local/m/report.md").read_text(), (tmp_path / "ray/m/report.md").read_text()
    assert _headings(local) == _headings(remote)
    rows = lambda t: [line.split("|")[1:5] for line in t.splitlines() if line.startswith("| c")]  # noqa: E731
    assert rows(local) == rows(remote) and len(rows(local)) > 0
    assert "ran reference on `" in remote and "ran reference on" not in local


def test_the_dry_run_shows_placement_and_fails_in_one_line_without_a_node(cluster, tiny_llama, tmp_path, capsys):
    body = MATRIX + '[cells.cluster]\nresources = { kind_b = 1 }\n'  # c4 pinned to the worker's kind
    cfg = write_config(tmp_path / "m.toml", tiny_llama, body, name="m")
    assert run_main([str(cfg), "--dry-run", "--cluster", cluster.address]) == 0
    out = capsys.readouterr().out
    worker = cluster.worker.node_id[:12]
    assert re.search(rf"c4 / reference: asks CPU 1, kind_b 1 -> {worker} \(", out) and "c4" in out.splitlines()[-1]
    cfg = write_config(tmp_path / "z.toml", tiny_llama, MATRIX + '[cells.cluster]\nresources = { kind_z = 1 }\n',
                       name="z")
    assert run_main([str(cfg), "--dry-run", "--cluster", cluster.address]) == 2
    *before, err = capsys.readouterr().err.strip().splitlines()
    assert before == ["inferlab: preflight passed on 2 node(s)"]
    assert "cell c4, engine reference: no node has what it asks (CPU 1, kind_z 1); 2 node(s) alive" in err


def test_a_planted_version_mismatch_fails_the_preflight_in_one_line(cluster, tiny_llama, tmp_path, capsys):
    # a node whose Python finds another tokenizers distribution first (its metadata only: what a version reads)
    plant = tmp_path / "plant" / "tokenizers-0.0.0.dist-info"
    plant.mkdir(parents=True)
    (plant / "METADATA").write_text("Metadata-Version: 2.1\nName: tokenizers\nVersion: 0.0.0\n")
    node = cluster.add_node(num_cpus=0, env_vars={"PYTHONPATH": str(tmp_path / "plant")})
    try:
        cfg = write_config(tmp_path / "m.toml", tiny_llama, MATRIX, name="m")
        assert run_main([str(cfg), "--out", str(tmp_path / "res"), "--cluster", cluster.address]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0, err
        mine = metadata.version("tokenizers")
        assert f"preflight: node {node.node_id[:12]} (" in err and f"tokenizers 0.0.0, the driver has {mine}" in err
        assert not (tmp_path / "res").exists()  # nothing ran
    finally:
        cluster.remove_node(node)


KILL = """
engine = "reference"
[engine_options.reference]
mode = "server"
[workload]
num_requests = 6
input_len = 8
output_len = 8
[load]
mode = "open"
rate = ["inf", 2]
burstiness = 50
warmup = 0
[cluster]
resources = { kind_b = 1 }
"""


def _engines(model: Path) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if str(model) in " ".join(p.info["cmdline"] or []):
                out.append(p)
        except psutil.Error:
            continue
    return out


def test_a_node_killed_mid_level_loses_nothing_and_leaves_no_engine(cluster, tiny_llama, tmp_path):
    model = tmp_path / "model"  # a copy: its path tells this run's engine processes apart
    shutil.copytree(tiny_llama, model)
    cfg = write_config(tmp_path / "k.toml", model, KILL, name="k")
    records = tmp_path / "res/k/reference/requests.jsonl"
    codes: list[int] = []
    run = threading.Thread(target=lambda: codes.append(run_main(
        [str(cfg), "--out", str(tmp_path / "res"), "--no-progress", "--cluster", cluster.address])), daemon=True)
    run.start()
    killed: list[str] = []
    while run.is_alive() and not killed:  # once the slow level has its first record, the worker node dies
        lines = records.read_text().splitlines() if records.is_file() else []
        if any('"level":"rate=2"' in line for line in lines):
            assert _engines(model), "the engine runs while the level does"
            killed.append(cluster.worker.node_id)
            cluster.remove_node(cluster.worker, allow_graceful=False)
            cluster.worker = cluster.add_node(num_cpus=1, resources={"kind_b": 1})  # the node that replaces it
        time.sleep(0.05)
    run.join(timeout=600)
    assert killed and codes == [0]
    recs = _records(records)
    ids = [(r["level"], r["request_id"]) for r in recs]
    assert len(ids) == len(set(ids)) == 12  # every request of both levels, exactly once
    m = json.loads((tmp_path / "res/k/reference/manifest.json").read_text())
    first, second = m["cluster"]["attempts"]
    assert first["node_id"] == killed[0] and first["outcome"].startswith("lost: ")
    assert first["levels_kept"] == ["rate=inf (repeat 1)"] and first["levels_dropped"] == ["rate=2 (repeat 1)"]
    assert second["node_id"] == m["cluster"]["node"]["node_id"] != killed[0] and second["outcome"] == "ok"
    # the interrupted level is one node's: every record of it from the rerun (session 2), none from the first
    assert {r["session"] for r in recs if r["level"] == "rate=2"} == {2}
    assert {r["session"] for r in recs if r["level"] == "rate=inf"} == {1}
    page = (tmp_path / "res/k/report.md").read_text()
    assert "## Where it ran (Ray cluster)" in page and "reran whole rate=2 (repeat 1)" in page
    for _ in range(300):  # the reaper's sweep is asynchronous to the driver
        if not _engines(model):
            break
        time.sleep(0.1)
    assert _engines(model) == []


CLIENTS = """
engine = "reference"
[engine_options.reference]
mode = "server"
[workload]
num_requests = 24
input_len = 8
output_len = 4
[load]
mode = "open"
rate = [5]
burstiness = 50
warmup = 0
sweep = {{ client_lateness_ms = 50 }}   # the client-bound line: one slow client ends ~1 s late, two keep ~150 ms of slack
[cluster]
client_env = {{ PYTHONPATH = "{plant}" }}
[[cells]]
name = "one"
load = {{ clients = 1 }}
[[cells]]
name = "two"
load = {{ clients = 2 }}
"""

# planted: every client process holds its own event loop for 250 ms just after it stamps each send (regular
# arrivals 200 ms apart: one client falls a further 50 ms behind with every request; two, each with arrivals 400 ms
# apart, keep up with ~150 ms to spare, so a busy machine's stalls of up to ~150 ms do not make them late: CI
# once saw a 60 ms hold with 40 ms to spare flagged), whatever the engine does
SLOW_CLIENT = """
import time
from experiments.running import load
_one = load.LoadGenerator._one
async def slow(self, item, arrival_s, due_ns=None):
    if not getattr(self, "planted", False):
        self.planted, generate = True, self.engine.generate
        def held(request):
            time.sleep(0.25)
            return generate(request)
        self.engine.generate = held
    return await _one(self, item, arrival_s, due_ns)
load.LoadGenerator._one = slow
"""


def test_two_clients_keep_one_client_s_schedule_and_a_planted_slow_client_is_client_bound(cluster, tiny_llama,
                                                                                          tmp_path):
    from experiments.running.load import arrivals

    (tmp_path / "plant").mkdir()
    (tmp_path / "plant" / "sitecustomize.py").write_text(SLOW_CLIENT)
    cfg = write_config(tmp_path / "c.toml", tiny_llama, CLIENTS.format(plant=tmp_path / "plant"), name="c")
    assert run_main([str(cfg), "--out", str(tmp_path / "res"), "--no-progress", "--cluster", cluster.address]) == 0
    runs = {}
    for k, cell in ((1, "one"), (2, "two")):  # the two cells ran side by side, one on each node
        ed = tmp_path / "res/c" / cell / "reference"
        runs[k] = ({r["request_id"]: r for r in _records(ed / "requests.jsonl")},
                   json.loads((ed / "manifest.json").read_text())["clients"]["rate=5"]["1"])
    (one, one_clients), (two, two_clients) = runs[1], runs[2]
    schedule = arrivals(24, 5, 50, 0)
    assert sorted(one) == sorted(two) and len(one) == 24
    assert [one[r]["arrival_s"] for r in sorted(one)] == [two[r]["arrival_s"] for r in sorted(two)] == schedule
    assert all(one[r]["prompt_token_ids"] == two[r]["prompt_token_ids"] for r in one)
    assert {r["client"] for r in two.values()} == {0, 1} and {r["client"] for r in one.values()} == {0}
    # merged onto one clock: the two clients' requests were due in the schedule's order
    by_due = sorted(two.values(), key=lambda r: r["due_ns"])
    assert [r["arrival_s"] for r in by_due] == schedule
    assert [c["client_bound"] for c in one_clients] == [True], one_clients
    assert [c["client_bound"] for c in two_clients] == [False, False], two_clients
    assert all(abs(c["clock_offset_ms"]) < c["rtt_ms"] + 1 for c in two_clients)  # one machine: one clock
    page = (tmp_path / "res/c/one/report.md").read_text()
    assert "### The clients that sent each level" in page and "**client-bound**" in page
    assert "**client-bound**" not in (tmp_path / "res/c/two/report.md").read_text()


def test_ctrl_c_on_the_driver_stops_every_remote_engine(cluster, tiny_llama, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_llama, model)
    cfg = write_config(tmp_path / "i.toml", model, KILL.replace("resources = { kind_b = 1 }", "attempts = 1"), name="i")
    records = tmp_path / "res/i/reference/requests.jsonl"
    driver = subprocess.Popen([sys.executable, "-m", "experiments.cli", "run", str(cfg), "--out", str(tmp_path / "res"),
                               "--no-progress", "--cluster", cluster.address],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while driver.poll() is None and not (records.is_file() and '"level":"rate=2"' in records.read_text()):
            time.sleep(0.05)
        assert driver.poll() is None and _engines(model), "the engine serves its level on a node"
        driver.send_signal(signal.SIGINT)  # Ctrl-C
        err = driver.communicate(timeout=300)[1]
    finally:
        driver.kill()
    assert driver.returncode != 0 and "KeyboardInterrupt" in err
    m = json.loads((tmp_path / "res/i/reference/manifest.json").read_text())
    assert m["status"] == "failed" and m["reason"].startswith("interrupted: Ctrl-C")
    for _ in range(300):  # the reaper beside the cancelled task kills the engine's process group
        if not _engines(model):
            break
        time.sleep(0.1)
    assert _engines(model) == []
