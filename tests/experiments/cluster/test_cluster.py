"""Runs on a real multi-node Ray cluster on this machine (`ray.cluster_utils.Cluster`: a head and a worker node,
each a real raylet; custom resources `kind_a` / `kind_b` stand in for two GPU kinds; no dashboard), started once
for this module and shared by its tests. The test process is the Ray driver. One cluster run (`shared_run`) is read
by two tests: the matrix test's cells and the clients test's."""
from __future__ import annotations

import json
import os
import re
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

# A node's death is seen in ~1.5 s instead of Ray's default ~30 s. Workers run at the niceness of every other
# process of the tests (Ray's default, 15, starves them and all they start, engines included, behind the other
# test workers on a busy machine). An idle worker is kept for the module (Ray's default kills any beyond one per
# CPU after 1 s idle), so a later run on the same node reuses it, as on a long-lived cluster: its imports and its
# measured ceilings (experiments/measuring/ceilings.py caches them per process).
SYSTEM_CONFIG = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500, "health_check_failure_threshold": 3,
                 "worker_niceness": 0, "num_workers_soft_limit": 6, "idle_worker_killing_time_threshold_ms": 3_600_000}


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"kind_a": 1},
                                                      "include_dashboard": False, "_system_config": SYSTEM_CONFIG})
    c.worker = c.add_node(num_cpus=1, resources={"kind_b": 1})
    ray.init(address=c.address, log_to_driver=False)
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


# Two cells: c2 overrides the workload, the load levels and the dtype. The cluster run adds the clients test's two
# cells (CLIENT_CELLS) after them, so its four pairs queue on the two single-CPU nodes.
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
load = { concurrency = [1, 3] }
dtype = "bfloat16"
"""
CELLS = ("c1", "c2")

# The clients test's cells: the reference engine as a server (one torch thread, as every process in the tests; its
# core in the server's process: nothing here measures the engine), one open-loop level sent by 1 and by 2 clients.
CLIENT_CELLS = """
[[cells]]
name = "one"
engine_options = {{ reference = {{ mode = "server", num_threads = 1, engine_process = false }} }}
workload = {{ num_requests = 12, output_len = 4 }}
load = {{ mode = "open", rate = [5], burstiness = 50, clients = 1, sweep = {{ client_lateness_ms = 50 }} }}
cluster = {{ client_env = {{ PYTHONPATH = "{plant}" }} }}
[[cells]]
name = "two"
engine_options = {{ reference = {{ mode = "server", num_threads = 1, engine_process = false }} }}
workload = {{ num_requests = 12, output_len = 4 }}
load = {{ mode = "open", rate = [5], burstiness = 50, clients = 2, sweep = {{ client_lateness_ms = 50 }} }}
cluster = {{ client_env = {{ PYTHONPATH = "{plant}" }} }}
"""


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _headings(path: Path | str) -> list[str]:
    text = path.read_text() if isinstance(path, Path) else path
    return [line for line in text.splitlines() if line.startswith("#")]


@pytest.fixture(scope="module")
def shared_run(cluster, tiny_llama, tmp_path_factory) -> dict:
    """One cluster run that two tests read: the matrix cells (compared with a local run) and the clients cells
    (`CLIENT_CELLS`, after them: the two clients cells start once the matrix cells are done, so they run side by
    side, one on each node, as a run of their own would). Its exit code, config path, folder and the nodes alive
    then."""
    root = tmp_path_factory.mktemp("shared-run")
    (root / "plant").mkdir()
    (root / "plant" / "sitecustomize.py").write_text(SLOW_CLIENT)
    cfg = write_config(root / "m.toml", tiny_llama, MATRIX + CLIENT_CELLS.format(plant=root / "plant"), name="m")
    code = run_main([str(cfg), "--out", str(root / "ray"), "--no-progress", "--cluster", cluster.address])
    return {"code": code, "config": cfg, "root": root / "ray/m",
            "nodes": {n["NodeID"] for n in ray.nodes() if n["Alive"]}}


def test_a_matrix_on_the_cluster_gives_the_local_run_s_report_and_prompts(shared_run, tiny_llama, tmp_path, capsys):
    # the local run: the matrix cells alone (a local run refuses a config with load.clients anywhere), from the
    # path the cluster run's config was at (a cell's report quotes it), now holding the matrix cells only
    cfg = write_config(shared_run["config"], tiny_llama, MATRIX, name="m")
    assert run_main([str(cfg), "--out", str(tmp_path / "local"), "--no-progress"]) == 0
    assert shared_run["code"] == 0
    for cell in CELLS:
        here, there = tmp_path / "local/m" / cell, shared_run["root"] / cell
        # the same page, plus where each engine ran
        extra = [h for h in _headings(there / "report.md") if h not in _headings(here / "report.md")]
        assert extra == ["## Where it ran (Ray cluster)"], extra
        assert [h for h in _headings(there / "report.md") if h not in extra] == _headings(here / "report.md")
        key = lambda r: (r["level"], r["request_id"])  # noqa: E731
        a, b = sorted(_records(here / "reference/requests.jsonl"), key=key), \
            sorted(_records(there / "reference/requests.jsonl"), key=key)
        assert [(key(r), r["prompt_token_ids"]) for r in a] == [(key(r), r["prompt_token_ids"]) for r in b]
        m = json.loads((there / "reference/manifest.json").read_text())
        assert m["status"] == "ok" and m["cluster"]["node"]["node_id"] in shared_run["nodes"]
        assert m["cluster"]["node"]["device"]
        assert len(m["cluster"]["attempts"]) == 1 and m["cluster"]["records"] == len(b)
    local, remote = (tmp_path / "local/m/report.md").read_text(), (shared_run["root"] / "report.md").read_text()
    assert _headings(local) == _headings(remote)
    # the matrix cells' rows (the cluster's page has the clients cells' rows too)
    rows = lambda t: [line.split("|")[1:5] for line in t.splitlines()  # noqa: E731
                      if line.startswith("| ") and line.split("|")[1].strip() in CELLS]
    assert rows(local) == rows(remote) and {r[0].strip() for r in rows(local)} == set(CELLS)
    assert "ran reference on `" in remote and "ran reference on" not in local


def test_the_dry_run_shows_placement_and_fails_in_one_line_without_a_node(cluster, tiny_llama, tmp_path, capsys):
    body = MATRIX + '[cells.cluster]\nresources = { kind_b = 1 }\n'  # c2 pinned to the worker's kind
    cfg = write_config(tmp_path / "m.toml", tiny_llama, body, name="m")
    assert run_main([str(cfg), "--dry-run", "--cluster", cluster.address]) == 0
    out = capsys.readouterr().out
    worker = cluster.worker.node_id[:12]
    assert re.search(rf"c2 / reference: asks CPU 1, kind_b 1 -> {worker} \(", out) and "c2" in out.splitlines()[-1]
    cfg = write_config(tmp_path / "z.toml", tiny_llama, MATRIX + '[cells.cluster]\nresources = { kind_z = 1 }\n',
                       name="z")
    assert run_main([str(cfg), "--dry-run", "--cluster", cluster.address]) == 2
    *before, err = capsys.readouterr().err.strip().splitlines()
    assert before == ["inferlab: preflight passed on 2 node(s)"]
    assert "cell c2, engine reference: no node has what it asks (CPU 1, kind_z 1); 2 node(s) alive" in err


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
num_threads = 1   # one torch thread, as every process in the tests has: two spinning ones stall on a busy machine
env = {{ INFERLAB_TEST_MARK = "{mark}" }}   # every process of this run's engine carries it (its core's too)
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
{cluster}
"""


