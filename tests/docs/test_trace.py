"""`inferlab trace`: shared prefix blocks and hit counters, n-gram drafts proposed and accepted, input
shapes, KV bytes, top-k probabilities and state transitions, as JSON and as terminal text."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

from experiments.cli import COMMANDS
from reference_engine.engine import trace

SPEC_PROMPT = "one two three one two three one two three one two three"


def run(capsys, monkeypatch, *argv: str) -> str:
    monkeypatch.setenv("COLUMNS", "200")
    assert trace.main(list(argv)) == 0
    return capsys.readouterr().out


def doc(capsys, monkeypatch, *argv: str) -> dict:
    return json.loads(run(capsys, monkeypatch, *argv, "--json"))


def test_registered_as_an_inferlab_command():
    assert COMMANDS["trace"][0] == "reference_engine.engine.trace:main"


def test_shared_prefix_marks_shared_blocks_and_counts_hits(tiny_llama, capsys, monkeypatch):
    d = doc(capsys, monkeypatch, "--model", str(tiny_llama), "--requests", "3", "--max-tokens", "3")
    steps, bs = d["steps"], d["config"]["block_size"]
    # request 0 runs its prefill alone; the others are admitted once its prompt blocks are cached
    assert [x["request"] for x in steps[0]["scheduled"]] == ["0"]
    join = next(s for s in steps if "1" in s["prefix_cache"]["hit_tokens"])
    hits = join["prefix_cache"]["hit_tokens"]
    assert hits["1"] > 0 and hits["2"] > 0 and hits["1"] % bs == 0
    assert join["prefix_cache"]["hits"] == hits["1"] + hits["2"] > 0
    assert join["prefix_cache"]["queries"] == sum(r["num_tokens"] for r in d["config"]["requests"][1:])
    t0, t1, t2 = (join["block_tables"][r] for r in "012")
    n = t1["hit_blocks"]
    assert n == hits["1"] // bs and t2["hit_blocks"] == n and t0["hit_blocks"] == 0
    assert t1["blocks"][:n] == t0["blocks"][:n] == t2["blocks"][:n]  # the same physical blocks
    assert t1["refs"][:n] == [3] * n and t1["blocks"][n:] != t2["blocks"][n:]  # suffixes are private
    assert {x["request"]: x["kind"] for x in join["scheduled"]} == {"0": "decode", "1": "prefill", "2": "prefill"}
    assert steps[-1]["prefix_cache"]["hits_total"] == d["summary"]["prefix_cache_hits"] == hits["1"] + hits["2"]
    # every request goes new -> running -> finished
    moves = [(t["request"], t["from"], t["to"]) for s in steps for t in s["transitions"]]
    for r in "012":
        assert (r, "new", "running") in moves and (r, "running", "finished") in moves


def test_shared_prefix_in_the_terminal_view(tiny_llama, capsys, monkeypatch):
    out = run(capsys, monkeypatch, "--model", str(tiny_llama), "--requests", "3", "--max-tokens", "2")
    assert "* = block reused through a prefix-cache hit" in out
    table1 = re.search(r"table 1\s+\[([^\]]*)\]", out).group(1).split()
    assert re.fullmatch(r"\d+\*x[23]", table1[0]) and not table1[-1].endswith("*")  # shared, then private
    hit = re.search(r"queries (\d+) hits (\d+) \(total \d+ / (\d+)\); req 1 hit (\d+) tokens", out)
    assert hit and int(hit.group(2)) > 0 and int(hit.group(4)) > 0
    assert re.search(r"prefix cache: \d+ tokens looked up, [1-9]\d* hit", out)
    assert "req 1: new -> running" in out and "req 0: running -> finished" in out


def test_without_prefix_cache_nothing_is_shared(tiny_llama, capsys, monkeypatch):
    d = doc(capsys, monkeypatch, "--model", str(tiny_llama), "--requests", "3", "--max-tokens", "2",
            "--no-prefix-cache")
    assert d["summary"]["prefix_cache_hits"] == 0
    for s in d["steps"]:
        for t in s["block_tables"].values():
            assert t["hit_blocks"] == 0 and set(t["refs"]) == {1}


def test_ngram_speculation_shows_proposed_and_accepted_tokens(tiny_llama, capsys, monkeypatch):
    d = doc(capsys, monkeypatch, SPEC_PROMPT, "--model", str(tiny_llama), "--speculative", "ngram",
            "--max-tokens", "24")
    spec_steps = [s for s in d["steps"] if s["speculative"]]
    assert spec_steps and d["summary"]["spec_accepted_tokens"] > 0
    assert d["summary"]["spec_draft_tokens"] == sum(len(sp["proposed"]) for s in spec_steps
                                                    for sp in s["speculative"].values())
    for s in spec_steps:
        sp = s["speculative"]["0"]
        assert sp["accepted"] == sp["proposed"][:len(sp["accepted"])]
        assert s["input_shapes"]["logits"][0] == 1 + len(sp["proposed"])  # 1 + drafts rows verified
        assert s["scheduled"][0]["drafts"] == len(sp["proposed"])
        emitted = [t["id"] for t in s["tokens"]["0"]]
        assert emitted[:len(sp["accepted"])] == sp["accepted"]
        assert len(emitted) == len(sp["accepted"]) + 1 or "0" in s["finished"]
    assert len(d["steps"]) < 24  # fewer steps than tokens
    out = run(capsys, monkeypatch, SPEC_PROMPT, "--model", str(tiny_llama), "--speculative", "ngram",
              "--max-tokens", "24")
    assert re.search(r"spec 0\s+proposed \[\d+(, \d+)*\] accepted [1-9]", out)
    assert re.search(r"req 0 verify \d+ \(1 \+ \d+ drafts\)", out)  # a verify row, not a decode


def test_each_step_reports_shapes_kv_bytes_and_top_k(tiny_llama, capsys, monkeypatch):
    d = doc(capsys, monkeypatch, "--model", str(tiny_llama), "--requests", "2", "--max-tokens", "3", "--top", "4")
    c = d["config"]
    assert c["kv_bytes_per_token"] == 2 * c["layers"] * c["kv_heads"] * c["head_dim"] * 4
    assert c["block_bytes"] == c["kv_bytes_per_token"] * c["block_size"]
    for s in d["steps"]:
        n = sum(x["tokens"] for x in s["scheduled"])
        shapes = s["input_shapes"]
        assert shapes["input_ids"] == shapes["positions"] == shapes["slot_mapping"] == [n]
        assert shapes["block_tables"][0] == shapes["seq_lens"][0] == len(s["scheduled"])
        widest = max((len(t["blocks"]) for t in s["block_tables"].values()), default=0)
        assert shapes["block_tables"][1] >= widest
        assert s["cuda_graph_bucket"] is None  # CPU: every step runs eagerly
        assert shapes["logits"] == [len(s["tokens"]), c["vocab"]]
        assert s["num_prefill_tokens"] + s["num_decode_tokens"] == n
        k = s["kv"]
        assert k["blocks_used"] + k["blocks_free"] == c["num_blocks"]
        assert k["bytes_used"] == k["blocks_used"] * c["block_bytes"]
        for toks in s["tokens"].values():
            for t in toks:
                probs = [x["prob"] for x in t["top"]]
                assert len(probs) == 4 and probs == sorted(probs, reverse=True) and sum(probs) <= 1.0001
                assert t["top"][0]["id"] == t["id"]  # greedy: the chosen token is the most likely


def test_preemption_shows_as_a_transition(tiny_llama, capsys, monkeypatch):
    d = doc(capsys, monkeypatch, "--model", str(tiny_llama), "--requests", "3", "--max-tokens", "8",
            "--kv-tokens", "76", "--no-prefix-cache")
    assert any(s["preempted"] for s in d["steps"])
    moves = {(t["from"], t["to"]) for s in d["steps"] for t in s["transitions"]}
    assert ("running", "preempted") in moves and ("preempted", "running") in moves


def test_default_model_is_made_in_models_tiny_llama(tiny_llama, tmp_path, monkeypatch):
    import reference_engine.model.make as mm

    made = []
    monkeypatch.setattr(mm, "make_model", lambda out, **kw: made.append(kw) or shutil.copytree(tiny_llama, out))
    monkeypatch.chdir(tmp_path)
    notes = []
    assert trace.resolve_model(None, notes.append) == "models/tiny-llama"
    assert made == [{"preset": "tiny", "family": "llama", "seed": 0, "force": True}] and "making" in notes[0]
    assert trace.resolve_model(None, notes.append) == "models/tiny-llama" and len(made) == 1  # reused
    assert trace.resolve_model("elsewhere", notes.append) == "elsewhere"


def test_bad_arguments_exit_with_usage_errors():
    with pytest.raises(SystemExit):
        trace.parse(["--requests", "0"])
    with pytest.raises(SystemExit):
        trace.parse(["--speculative", "draft"])


@pytest.mark.slow
def test_inferlab_trace_command_line(tiny_llama, tmp_path):
    exe = shutil.which("inferlab", path=str(__import__("pathlib").Path(sys.executable).parent))
    r = subprocess.run([exe, "trace", "--model", str(tiny_llama), "--requests", "3", "--max-tokens", "2", "--json"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["summary"]["prefix_cache_hits"] > 0


def test_numbers_the_handbook_quotes_from_traces_are_current(tiny_llama, capsys, monkeypatch):
    """Chapters 12 and 13 quote these traces' counters; a change of model or tokenizer must update them."""
    from tests.docs.handbook import HANDBOOK

    def text(name):
        return " ".join((HANDBOOK / name).read_text().split())

    d = doc(capsys, monkeypatch, "--model", str(tiny_llama), "--requests", "3")
    q, h = d["summary"]["prefix_cache_queries"], d["summary"]["prefix_cache_hits"]
    assert f"{q} tokens queried, {h} hit ({h / q:.0%})" in text("12-prefix-caching.md")
    d = doc(capsys, monkeypatch, SPEC_PROMPT, "--model", str(tiny_llama), "--speculative", "ngram", "--max-tokens", "24")
    sm = d["summary"]
    quoted = (f"24 tokens take {sm['steps']} steps instead of 24: {sm['spec_draft_tokens']} drafts verified, "
              f"{sm['spec_accepted_tokens']} accepted")
    assert quoted in text("13-speculative-decoding.md")


