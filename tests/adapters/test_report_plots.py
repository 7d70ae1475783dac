"""Report pieces owned with the adapters (issue 25, first contact): an engine keeps its colour in
every plot of a report, the load axis shows only the measured levels, and the settings table
says where each row was read in a footnote per row (a value the engine does not report is †)."""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from adapters.common.readback import AS_REQUESTED
from experiments.report import plots
from experiments.report.settings import settings_section
from experiments.report.summary import EngineResult, Runs


def result(name: str, throughput: dict[str, float], effective: dict | None = None) -> EngineResult:
    summary = {lv: {"output_throughput": t, "ttft_ms": {"median": 10.0 * t}} for lv, t in throughput.items()}
    return EngineResult(name, name, Path("run"), {"info": {"effective": effective or {}}}, summary=summary)


def runs_of(*engines: EngineResult, levels=("concurrency=1", "concurrency=2", "concurrency=4")) -> Runs:
    return Runs([], list(engines), list(levels))


def line_colours(fig) -> dict[str, str]:
    ax = fig.axes[0]
    return {ln.get_label(): ln.get_color() for ln in ax.lines}


def test_each_engine_keeps_its_colour_in_every_plot_and_report():
    a = runs_of(result("vllm", {"concurrency=1": 5, "concurrency=2": 9}), result("reference", {"concurrency=1": 4}),
                result("sglang", {"concurrency=4": 20}))
    b = runs_of(result("sglang", {"concurrency=1": 6}), result("vllm", {"concurrency=1": 5}))  # another report
    seen = {}
    for runs in (a, b):
        for key, label in (("output_throughput", "tok/s"), ("ttft_median", "ms")):
            fig, _ = plots.sweep_figure(runs, key, label)
            for engine, colour in line_colours(fig).items():
                assert seen.setdefault(engine, colour) == colour, engine
            plt.close(fig)
    assert seen == {"vllm": "tab:orange", "reference": "tab:blue", "sglang": "tab:green"}


def test_a_variant_or_a_second_run_of_an_engine_gets_its_own_spare_colour():
    again = result("vllm", {"concurrency=1": 1})
    again.label = "vllm@second"
    colours = plots.colours(runs_of(result("vllm", {}), again, result("vllm-nocache", {})))
    assert colours["vllm"] == "tab:orange" and len(set(colours.values())) == 3


def test_the_load_axis_ticks_only_at_measured_levels():
    runs = runs_of(result("vllm", {"concurrency=1": 5, "concurrency=2": 9, "concurrency=4": 12}),
                   result("reference", {"concurrency=1": 4, "concurrency=4": 7}))
    fig, kind = plots.sweep_figure(runs, "output_throughput", "tok/s")
    ax = fig.axes[0]
    assert kind == "concurrency" and list(ax.get_xticks()) == [1, 2, 4]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4"]
    plt.close(fig)
    rate = runs_of(result("vllm", {"rate=2": 5, "rate=inf": 9}), levels=("rate=2", "rate=inf"))
    fig, _ = plots.sweep_figure(rate, "output_throughput", "tok/s")
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["2", "inf"]
    plt.close(fig)


def test_settings_sources_are_a_footnote_per_row_and_unreported_values_are_marked():
    ref = result("reference", {}, {"dtype": "float32", "block_size": 16,
                                   "sources": {"dtype": "LLMEngine.effective_config()",
                                               "block_size": "LLMEngine.effective_config()"}})
    sgl = result("sglang", {}, {"dtype": "float32", "block_size": 1,
                                "sources": {"dtype": AS_REQUESTED + " (/server_info dtype is the argument)",
                                            "block_size": "/server_info page_size"}})
    lines = settings_section(runs_of(ref, sgl))
    text = "\n".join(lines)
    assert "Sources:" not in text and not any(ln.startswith("- reference:") for ln in lines)
    assert "| dtype [1] | float32 | float32 † |" in text
    assert "| block / page size (tokens) [2] | 16 **≠** | 1 **≠** |" in text
    assert f"- [1] dtype: reference: LLMEngine.effective_config(); sglang: {AS_REQUESTED}" in text
    assert "- [2] block / page size (tokens): reference: LLMEngine.effective_config(); sglang: /server_info page_size" \
        in text