def _mark(tmp_path: Path) -> str:
    return f"{os.getpid()}-{time.monotonic_ns()}-{tmp_path.name}"


def _engines(mark: str) -> list[psutil.Process]:
    """The live processes of the run's engine: those whose environment carries its marker."""
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("INFERLAB_TEST_MARK") == mark and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            continue
    return out


def test_a_node_killed_mid_level_loses_nothing_and_leaves_no_engine(cluster, tiny_llama, tmp_path):
    mark = _mark(tmp_path)
    # 16 requests: the rate=2 level lasts ~8 s, so the node dies inside it however late its first record is seen (a
    # fresh-clone CI with 6 requests, a 3-s level: both levels had finished when the node died)
    cfg = write_config(tmp_path / "k.toml", tiny_llama, KILL.format(mark=mark, cluster="resources = { kind_b = 1 }")
                       .replace("num_requests = 6", "num_requests = 16"), name="k")
    records = tmp_path / "res/k/reference/requests.jsonl"
    codes: list[int] = []
    run = threading.Thread(target=lambda: codes.append(run_main(
        [str(cfg), "--out", str(tmp_path / "res"), "--no-progress", "--cluster", cluster.address])), daemon=True)
    run.start()
    killed: list[str] = []
    while run.is_alive() and not killed:  # once the slow level has its first record, the worker node dies
        lines = records.read_text().splitlines() if records.is_file() else []
        if any('"level":"rate=2"' in line for line in lines):
            assert _engines(mark), "the engine runs while the level does"
            killed.append(cluster.worker.node_id)
            cluster.remove_node(cluster.worker, allow_graceful=False)
            cluster.worker = cluster.add_node(num_cpus=1, resources={"kind_b": 1})  # the node that replaces it
        time.sleep(0.05)
    run.join(timeout=600)
    assert killed and codes == [0]
    recs = _records(records)
    ids = [(r["level"], r["request_id"]) for r in recs]
    assert len(ids) == len(set(ids)) == 32  # every request of both levels, exactly once
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
        if not _engines(mark):
            break
        time.sleep(0.1)
    assert _engines(mark) == []