def test_every_request_has_a_state_each_step_with_counts_width_and_memory(tiny_llama, capsys, monkeypatch):
    """Not only transitions: each step lists every request's state and computed/total tokens, the running
    and waiting counts, the block-table columns the step used and the KV bytes in use."""
    argv = ["--model", str(tiny_llama), "--requests", "3", "--max-tokens", "8", "--kv-tokens", "76",
            "--no-prefix-cache"]
    d = doc(capsys, monkeypatch, *argv)
    c = d["config"]
    assert c["memory"]["weights"] > 0 and c["memory"]["kv_allocated"] == c["num_blocks"] * c["block_bytes"]
    states = set()
    for s in d["steps"]:
        assert set(s["requests"]) == {"0", "1", "2"}
        live = [x["state"] for x in s["requests"].values()]
        states.update(live)
        # the waiting queue holds new and preempted requests alike
        assert s["num_running"] == live.count("running")
        assert s["num_waiting"] == live.count("waiting") + live.count("preempted")
        for t in s["transitions"]:
            assert s["requests"][t["request"]]["state"] == t["to"]
        tables = [s["block_tables"][x["request"]]["blocks"] for x in s["scheduled"] if x["request"] in s["block_tables"]]
        assert max(map(len, tables), default=0) <= s["block_table_width_used"] < s["input_shapes"]["block_tables"][1]
        assert s["memory"]["kv_used"] == s["kv"]["bytes_used"] and s["memory"]["kv_allocated"] == c["memory"]["kv_allocated"]
    assert {"running", "preempted", "finished"} <= states
    # a preempted request is listed at every step while it waits, not just when it moves
    out = run(capsys, monkeypatch, *argv)
    steps_text = re.split(r"\n(?=─* ?step \d+ )", out)[1:]
    rows = [re.search(r"requests\s+running (\d+), waiting (\d+): (.*)", st) for st in steps_text]
    assert len(rows) == len(d["steps"]) and all(rows)
    assert all(len(re.findall(r"req \d (running|waiting|preempted|finished|not added yet) \d+/\d+", r.group(3))) == 3
               for r in rows)
    assert sum("preempted" in r.group(3) for r in rows) > sum(bool(s["preempted"]) for s in d["steps"])
    assert re.search(r"block tables: \d+ columns used", out) and re.search(r"memory\s+weights [\d.]+ MiB", out)


def test_noise_note_only_when_same_shape_steps_vary():
    def step(ms, prefill=0, decode=1):
        return {"duration_ms": ms, "num_prefill_tokens": prefill, "num_decode_tokens": decode, "num_verify_tokens": 0}

    quiet = [step(30, 10, 0)] + [step(m) for m in (5, 6, 5, 7)]  # the prefill step is its own group
    assert trace.noise(quiet) is None
    busy = quiet + [step(40)]
    n = trace.noise(busy)
    assert n and n["worst_ratio"] > trace.NOISY and (n["min_ms"], n["max_ms"]) == (5, 40)


def test_a_kernel_build_is_announced(capsys):
    """The trace wraps torch's load_inline, the one call a kernel-cache miss makes: the note comes first."""
    from torch.utils import cpp_extension

    real, notes = cpp_extension.load_inline, []
    with trace.announce_kernel_builds(notes.append):
        assert cpp_extension.load_inline is not real
        with pytest.raises(TypeError):
            cpp_extension.load_inline(not_an_argument=1)  # fails inside torch, after the note
    assert cpp_extension.load_inline is real and notes == ["building the CPU kernels (once; cached afterwards, "
                                                            "about a minute on 2 cores) ..."]
