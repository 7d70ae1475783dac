"""`inferlab simulate`: a bad config or flag is one line on stderr and exit 2; capacity planning on
the planted model finds more capacity with more replicas."""
from __future__ import annotations

import json

import pytest

from experiments.cli import main
from experiments.simulate import capacity
from experiments.workload.config import load
from tests.experiments.exp_util import write_config
from tests.experiments.simulate.planted import planted

BODY = """
engine = "reference"
[workload]
kind = "random"
num_requests = 8
input_len = 32
output_len = 8
[kv]
tokens = 2048
"""


@pytest.mark.parametrize("args, says", [
    (["missing.toml"], "not found"),
    (["{cfg}", "--capacity"], "--capacity needs --slo"),
    (["{cfg}", "--capacity", "--slo", "ttft_p42_ms=1"], "METRIC_STAT_ms=LIMIT"),
    (["{cfg}", "--capacity", "--slo", "ttft_p99_ms=-5"], "LIMIT > 0"),
    (["{cfg}", "--profile", "h900"], "not one of a100, h100, h200, l40s"),
    (["{cfg}", "--replicas", "0"], "--replicas must be >= 1"),
    (["{cfg}", "--router", "random"], "invalid choice"),
    (["{cfg}", "--profile", "/no/such/profile.json"], "not a file"),
    (["{bad}"], "unknown key"),
    (["{mat}"], "a matrix config"),
    (["{cfg}", "--calibrate", "--also-model", "/no/such/model"], "--also-model /no/such/model: no config.json"),
])
def test_usage_errors_are_one_line_and_exit_2(exp_model, tmp_path, capsys, args, says):
    cfg = write_config(tmp_path / "c.toml", exp_model, BODY)
    bad = write_config(tmp_path / "b.toml", exp_model, BODY + "bogus = 1\n")
    mat = write_config(tmp_path / "m.toml", exp_model, BODY + '[[cells]]\nname = "a"\n')
    try:
        rc = main(["simulate"] + [a.format(cfg=cfg, bad=bad, mat=mat) for a in args])
    except SystemExit as e:  # argparse's own errors exit from inside the parser
        rc = e.code
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert says in err and len(err.splitlines()) == 1


def test_no_calibrated_profile_says_how_to_make_one(exp_model, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = write_config(tmp_path / "c.toml", exp_model, BODY)
    assert main(["simulate", str(cfg)]) == 2
    err = capsys.readouterr().err.strip()
    assert "--calibrate" in err and len(err.splitlines()) == 1


def test_parse_slo():
    assert capacity.parse_slo("ttft_p99_ms=1000, tpot_p50_ms=100") == {("ttft", "p99"): 1000.0,
                                                                       ("tpot", "p50"): 100.0}


def test_two_replicas_take_more_than_one(exp_model, tmp_path):
    path = write_config(tmp_path / "c.toml", exp_model, BODY)
    cfg, slo = load(path), capacity.parse_slo("ttft_p90_ms=100")
    caps = []
    for n in (1, 2):
        capacity.run(cfg, "reference", planted(), slo, n, "least_loaded", None, 300, None, tmp_path)
        doc = (tmp_path / "t-capacity" / f"capacity-{n}x-least_loaded.json").read_text()
        caps.append(json.loads(doc)["best_rate"])
    assert caps[0] and caps[1] > 1.5 * caps[0]


@pytest.mark.parametrize("kind, shares", [("random", False), ("shared_prefix", True)])
def test_a_levels_cycled_copies_are_new_requests_to_the_prefix_cache(exp_model, tmp_path, kind, shares):
    """A level of 40 requests over 8 prompts sends each prompt 5 times. The copies must not hit the
    prefix cache for their originals (that would make prefill free from the second cycle on): random
    prompts, which share no block, get no hit at all; prompts of one shared prefix still hit it."""
    extra = "num_prefixes = 2\nprefix_len = 32\n" if kind == "shared_prefix" else ""
    body = BODY.replace('kind = "random"', f'kind = "{kind}"\n{extra}')
    cfg = load(write_config(tmp_path / "c.toml", exp_model, body))
    capacity.run(cfg, "reference", planted(), capacity.parse_slo("ttft_p90_ms=100"), 1, "least_loaded", None, 40,
                 None, tmp_path)
    doc = json.loads((tmp_path / "t-capacity" / "capacity-1x-least_loaded.json").read_text())
    rates = [p["replicas"][0]["prefix_hit_rate"] for p in doc["points"]]
    assert all(r > 0 for r in rates) if shares else all(r == 0 for r in rates), rates


def test_without_slo_flags_the_capacity_is_judged_by_the_measured_search_s_rule(exp_model, tmp_path):
    """No --slo: the config's [slo] per request, and a rate passes when at least load.search.goodput of the
    requests sent meet it (experiments/running/search.py), the rule the measured capacity is found by. A looser
    goodput can only pass more."""
    caps = {}
    for g in (0.5, 0.95):
        body = BODY + f'[slo]\nttft_ms = 100\n'
        cfg = load(write_config(tmp_path / f"c{g}.toml", exp_model, body.replace("[kv]", f"[load.search]\ngoodput = {g}\n[kv]")
                                if "[load.search]" not in body else body))
        rule = capacity.config_rule(cfg)
        assert dict(rule) == {"ttft_ms": 100.0} and rule.goodput == g
        capacity.run(cfg, "reference", planted(), rule, 1, "least_loaded", None, 200, None, tmp_path / str(g))
        doc = json.loads((tmp_path / str(g) / "t-capacity" / "capacity-1x-least_loaded.json").read_text())
        assert doc["goodput"] == g and all((p["goodput_fraction"] >= g) == p["passed"] for p in doc["points"])
        caps[g] = doc["best_rate"]
    assert caps[0.95] and caps[0.5] >= caps[0.95]
