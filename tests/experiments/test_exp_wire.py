"""experiments.measuring.wire: the split of the time before the first token, and the words the report
uses for a client-vs-server TTFT gap; then the stamps of a real burst on `inferlab serve`."""
from __future__ import annotations

import json

import pytest

from experiments.commands.run import run_main
from experiments.measuring import wire
from tests.experiments.exp_util import write_config

MS = 1_000_000


def _rec(write_ms: float, front_ms: float | None) -> dict:
    send = 10 * MS
    sent = send + int(write_ms * MS)
    return {"send_ns": send, "sent_ns": sent, "headers_ns": sent + int(front_ms * MS) if front_ms is not None else None}


def _gap(ms: float) -> dict:
    return {"rows": {"ttft": {"client_ms": 100 + ms, "server_ms": 100.0, "diff_ms": ms}}}


def test_split_means_over_the_stamped_requests():
    s = wire.split([_rec(2, 40), _rec(4, 60), {"send_ns": 1, "sent_ns": None, "headers_ns": None}])
    assert s["requests"] == 2
    assert abs(s["write_ms"]["mean"] - 3) < 1e-6 and abs(s["front_ms"]["mean"] - 50) < 1e-6
    assert wire.split([{"send_ns": 1}]) is None  # an in-process engine: nothing on the wire


def test_cause_names_the_side_the_time_went():
    client_side = wire.cause(_gap(90), wire.split([_rec(60, 5)] * 4))
    assert client_side.startswith("of the 90.0 ms, 60.0 ms passed before the request's last byte left")
    assert "the harness's own send queue" in client_side and not client_side.startswith("both")
    front_end = wire.cause(_gap(90), wire.split([_rec(5, 70)] * 4))
    assert "70.0 ms after that: the requests waited in the server's front end" in front_end
    assert "send queue" not in front_end and not front_end.startswith("both")
    both = wire.cause(_gap(90), wire.split([_rec(40, 120)] * 4))
    assert both.startswith("both sides: of the 90.0 ms, 40.0 ms passed") and "send queue" in both
    assert "headers came back 120.0 ms after that" in both
    neither = wire.cause(_gap(90), wire.split([_rec(5, 2)] * 4))
    assert "the rest passed after the server's clock started" in neither and wire.GENERIC in neither
    assert wire.cause(_gap(90), None) == wire.GENERIC  # no stamps: the suspects, no verdict
    assert wire.cause(None, wire.split([_rec(60, 5)])) == wire.GENERIC


def test_a_burst_on_inferlab_serve_is_stamped_in_order(tmp_path, exp_model):
    cfg = write_config(tmp_path / "c.toml", exp_model, """
        engine = "reference"
        [engine_options.reference]
        mode = "server"
        [workload]
        num_requests = 16
        input_len = 32
        output_len = 4
        [load]
        mode = "open"
        rate = ["inf"]
        warmup = 0
        """)
    assert run_main([str(cfg), "--out", str(tmp_path / "res"), "--no-progress"]) == 0
    recs = [json.loads(x) for x in (tmp_path / "res/t/reference/requests.jsonl").read_text().splitlines()]
    assert len(recs) == 16
    for r in recs:
        assert r["send_ns"] <= r["sent_ns"] <= r["headers_ns"] <= r["events"][0][0], r["request_id"]
    s = json.loads((tmp_path / "res/t/reference/summary.json").read_text())["levels"]["rate=inf"]["wire"]
    # the summary's split is the records' own stamps: send -> last byte out -> headers back
    assert s["requests"] == 16
    assert s["write_ms"]["mean"] == pytest.approx(sum(r["sent_ns"] - r["send_ns"] for r in recs) / 16 / 1e6)
    assert s["front_ms"]["mean"] == pytest.approx(sum(r["headers_ns"] - r["sent_ns"] for r in recs) / 16 / 1e6)
    report = (tmp_path / "res/t/report.md").read_text()
    table = report.split("| client write mean |")[1]
    row = next(x for x in table.splitlines() if x.startswith("| reference | rate=inf |"))
    assert row.split("|")[5].strip() == f"{s['front_ms']['mean']:,.2f}", row  # out -> headers mean, as measured
