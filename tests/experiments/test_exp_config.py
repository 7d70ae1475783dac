"""Config validation through the real CLI: every mistake is one line on stderr and exit 2."""
from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.workload.config import ConfigError, load
from tests.experiments.exp_util import write_config

REPO = Path(__file__).resolve().parents[2]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "experiments.cli", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


BAD = {
    "unknown top-level key": ('engine = "reference"\nflavour = 1\n', "flavour: unknown key"),
    "unknown key in a table": ('engine = "reference"\n[load]\nconcurency = [1]\n', "load.concurency: unknown key"),
    "bad value": ('engine = "reference"\n[load]\nconcurrency = [0]\n', "load.concurrency"),
    "bad type": ('engine = "reference"\n[workload]\nnum_requests = "many"\n', "workload.num_requests"),
    "unknown engine": ('engine = "nope"\n', "unknown engine 'nope'"),
    "bad range": ('engine = "reference"\n[workload]\ninput_len = [9, 3]\n', "workload.input_len"),
    "two engine keys": ('engine = "reference"\nengines = ["hf"]\n', "either engine"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_config_is_one_line_and_exit_2(tmp_path, exp_model, case):
    body, needle = BAD[case]
    cfg = write_config(tmp_path / "c.toml", exp_model, body)
    p = cli("run", str(cfg))
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and needle in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


def test_missing_model_and_file_and_bad_toml(tmp_path):
    cfg = write_config(tmp_path / "c.toml", tmp_path / "no-such-model", 'engine = "reference"\n')
    bad_toml = tmp_path / "b.toml"
    bad_toml.write_text("name = \n")
    for args, needle in (((str(cfg),), "does not exist"), ((str(tmp_path / "absent.toml"),), "not found"),
                         ((str(bad_toml),), "invalid TOML"), (("--resum", str(cfg)), "unrecognized")):
        p = cli("run", *args)
        assert p.returncode == 2 and p.stderr.count("\n") == 1 and needle in p.stderr, p.stderr


def test_bad_engine_option_is_a_config_error(tmp_path, exp_model):
    cfg = write_config(tmp_path / "c.toml", exp_model, 'engine = "hf"\n[engine_options.hf]\nmax_btch_size = 2\n')
    p = cli("run", str(cfg), "--out", str(tmp_path / "res"))
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "max_btch_size" in p.stderr, p.stderr


@pytest.mark.parametrize("mode", ["in_process", "server"])
def test_an_impossible_kernel_pin_is_a_config_error(tmp_path, exp_model, mode, monkeypatch):
    """Refused before any engine starts: the pin would otherwise fail every step of the run."""
    cfg = write_config(tmp_path / "c.toml", exp_model, f'engine = "reference"\n[engine_options.reference]\n'
                                                        f'mode = "{mode}"\n')
    monkeypatch.setenv("INFERLAB_FUSED_DECODE", "false")  # (the child inherits it)
    p = cli("run", str(cfg), "--out", str(tmp_path / "res"))
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "INFERLAB_FUSED_DECODE" in p.stderr, p.stderr
    assert not (tmp_path / "res").exists()


def test_engine_override_and_defaults(tmp_path, exp_model):
    cfg = write_config(tmp_path / "c.toml", exp_model, """
        engines = ["reference", "hf"]
        optional_engines = ["vllm"]
        [load]
        mode = "open"
        rate = [2, "inf"]
    """)
    c = load(cfg)
    assert c.all_engines() == ["reference", "hf", "vllm"] and c.engine_list() == ["reference", "hf"]
    assert c.load.levels() == [("rate", 2.0), ("rate", math.inf)]
    one = load(cfg, engine="hf")
    assert one.all_engines() == ["hf"]
    assert c.digest() != one.digest() and c.digest() == load(cfg).digest()
    with pytest.raises(ConfigError, match="unknown engine"):
        load(cfg, engine="bogus")


def test_list_engines():
    p = cli("list-engines")
    assert p.returncode == 0 and "reference" in p.stdout and "vllm" in p.stdout



def test_required_engine_unavailable_exits_2_naming_the_install(tmp_path, exp_model, paced, capsys):
    """An adapter whose package is missing raises EngineUnavailable at start: one line, exit 2;
    as an optional engine it is skipped with a note and the run succeeds."""
    from experiments.commands.run import run_main

    body = """
        {engines}
        [engine_options.paced2]
        unavailable = "engine 'paced2': not installed; pip install 'inferlab[paced]'"
        [workload]
        num_requests = 2
        output_len = 3
    """
    cfg = write_config(tmp_path / "c.toml", exp_model, body.format(engines='engines = ["paced", "paced2"]'))
    assert run_main([str(cfg), "--out", str(tmp_path / "res"), "--no-progress"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == "inferlab: engine 'paced2': not installed; pip install 'inferlab[paced]'"
    cfg = write_config(tmp_path / "c.toml", exp_model,
                       body.format(engines='engines = ["paced"]\noptional_engines = ["paced2"]'))
    assert run_main([str(cfg), "--out", str(tmp_path / "res"), "--no-progress"]) == 0
    assert "| paced2 | unavailable |" in (tmp_path / "res/t/report.md").read_text()
