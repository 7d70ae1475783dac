"""Step records: what each engine step did, for tracing and teaching.

Recording is off by default; when off, nothing below is even constructed.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepRecord:
    step: int
    duration_s: float
    scheduled: list[tuple[str, int, str]]  # (request_id, tokens this step, "prefill" | "decode")
    num_prefill_tokens: int
    num_decode_tokens: int
    preempted: list[str]
    finished: list[str]
    kv_blocks_used: int
    kv_blocks_free: int
    num_running: int
    num_waiting: int
    block_tables: dict[str, list[int]] = field(default_factory=dict)  # running requests after the step
