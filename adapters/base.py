"""The one interface every engine is measured through (docs/architecture.md: the parts and the rules).

Invariants every adapter keeps:
- `GenerationRequest.prompt_token_ids` is the only source of truth for the prompt;
  adapters for text-only engines derive text from it and report the engine's own
  prompt token count so the harness can flag a mismatch.
- `TokenEvent.token_ids` holds only the *new* tokens of that event (adapters for
  cumulative APIs diff), and `recv_ns` is `time.perf_counter_ns()` taken the moment
  the event arrived, before any other work.
- Exactly one event per request has `finished=True`, and it is the last one.
"""
from __future__ import annotations

import abc
import time
from dataclasses import asdict, dataclass, field
from typing import Any, AsyncIterator

from adapters.common import parallel


class EngineUnavailable(RuntimeError):
    """The engine's package or launcher is missing; the message says what to install."""


class RequestError(RuntimeError):
    """One request failed inside the engine or its server (HTTP error status, an error
    object in the stream, a dropped connection); the message says which and why.
    `generate()` raises it; the engine itself may still serve other requests."""


# Placeholder id for a token an engine streamed as text only (no ids): adapters append one
# per token they count, so TTFT/ITL still see a token-bearing event; agreement checks
# and re-tokenized cross-checks must skip requests that contain it.
UNKNOWN_TOKEN_ID = -1


def check_options(engine: str, options: dict[str, Any], known: set[str] | frozenset[str]) -> None:
    """Raise ValueError naming an unknown adapter option (a typo in `engine_options`)."""
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"engine {engine!r}: unknown option(s) {', '.join(unknown)}; "
                         f"known: {', '.join(sorted(known))}")


@dataclass
class SamplingConfig:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int = 128
    ignore_eos: bool = True
    stop: list[str] = field(default_factory=list)


@dataclass
class GenerationRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    prompt_text: str | None = None  # derived from the ids, for engines that take text
    arrival_s: float = 0.0  # scheduled send time, seconds after the run's start
    # chat messages (workload.template = "engine"): an adapter with a chat route sends these and lets the
    # engine apply its own template; prompt_token_ids then hold the harness's rendering, for comparison
    messages: list[dict[str, str]] | None = None


@dataclass
class TokenEvent:
    request_id: str
    token_ids: list[int]
    text: str = ""
    recv_ns: int = 0
    finished: bool = False
    finish_reason: str | None = None
    prompt_tokens: int | None = None  # as the engine reports them
    completion_tokens: int | None = None
    # (sent_ns, headers_ns) of the HTTP request behind a stream (adapters.transport.sse.Stream.wire):
    # when its last byte left the client and when the response's headers came back; None
    # where the adapter does not stream over HTTP.
    wire: tuple[int | None, int | None] | None = None

    @staticmethod
    def now() -> int:
        return time.perf_counter_ns()


@dataclass
class EngineInfo:
    engine: str
    version: str
    model: str
    dtype: str
    kv_capacity_tokens: int | None = None
    block_size: int | None = None
    knobs: dict[str, Any] = field(default_factory=dict)
    mode: str = "in_process"  # in_process | server | attach
    pid: int | None = None  # the engine's root process, for memory sampling
    # Full URL of the engine's Prometheus text (None: it exports none). The harness scrapes it
    # itself, only between measured levels, for the server's own view (experiments/measuring/server_view.py).
    metrics_url: str | None = None
    # Fairness settings this engine could not honour, setting -> why in words
    # (e.g. {"dtype": "TGI runs float16/bfloat16 only; float32 was asked, float16 ran"}).
    unhonoured: dict[str, str] = field(default_factory=dict)
    # What the engine actually ran with, read back from the engine itself (its /server_info,
    # /info, cache_config_info labels, startup log, config), never copied from the options we
    # passed. Keys (absent = the engine does not tell): dtype, kv_capacity_tokens, kv_blocks,
    # block_size, max_num_seqs, max_num_batched_tokens, max_model_len, chunked_prefill,
    # prefix_caching, cuda_graphs, compile, speculative, tensor_parallel_size, launch_command;
    # `sources` maps each key to where it was read (memory keys as "memory.KEY"). `speculative`
    # is False when the engine reports none, else a dict of adapters.common.features' uniform keys
    # (method "ngram" | "draft_model", num_speculative_tokens, ...), possibly with the engine's
    # own fields under its name. Adapters may add keys of their own (e.g. paged_kv, attention_backend).
    effective: dict[str, Any] = field(default_factory=dict)
    # Memory as the engine reports it, bytes (absent = not exposed; never a guess; a figure read
    # from a rounded log line says its resolution in its source): weights, kv_allocated,
    # kv_peak_used, device_total, graph_pool, kv_bytes_per_token (+ engine-specific extras), as read
    # at start; `Engine.memory()` reads the report again after the levels (the run's KV peak).
    memory: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class MemorySnapshot:
    t_ns: int
    kv_used_tokens: int | None = None
    kv_capacity_tokens: int | None = None
    kv_usage: float | None = None  # fraction in [0, 1]
    num_running: int | None = None
    num_waiting: int | None = None
    gpu_bytes: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Engine(abc.ABC):
    """Start, stream, abort, inspect, stop. `adapters.registry.register` sets `name` and `spec`
    (the engine's `EngineSpec`) on the classes of an engine folder; `MODES` are the modes a class runs."""

    name: str = "base"
    spec: Any = None
    MODES: tuple[str, ...] = ("in_process",)

    def __init__(self, model: str, dtype: str = "float32", options: dict[str, Any] | None = None):
        self.model = model
        self.dtype = dtype
        # `parallel` (the config's [parallel] block) becomes this engine's own options (adapters/common/parallel.py)
        self.options = parallel.to_native(self.spec, dict(options or {}))

    @abc.abstractmethod
    async def start(self) -> EngineInfo: ...

    @abc.abstractmethod
    def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]: ...

    @abc.abstractmethod
    async def abort(self, request_id: str) -> None: ...

    @property
    def in_process(self) -> bool:
        """True when the engine computes inside this Python process (and so shares its GIL)."""
        return False

    async def reset_prefix_cache(self) -> bool:
        """Return True if the engine's prefix cache was reset; False if it has none."""
        return False

    @abc.abstractmethod
    async def snapshot(self) -> MemorySnapshot: ...

    async def memory(self) -> dict[str, int]:
        """The engine's memory report now (EngineInfo.memory's keys, bytes), read after the
        levels for what grows while it serves (kv_peak_used, device peaks); {} where the
        engine reports nothing beyond what `start` read."""
        return {}

    @abc.abstractmethod
    async def stop(self) -> None: ...

    def dry_run(self, requests: list[GenerationRequest], fallback_launcher: str | None = None):
        """What `inferlab run --dry-run` shows for this engine (adapters.checks.dryrun.DryRun); starts nothing.
        Server adapters show their launch and check it; an in-process engine launches nothing."""
        from adapters.checks.dryrun import DryRun

        return DryRun(self.name, "in_process", note="runs in the harness's own process tree: nothing is launched")
