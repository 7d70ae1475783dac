"""The frontier on planted points: Pareto extraction (ties, a curve that turns back), reading at a target
(between points, on a point, outside the measured range), cost per million tokens; and the sweep's stop
rule and refinement on planted levels and counters."""
from __future__ import annotations

import pytest

from experiments.measuring import saturation
from experiments.measuring.frontier import Point, cost_per_m, frontiers, interactivity, pareto, read_at
from experiments.running.sweep import Point as Level
from experiments.running.sweep import refine, stop_reason
from experiments.workload.config import Sweep


def pt(x: float, y: float, level: str = "", ci: tuple[float, float] | None = None, engine: str = "e") -> Point:
    return Point(engine, None, level or f"x{x:g}", x, y, output_ci=ci)


def test_interactivity_is_tokens_per_second_per_user():
    assert interactivity(20.0) == 50.0 and interactivity(None) is None and interactivity(0) is None


def test_pareto_keeps_what_nothing_beats_on_both_axes():
    # a sweep: 1 user very interactive, low throughput; more users trade interactivity for throughput
    a, b, c, d = pt(100, 10), pt(80, 30), pt(50, 60), pt(20, 70)
    dominated = pt(60, 25)  # beaten by b (more interactive and more throughput)
    assert pareto([d, dominated, b, a, c]) == [d, c, b, a]  # ascending interactivity, so descending throughput


def test_a_curve_that_turns_back_past_saturation_loses_its_tail():
    # non-monotone: past saturation, more users give less throughput and less interactivity at once
    sat, worse = pt(30, 100, "c=16"), pt(20, 90, "c=32")
    assert pareto([pt(90, 20), pt(60, 70), sat, worse]) == [sat, pt(60, 70), pt(90, 20)]


def test_ties_both_stay_and_an_equal_x_with_less_throughput_goes():
    t1, t2 = pt(50, 40, "cellA"), pt(50, 40, "cellB")
    below = pt(50, 35, "cellC")
    front = pareto([t1, t2, below, pt(10, 80)])
    assert t1 in front and t2 in front and below not in front
    assert read_at(front, 50).output == 40  # on the tied points: their value


def test_read_between_points_interpolates_value_and_interval():
    front = pareto([pt(20, 100, ci=(90, 110)), pt(60, 40, ci=(36, 44))])
    r = read_at(front, 30)  # a quarter of the way from x=20 to x=60
    assert r.output == pytest.approx(85) and r.ci == pytest.approx((76.5, 93.5))
    assert r.between == ("x20", "x60")
    exact = read_at(front, 60)
    assert exact.output == pytest.approx(40) and exact.ci == pytest.approx((36, 44))


def test_a_target_outside_the_range_says_so_and_is_not_extrapolated():
    front = pareto([pt(20, 100), pt(60, 40)])
    for target in (10, 61):
        r = read_at(front, target)
        assert r.output is None and r.ci is None and "outside the measured range (20.0-60.0" in r.why
        assert "not extrapolated" in r.why
    assert read_at([], 30).why == "no frontier point"


def test_frontiers_are_per_engine():
    pts = [pt(10, 50, engine="a"), pt(10, 40, engine="b"), pt(20, 30, engine="b")]
    f = frontiers(pts)
    assert [p.output for p in f["a"]] == [50] and [p.output for p in f["b"]] == [40, 30]


def test_cost_per_million_output_tokens():
    # $3.60 per device-hour at 1,000 tok/s per device: 3.6 M tokens an hour, $1 per million
    assert cost_per_m(1000.0, 3.6) == pytest.approx(1.0)
    assert cost_per_m(1000.0, None) is None and cost_per_m(0.0, 3.6) is None


RULE = Sweep(max_concurrency=64, min_gain=0.10, max_queue_share=0.10, refine=2, refine_ratio=1.5, client_lateness_ms=25)


def lv(c, tput, tpot, ttft99=100.0, **kw) -> Level:
    return Level(c, tput, tpot, ttft99, **kw)