# planted: every client process holds its own event loop for 250 ms just after it stamps each send (regular
# arrivals 200 ms apart: one client falls a further 50 ms behind with every request, its last of 12 ~0.5 s late, ten
# times the client-bound line of 50 ms; two, each with arrivals 400 ms apart, keep up with ~150 ms to spare, so a
# busy machine's stalls of up to ~150 ms do not make them late: CI once saw a 60 ms hold with 40 ms to spare
# flagged), whatever the engine does
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


def test_two_clients_keep_one_client_s_schedule_and_a_planted_slow_client_is_client_bound(shared_run):
    from experiments.running.load import arrivals

    assert shared_run["code"] == 0
    runs = {}
    for k, cell in ((1, "one"), (2, "two")):  # the two cells ran side by side, one on each node
        ed = shared_run["root"] / cell / "reference"
        runs[k] = ({r["request_id"]: r for r in _records(ed / "requests.jsonl")},
                   json.loads((ed / "manifest.json").read_text())["clients"]["rate=5"]["1"])
    (one, one_clients), (two, two_clients) = runs[1], runs[2]
    schedule = arrivals(12, 5, 50, 0)
    assert sorted(one) == sorted(two) and len(one) == 12
    assert [one[r]["arrival_s"] for r in sorted(one)] == [two[r]["arrival_s"] for r in sorted(two)] == schedule
    assert all(one[r]["prompt_token_ids"] == two[r]["prompt_token_ids"] for r in one)
    assert {r["client"] for r in two.values()} == {0, 1} and {r["client"] for r in one.values()} == {0}
    # merged onto one clock: the two clients' requests were due in the schedule's order
    by_due = sorted(two.values(), key=lambda r: r["due_ns"])
    assert [r["arrival_s"] for r in by_due] == schedule
    assert [c["client_bound"] for c in one_clients] == [True], one_clients
    assert [c["client_bound"] for c in two_clients] == [False, False], two_clients
    assert all(abs(c["clock_offset_ms"]) < c["rtt_ms"] + 1 for c in two_clients)  # one machine: one clock
    page = (shared_run["root"] / "one/report.md").read_text()
    assert "### The clients that sent each level" in page and "**client-bound**" in page
    assert "**client-bound**" not in (shared_run["root"] / "two/report.md").read_text()


def _as_a_terminal() -> None:
    """The driver's SIGINT as a shell gives it: the default action, unblocked. A child inherits an ignored signal and
    the signal mask across exec, and this worker ran a cluster driver in-process before (`shared_run`): three
    fresh-clone CI runs in a row (2026-12-07) saw the driver, signalled mid-level, run on to its report and exit 0,
    while the test alone passed."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def test_ctrl_c_on_the_driver_stops_every_remote_engine(cluster, tiny_llama, tmp_path):
    mark = _mark(tmp_path)
    # 24 requests: the rate=2 level lasts ~12 s, so Ctrl-C lands inside it however late its first record is seen
    cfg = write_config(tmp_path / "i.toml", tiny_llama, KILL.format(mark=mark, cluster="attempts = 1")
                       .replace("num_requests = 6", "num_requests = 24"), name="i")
    records = tmp_path / "res/i/reference/requests.jsonl"
    driver = subprocess.Popen([sys.executable, "-m", "experiments.cli", "run", str(cfg), "--out", str(tmp_path / "res"),
                               "--no-progress", "--cluster", cluster.address],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=_as_a_terminal)
    try:
        while driver.poll() is None and not (records.is_file() and '"level":"rate=2"' in records.read_text()):
            time.sleep(0.05)
        assert driver.poll() is None and _engines(mark), "the engine serves its level on a node"
        driver.send_signal(signal.SIGINT)  # Ctrl-C
        err = driver.communicate(timeout=300)[1]
    finally:
        driver.kill()
    # its stderr with it: a fresh-clone CI run (2026-12-07, d9ff65d) saw the driver exit 0 after the signal, once
    assert driver.returncode != 0 and "KeyboardInterrupt" in err, (driver.returncode, err[-3000:])
    m = json.loads((tmp_path / "res/i/reference/manifest.json").read_text())
    assert m["status"] == "failed" and m["reason"].startswith("interrupted: Ctrl-C")
    for _ in range(300):  # the reaper beside the cancelled task kills the engine's process group
        if not _engines(mark):
            break
        time.sleep(0.1)
    assert _engines(mark) == []
