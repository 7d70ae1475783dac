"""Matrix configs (`[[cells]]`): every cell is validated before anything runs, runs into a folder
of its own with its own report, and one page compares the engines across cells."""
from __future__ import annotations

import json
import re

import pytest

from experiments.commands.run import run_main
from experiments.report.matrix import speed_ratio
from experiments.workload.config import ConfigError, load
from tests.experiments.exp_util import write_config

MATRIX = """
engines = ["paced", "paced2"]
[workload]
num_requests = 4
input_len = 8
output_len = 12
[load]
mode = "closed"
concurrency = [2]
warmup = 0
[engine_options.paced]
ttft_ms = 5
period_ms = 2
[engine_options.paced2]
ttft_ms = 5
period_ms = 6            # planted: paced decodes 3x faster in cell "a"

[[cells]]
name = "a"

[[cells]]
name = "b"
dtype = "bfloat16"
engine_options = { paced2 = { period_ms = 1 } }   # planted: paced2 2x faster in cell "b"
load = { concurrency = [1, 2] }
"""


def test_cells_merge_into_the_base_config(tmp_path, exp_model, paced):
    cfg = load(write_config(tmp_path / "m.toml", exp_model, MATRIX, name="m"))
    a, b = cfg.cell_configs()
    assert (a.name, a.dtype, a.load.concurrency) == ("a", "float32", [2])
    assert (b.name, b.dtype, b.load.concurrency) == ("b", "bfloat16", [1, 2])
    # tables merge key by key: b keeps paced2's ttft_ms and the base's load mode and warm-up
    assert b.engine_options["paced2"] == {"ttft_ms": 5, "period_ms": 1}
    assert b.load.mode == "closed" and b.load.warmup == 0 and b.workload.output_len == 12
    assert b.cells == [] and a.engine_options == cfg.engine_options


@pytest.mark.parametrize("cells, needle", [
    ('[[cells]]\nname = "x"\n[[cells]]\nname = "x"\n', "cell name 'x' used twice"),
    ('[[cells]]\ndtype = "float32"\n', "cells[0] needs a name"),
    ('[[cells]]\nname = "ok"\n[[cells]]\nname = "bad"\nload = { concurency = [1] }\n',
     "cells[1] (bad): load.concurency: unknown key"),
    ('[[cells]]\nname = "bad"\ndtype = "int4"\n', "cells[0] (bad): dtype"),
])
def test_a_bad_cell_is_a_one_line_config_error(tmp_path, exp_model, cells, needle):
    path = write_config(tmp_path / "m.toml", exp_model, 'engine = "reference"\n' + cells, name="m")
    with pytest.raises(ConfigError) as e:
        load(path)
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_speed_ratio_reads_the_same_way_for_every_metric():
    assert speed_ratio(200.0, 100.0, higher_better=True) == 2.0  # twice the throughput
    assert speed_ratio(10.0, 20.0, higher_better=False) == 2.0  # half the latency
    assert speed_ratio(None, 20.0, higher_better=False) is None


def test_matrix_runs_every_cell_and_compares_across_them(tmp_path, exp_model, simulated):
    path = write_config(tmp_path / "m.toml", exp_model, MATRIX, name="m")
    assert run_main([str(path), "--out", str(tmp_path / "res"), "--no-progress"]) == 0
    root = tmp_path / "res/m"
    for cell, dtype in (("a", "float32"), ("b", "bfloat16")):
        assert (root / cell / "report.md").is_file()
        recorded = json.loads((root / cell / "config.json").read_text())
        assert recorded["name"] == cell and recorded["dtype"] == dtype and recorded["cells"] == []
        assert (root / cell / "config.toml").read_text().startswith(f"# cell '{cell}' of the matrix config")
    page = (root / "report.md").read_text()
    assert f"`inferlab run {path}`" in page and "paced ÷ best other" in page

    def ratio(cell: str, level: str, metric: str) -> float:
        row = next(r for r in page.splitlines() if r.startswith(f"| {cell} |") and f"| {level} | {metric} |" in r)
        return float(re.search(r"\*\*([\d.]+)\*\*", row).group(1))

    assert ratio("a", "concurrency=2", "TPOT p50 (ms)") == 3.0  # planted 6 ms vs 2 ms (simulated time)
    assert ratio("b", "concurrency=2", "TPOT p50 (ms)") == 0.5  # planted 1 ms vs 2 ms
    assert ratio("b", "concurrency=1", "TPOT p50 (ms)") == 0.5  # the cell's own extra level ran too
    assert not any(r.startswith("| a |") and "concurrency=1" in r for r in page.splitlines())