def test_the_sweep_goes_on_while_throughput_grows():
    assert stop_reason([lv(1, 100, 10)], RULE) is None
    assert stop_reason([lv(1, 100, 10), lv(2, 190, 10.5)], RULE) is None


def test_flat_throughput_with_rising_tpot_is_saturation():
    why = stop_reason([lv(8, 800, 12), lv(16, 840, 19)], RULE)
    assert why.startswith("output throughput grew +5% from concurrency 8 to 16 (less than 10%) while TPOT p50 rose")
    # flat throughput while TPOT does not rise is not (yet) saturation: a noisy plateau
    assert stop_reason([lv(8, 800, 12), lv(16, 840, 11.9)], RULE) is None


def test_the_engines_own_counters_stop_it_first():
    assert "preempted 3 requests at concurrency 32" in stop_reason([lv(16, 900, 20), lv(32, 1500, 22, preemptions=3)], RULE)
    q = stop_reason([lv(16, 900, 20), lv(32, 1500, 22, preemptions=0, queue_share=0.4)], RULE)
    assert "queue held 40% of its request time at concurrency 32" in q
    # exported and quiet: no signal; not exported (None): not a signal either
    assert stop_reason([lv(16, 900, 20), lv(32, 1500, 22, preemptions=0, queue_share=0.01)], RULE) is None
    assert stop_reason([lv(16, 900, 20), lv(32, 1500, 22)], RULE) is None


def test_ttft_and_concurrency_caps():
    capped = Sweep(max_concurrency=64, max_ttft_p99_ms=500)
    assert stop_reason([lv(4, 100, 10, ttft99=800)], capped) == "TTFT p99 800 ms passed the cap of 500 ms"
    assert stop_reason([lv(32, 100, 10), lv(64, 200, 11)], capped) == \
        "the next level (128) would pass max_concurrency = 64"


def test_a_client_bound_level_is_said_in_the_reason():
    slow = lv(16, 840, 19, lateness_p99=120.0, client_bound=True)
    why = stop_reason([lv(8, 800, 12), slow], RULE)
    assert "client-bound (send lateness p99 120 ms > 25 ms)" in why


def test_refine_adds_geometric_midpoints_where_the_curve_moved():
    pts = [lv(1, 100, 10), lv(2, 195, 10), lv(4, 380, 11), lv(8, 800, 12), lv(16, 840, 19)]
    # the last two (8, 16): 11; then the largest jump (1 -> 2 is x1.95, 2 -> 4 x1.95, 4 -> 8 x2.1): 4..8 is 6
    assert refine(pts, RULE) == [11, 6]
    assert refine(pts, Sweep(refine=0)) == []
    assert refine([lv(1, 100, 10), lv(2, 140, 10)], RULE) == []  # sqrt(2) rounds onto a measured level


def test_pressure_reads_the_engines_counters_and_queue_share():
    view = {"histograms": {"queue": {"sum_s": 3.0}, "e2e": {"sum_s": 12.0}}, "counters": {"preemptions": 2.0}}
    assert saturation.pressure(view, {}, {}) == {"preemptions": 2.0, "queue_share": 0.25}
    # an in-process engine: its adapter's snapshots around the level; the client's E2E when no histogram
    obs = {"snapshot_before": {"extra": {"num_preemptions_total": 1, "request_queue_time_s": 0.5}},
           "snapshot_after": {"extra": {"num_preemptions_total": 1, "request_queue_time_s": 1.5}}}
    p = saturation.pressure(None, obs, {"e2el_ms": {"mean": 500.0}, "num_requests": 10})
    assert p == {"preemptions": 0, "queue_share": pytest.approx(0.2)}
    assert saturation.pressure(None, {}, {}) == {"preemptions": None, "queue_share": None}


def test_sweep_config_defaults_are_the_stated_ones():
    s = Sweep()
    assert (s.start, s.min_gain, s.max_queue_share, s.refine, s.refine_ratio, s.client_lateness_ms, s.level_s) == \
        (1, 0.10, 0.10, 2, 1.5, 25.0, 30.0)
