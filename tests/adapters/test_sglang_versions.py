"""SGLang across its argument-groups refactor: the launch command for 0.5.9 (before it) parses
with 0.5.9's recorded parser, and the metric names of every row of the version table are
registered in each release the row lists (fixtures/sglang/SOURCE.md). 0.5.23's own parser is
run in .venv-sglang by test_sglang_contract.py."""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys

import pytest

from adapters.engines.sglang.settings import VERSIONS
from adapters.registry import create
from adapters.transport import prom
from adapters.transport.launcher import Launcher
from experiments.measuring.server_view import reduce
from tests.adapters.replay import fixture
from tests.adapters.test_sglang import installed_version
from tests.adapters.test_sglang_contract import NAMESPACE_KEYS, OPTION_SETS

TYPES = {"int": int, "float": float}
RECORDED_NAMES = json.loads(fixture("sglang", "metric_names_by_version.json"))["versions"]


def recorded_parser(name: str) -> argparse.ArgumentParser:
    """An argparse parser with the recorded add_argument calls (flags, store_true, choices, nargs, dest, type)."""
    p = argparse.ArgumentParser(exit_on_error=False)
    for a in json.loads(fixture("sglang", name))["arguments"]:
        kw = {k: a[k] for k in ("choices", "nargs", "dest") if k in a}
        if a.get("action") in ("store_true", "store_false"):
            kw = {"action": a["action"]}
        elif a.get("type") in TYPES:
            kw["type"] = TYPES[a["type"]]
        p.add_argument(*a["flags"], **kw)
    return p


def argv_059(options: dict, dtype: str, tmp_path, monkeypatch) -> list[str]:
    installed_version(tmp_path, monkeypatch, "0.5.9")
    e = create("sglang", "/models/qwen", dtype, {"launcher": sys.executable, **options})
    e.server.launcher, e.server.port = Launcher.parse(sys.executable), 30000
    return e.server_argv()[3:]


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    with contextlib.redirect_stderr(io.StringIO()):
        return parser.parse_args(argv)


@pytest.mark.parametrize("i", range(len(OPTION_SETS)))
def test_launch_command_for_0_5_9_parses_with_its_recorded_parser(i, tmp_path, monkeypatch):
    options, dtype = OPTION_SETS[i]
    ns = parse(recorded_parser("parser_0.5.9.json"), argv_059(options, dtype, tmp_path, monkeypatch))
    assert (ns.model_path, ns.port, ns.dtype, ns.enable_metrics) == ("/models/qwen", 30000, dtype, True)
    assert ns.disable_cuda_graph is bool(options.get("disable_cuda_graph"))
    if options.get("kv_cache_tokens"):
        assert ns.max_total_tokens == options["kv_cache_tokens"]
    ns.tp_size = ns.tensor_parallel_size  # 0.5.9's ServerArgs.from_cli_args does the same
    for k in set(NAMESPACE_KEYS) & set(options):  # every knob lands in the field of its name
        assert getattr(ns, k) == options[k], k


def test_the_0_5_23_flags_do_not_exist_before_the_refactor(tmp_path, monkeypatch):
    """Why the version matters: 0.5.9's parser rejects the flag 0.5.23 asks for."""
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        parse(recorded_parser("parser_0.5.9.json"), ["--model-path", "m", "--cuda-graph-backend-decode", "disabled"])


def built_metrics(names: list[str]) -> str:
    """A /metrics text with one sample of every registered histogram whose name we read (the
    recorded fact is the set of names each release registers; the values are made up)."""
    lines = []
    for n in names:
        if n.endswith("_seconds"):
            lines += [f'{n}_bucket{{le="+Inf"}} 4', f"{n}_sum 0.2", f"{n}_count 4"]
        else:
            lines.append(f"{n} 1")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("row", VERSIONS.rows, ids=lambda r: r.span())
def test_each_rows_metric_names_are_registered_in_every_release_it_lists(row):
    names = row.values["metrics"]
    for version in row.checked:
        registered = set(RECORDED_NAMES[version]["metric_names"])
        assert set(names.prefixes()) <= registered, (version, set(names.prefixes()) - registered)
        hist, _, _ = reduce(prom.Metrics.parse(built_metrics(sorted(registered))), names)
        if names.tpot is not None:  # from 0.5.22: the per-request TPOT histogram
            assert hist["tpot"]["count"] == 4 and hist["tpot"]["sum"] == pytest.approx(0.2)
        else:  # before 0.5.22 no release registers any per-output-token histogram: TPOT is not exported
            assert "tpot" not in hist and not [n for n in registered if "per_output_token" in n], version


def test_the_tpot_histogram_is_the_current_name_in_0_5_22_and_0_5_23():
    for version in ("0.5.22", "0.5.23"):
        assert "sglang:request_time_per_output_token_seconds" in RECORDED_NAMES[version]["metric_names"]
        assert "sglang:time_per_output_token_seconds" not in RECORDED_NAMES[version]["metric_names"]
    assert VERSIONS.row("0.5.23").values["metrics"].tpot == "sglang:request_time_per_output_token_seconds"