def test_one_cell_reruns_alone_and_unknown_cells_are_config_errors(tmp_path, exp_model, simulated):
    path = write_config(tmp_path / "m.toml", exp_model, MATRIX, name="m")
    out = ["--out", str(tmp_path / "res"), "--no-progress"]
    assert run_main([str(path), "--cell", "b", *out]) == 0
    root = tmp_path / "res/m"
    assert (root / "b/report.md").is_file() and not (root / "a").exists()
    page = (root / "report.md").read_text()
    assert "| a | float32 | – | not run |" in page and "| b | bfloat16 | concurrency=1 |" in page
    assert run_main([str(path), "--cell", "nope", *out]) == 2
    plain = write_config(tmp_path / "p.toml", exp_model, 'engine = "paced"\n', name="p")
    assert run_main([str(plain), "--cell", "a", *out]) == 2


def test_a_variant_of_the_base_engine_is_shown_but_never_the_best_other(tmp_path, exp_model, simulated):
    variant = MATRIX.replace('engines = ["paced", "paced2"]', 'engines = ["paced", "paced-fast", "paced2"]').replace(
        "[engine_options.paced2]", '[engine_options.paced-fast]\nadapter = "paced"\nttft_ms = 5\nperiod_ms = 1\n'
        "[engine_options.paced2]")
    path = write_config(tmp_path / "m.toml", exp_model, variant, name="m")
    assert run_main([str(path), "--cell", "a", "--out", str(tmp_path / "res"), "--no-progress"]) == 0
    row = next(r for r in (tmp_path / "res/m/report.md").read_text().splitlines()
               if r.startswith("| a |") and "| concurrency=2 | TPOT p50 (ms) |" in r)
    assert "paced-fast" in row and "**3.00**" in row  # paced (2 ms) vs paced2 (6 ms), not vs its own 1 ms variant


def test_rerunning_one_cell_keeps_the_others_results_without_their_raw_logs(tmp_path, exp_model, simulated):
    """requests.jsonl stays out of git: on a fresh clone a cell folder has its summary.json only. Rerunning
    another cell (or a dry run of one) rebuilds the page from those summaries; it must not overwrite them
    with empty ones (a dry run of one cell once emptied every committed cpu_vs_vllm summary)."""
    path = write_config(tmp_path / "m.toml", exp_model, MATRIX, name="m")
    out = ["--out", str(tmp_path / "res"), "--no-progress"]
    assert run_main([str(path), *out]) == 0
    root = tmp_path / "res/m"
    for f in root.glob("a/*/requests.jsonl"):
        f.unlink()  # as a clone has it
    kept = {f: f.read_text() for f in root.glob("a/*/summary.json")}
    page = (root / "report.md").read_text()
    assert kept and "| a | float32 | concurrency=2 | TPOT p50 (ms) |" in page
    assert run_main([str(path), "--cell", "b", "--dry-run", *out]) in (0, 2)
    assert (root / "report.md").read_text() == page  # a dry run wrote nothing
    assert run_main([str(path), "--cell", "b", *out]) == 0
    assert {f: f.read_text() for f in root.glob("a/*/summary.json")} == kept
    row = next(r for r in (root / "report.md").read_text().splitlines()
               if r.startswith("| a |") and "| concurrency=2 | TPOT p50 (ms) |" in r)
    assert "**3.00**" in row  # cell a's ratio, from its kept summaries
