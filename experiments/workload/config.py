"""Experiment configs: TOML files validated with pydantic.

Invariants: every table forbids unknown keys; a config that loads is runnable as far as can be checked without
starting an engine (model directory exists or `make_model` is set, engine names are registered). `ConfigError`
carries one line for the user. Relative paths resolve against the current working directory.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from adapters import registry
from experiments.cluster.settings import Cluster


class ConfigError(ValueError):
    """A config problem, worded as one line for the user."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


NAME = r"^[A-Za-z0-9_.-]+$"  # run and cell names: they become folder names
IntOrRange = int | tuple[int, int]  # fixed length, or inclusive uniform range [lo, hi]


def _check_len(v: IntOrRange, what: str) -> IntOrRange:
    lo, hi = (v, v) if isinstance(v, int) else v
    if lo < 1 or hi < lo:
        raise ValueError(f"{what} must be >= 1 (a range must be [lo, hi] with 1 <= lo <= hi), got {v}")
    return v


class MakeModel(_Strict):
    """How to make the model when its folder is missing (`inferlab make-model`). `cycle`: a model
    whose greedy output walks cycles of that many tokens (repetitive text, for speculation);
    `draft_layers`: also write `<model>-draft`, the model's first layers, as a draft model."""

    preset: str = "tiny"
    family: str = "llama"
    seed: int = 0
    cycle: int | None = Field(None, ge=2)
    draft_layers: int | None = Field(None, ge=1)


REAL_TEXT = ("chat", "summarize", "multi_turn_chat", "code")  # workload kinds built from real text


class Workload(_Strict):
    """What is sent. `kind` picks the generator; lengths are in tokens."""

    kind: Literal["random", "shared_prefix", "sharegpt", "multi_turn", "repetitive",
                  "chat", "summarize", "multi_turn_chat", "code"] = "random"
    num_requests: int = Field(16, ge=1)
    input_len: IntOrRange = 64
    output_len: IntOrRange = 32
    seed: int = 0
    # shared_prefix: num_prefixes groups x (num_requests / num_prefixes) suffixes of input_len
    num_prefixes: int = Field(4, ge=1)
    prefix_len: int = Field(32, ge=1)
    # sharegpt: a ShareGPT-format JSON file; output length from the answer unless fixed_output
    path: str | None = None
    fixed_output: bool = True
    max_input_len: int = Field(1024, ge=1)
    # multi_turn: num_requests conversations of `turns` turns; each turn adds input_len user tokens
    turns: int = Field(3, ge=1)
    # repetitive: a passage of `period` tokens repeated up to input_len, `edit_rate` of each copy changed
    period: int = Field(64, ge=1)
    edit_rate: float = Field(0.02, ge=0, le=1)
    # real text (experiments/workload/realtext.py: chat, summarize, multi_turn_chat, code), from the standard
    # library. template: "harness" applies the model's chat template here and sends the same token ids
    # to every engine; "engine" sends `messages` to each engine's own /v1/chat/completions (its
    # templating path is measured too); "none" sends the raw text, no template (e.g. plain code completion)
    template: Literal["harness", "engine", "none"] = "harness"

    @field_validator("input_len", "output_len")
    @classmethod
    def _lens(cls, v: IntOrRange, info: Any) -> IntOrRange:
        return _check_len(v, info.field_name)

    @model_validator(mode="after")
    def _kind_needs(self) -> "Workload":
        if self.kind == "sharegpt" and not self.path:
            raise ValueError("workload.kind = 'sharegpt' needs workload.path (a ShareGPT JSON file)")
        if self.kind == "sharegpt" and not Path(self.path).is_file():
            raise ValueError(f"workload.path {self.path!r} is not a file")
        if self.template != "harness" and self.kind not in REAL_TEXT:
            raise ValueError(f"workload.template = {self.template!r} needs a real-text kind "
                             f"({', '.join(REAL_TEXT)}); kind {self.kind!r} sends token ids")
        return self


class Search(_Strict):
    """`load.mode = "search"`: the highest open-loop rate at which at least `goodput` of the
    requests meet every SLO, found by doubling from `start_rate` until a level fails, then
    bisecting; at most `max_levels` levels per engine (and repeat).

    A level at rate r sends max(workload.num_requests, ceil(r * level_s)) requests (conversations
    for multi-turn kinds), fresh ones of the workload's kind past num_requests: arrivals for at least
    `level_s` seconds, so a rate the engine cannot sustain builds a queue that fails it. With
    level_s = 0 a level is the workload's requests alone, and at high rates that is a burst the
    engine may absorb (the rate found can then be several times the sustained one)."""

    start_rate: float = Field(1.0, gt=0)
    max_levels: int = Field(8, ge=2, le=30)
    goodput: float = Field(0.95, gt=0, le=1)
    level_s: float = Field(30.0, ge=0)


class Sweep(_Strict):
    """`load.mode = "sweep"`: closed loop from concurrency `start`, doubling, each level sustained for at least
    `level_s` seconds on fresh requests (none repeated, so no level gets free prefix-cache hits), until the
    engine saturates (experiments/running/sweep.py, `stop_reason`):
    - output throughput grows by less than `min_gain` over a doubling while TPOT p50 rises;
    - the engine's own counters show preemption, or more than `max_queue_share` of its request time queued;
    - TTFT p99 passes `max_ttft_p99_ms`, or the next level would pass `max_concurrency`.
    Then up to `refine` extra levels at geometric midpoints: between the last two levels, and between
    adjacent levels whose throughputs differ by more than `refine_ratio`. A level whose client sent late
    (send time against due time, p99) by more than `client_lateness_ms` is flagged client-bound, and a sweep
    that stops on one says so."""

    start: int = Field(1, ge=1)
    max_concurrency: int = Field(256, ge=1)
    level_s: float = Field(30.0, ge=0)
    min_gain: float = Field(0.10, ge=0)
    max_queue_share: float = Field(0.10, gt=0, le=1)
    max_ttft_p99_ms: float | None = Field(None, gt=0)
    refine: int = Field(2, ge=0, le=10)
    refine_ratio: float = Field(1.5, gt=1)
    client_lateness_ms: float = Field(25.0, gt=0)


class Load(_Strict):
    """How it is sent. Closed loop: at most `concurrency` in flight. Open loop: arrivals at `rate` req/s (Poisson
    when burstiness = 1, gamma otherwise; "inf" sends all at once), at most `max_concurrency` in flight when set
    (an arrival then waits for a slot). A list sweeps; each level reruns the same requests after its own warm-up.
    Search: open loop at rates the search picks (see `Search`). Sweep: closed loop at concurrencies the sweep
    picks, until saturation (see `Sweep`)."""

    mode: Literal["closed", "open", "search", "sweep"] = "closed"
    clients: int | None = Field(None, ge=1, le=64)  # open-loop levels sent by K client processes (--cluster only)
    concurrency: list[int] = [1]
    rate: list[float] = [math.inf]
    burstiness: float = Field(1.0, gt=0)
    # open loop, finite rates: at most this many in flight; an arrival waits for a free slot (vllm
    # bench serve's --max-concurrency). rate = "inf" stays everything at once. None: no cap.
    max_concurrency: int | None = Field(None, ge=1)
    warmup: int = Field(2, ge=0)
    seed: int = 0
    timeout_s: float = Field(600.0, gt=0)  # per request: a stuck engine fails the run instead of hanging it
    search: Search = Search()
    sweep: Sweep = Sweep()

    @field_validator("concurrency", "rate", mode="before")
    @classmethod
    def _listify(cls, v: Any) -> Any:
        v = v if isinstance(v, list) else [v]
        return [math.inf if x in ("inf", "Infinity") else x for x in v]

    @field_validator("concurrency")
    @classmethod
    def _conc(cls, v: list[int]) -> list[int]:
        if not v or any(c < 1 for c in v):
            raise ValueError("load.concurrency must be a non-empty list of integers >= 1")
        return v

    @field_validator("rate")
    @classmethod
    def _rate(cls, v: list[float]) -> list[float]:
        if not v or any(not r > 0 for r in v):
            raise ValueError('load.rate must be a non-empty list of numbers > 0 (or "inf")')
        return v

    def levels(self) -> list[tuple[str, float]]:
        """(name, value) per sweep level, e.g. ("concurrency", 4) or ("rate", inf). A search
        picks its levels as it goes (experiments/running/search.py), as does a sweep: none are known in advance."""
        if self.mode in ("search", "sweep"):
            return []
        return [("concurrency", c) for c in self.concurrency] if self.mode == "closed" else [("rate", r) for r in self.rate]

    def most_streams(self, requests: int) -> int:
        """The most requests in flight at once (of `requests` a level): for engines sized for it at launch."""
        if self.mode in ("closed", "sweep"):
            return self.sweep.max_concurrency if self.mode == "sweep" else min(max(self.concurrency), requests)
        return self.max_concurrency or requests


class Sampling(_Strict):
    temperature: float = Field(0.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = -1
    min_p: float = Field(0.0, ge=0, le=1)
    seed: int | None = None
    ignore_eos: bool = True
    stop: list[str] = []


class SLO(_Strict):
    """Goodput counts requests meeting every SLO set here (milliseconds)."""

    ttft_ms: float | None = Field(None, gt=0)
    tpot_ms: float | None = Field(None, gt=0)
    e2el_ms: float | None = Field(None, gt=0)


class Observer(_Strict):
    """What the harness asks the engine besides the workload. By default nothing during a measured level: the
    engine's gauges and its own latency histograms are read just before and just after each level. `timeline_s`
    samples the gauges during levels at that period (a timeline perturbs the engine it watches; flagged)."""

    timeline_s: float | None = Field(None, gt=0)
    server_view: bool = True  # scrape the engine's /metrics before and after each level


class Parallel(_Strict):
    """`[parallel]`: devices per engine as tensor x pipeline x data (replicas). Every adapter maps it
    to its engine's own flags or refuses in one line what its engine cannot do (adapters/common/parallel.py)."""

    tensor: int = Field(1, ge=1)
    pipeline: int = Field(1, ge=1)
    data: int = Field(1, ge=1)


class Frontier(_Strict):
    """`[frontier]`: each engine's throughput per device against interactivity (output tok/s per user, 1000 /
    TPOT p50) over every cell and level, read at `interactivity` targets (tok/s per user), with cost at
    `price_per_device_hour` (dollars for one device, a GPU or a core, for an hour). A config gives either
    this price or the machine's `cost_per_hour`, never both: the report divides the machine's price over its
    devices when only that is given, so a price is never counted twice."""

    interactivity: list[float] = []
    price_per_device_hour: float | None = Field(None, gt=0)

    @field_validator("interactivity")
    @classmethod
    def _targets(cls, v: list[float]) -> list[float]:
        if any(not x > 0 for x in v):
            raise ValueError("frontier.interactivity: targets are tok/s per user, each > 0")
        return sorted(v)


class KV(_Strict):
    tokens: int | None = Field(None, ge=1)  # the pinned KV budget, passed as option kv_cache_tokens


class Config(_Strict):
    name: str = Field(pattern=NAME)
    model: str
    make_model: MakeModel | None = None
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    engine: str | None = None
    engines: list[str] | None = None
    optional_engines: list[str] = []  # run when installed; skipped with a note when unavailable
    engine_options: dict[str, dict[str, Any]] = {}
    # In-process adapters (HF, reference with mode = "in_process") always run in a process of
    # their own (experiments/running/isolate.py), so the client never shares their interpreter lock;
    # `same_interpreter` opts an engine out (offline throughput only; the report flags it).
    # `isolate` moves any other adapter into a child process too.
    isolate: list[str] = []
    same_interpreter: list[str] = []
    workload: Workload = Workload()
    load: Load = Load()
    sampling: Sampling = Sampling()
    slo: SLO = SLO()
    kv: KV = KV()
    parallel: Parallel | None = None  # None: each engine's default (one device)
    # one longest sequence for every engine (experiments/workload/context.py); default: the workload's longest
    # request rounded up to the engines' largest block size, capped by the model's context
    max_model_len: int | None = Field(None, ge=1)
    observer: Observer = Observer()
    # Each engine runs `repeats` times, interleaved (A B A B ...) so drift hits every engine
    # alike; tables show the median over repeats with a 95 % interval.
    repeats: int = Field(1, ge=1, le=50)
    cost_per_hour: float | None = Field(None, gt=0)  # the machine's price: cost per million output tokens
    frontier: Frontier = Frontier()
    cluster: Cluster = Cluster()  # a Ray cluster's address and what each (cell, engine) task asks for
    seed: int = 0
    # A matrix: each cell is a table of overrides of the keys above (model, dtype, load, ...), merged into this
    # config; `inferlab run` runs every cell into results/<name>/<cell name>/ and writes one report comparing the
    # engines across cells (experiments/report/matrix.py).
    cells: list[dict[str, Any]] = []

    @model_validator(mode="after")
    def _engines(self) -> "Config":
        if self.engine and self.engines:
            raise ValueError("set either engine = \"...\" or engines = [...], not both")
        names = self.engine_list() + ([] if self.engine else self.optional_engines)
        if not names:
            raise ValueError('no engine: set engine = "reference" or engines = ["reference", "hf"]')
        for n in names + list(self.engine_options) + self.isolate + self.same_interpreter:
            if self.adapter(n) not in registry.names():
                raise ValueError(f"unknown engine {self.adapter(n)!r}; known engines: {', '.join(registry.names())} "
                                 f"(a variant names its engine: [engine_options.{n}] adapter = \"vllm\")")
        if set(self.isolate) & set(self.same_interpreter):
            raise ValueError("an engine cannot be in both isolate and same_interpreter")
        if len(set(names)) != len(names):
            raise ValueError(f"engine listed twice in {names}")
        if self.cost_per_hour is not None and self.frontier.price_per_device_hour is not None:
            raise ValueError("set cost_per_hour (the machine) or frontier.price_per_device_hour (one device), not both: "
                             "the report derives one from the other, and a price given twice would count twice")
        if self.load.mode == "search" and not any(v is not None for v in self.slo.model_dump().values()):
            raise ValueError('load.mode = "search" needs at least one SLO ([slo] ttft_ms, tpot_ms or e2el_ms)')
        if self.make_model is None and not Path(self.model).is_dir() and not self.cells:
            raise ValueError(f"model directory {self.model!r} does not exist (set make_model = {{...}} to create it)")
        names = [c.get("name") for c in self.cells]
        for i, c in enumerate(self.cells):
            if not isinstance(c.get("name"), str) or not re.fullmatch(NAME, c["name"]):
                raise ValueError(f"cells[{i}] needs a name of letters, digits, '_', '.' or '-'")
            if "cells" in c:
                raise ValueError(f"cells[{i}] ({c['name']}): a cell cannot hold cells")
            if names.count(c["name"]) > 1:
                raise ValueError(f"cell name {c['name']!r} used twice")
        return self

    @model_validator(mode="after")
    def _eos_for_real_text(self) -> "Config":
        # a real model answering real text stops at EOS: unless [sampling] ignore_eos is set, it is
        # false for the real-text kinds (the report counts requests ended at EOS vs at max tokens)
        if self.workload.kind in REAL_TEXT and "ignore_eos" not in self.sampling.model_fields_set:
            self.sampling.ignore_eos = False
        return self

    def cell_configs(self) -> list["Config"]:
        """The matrix's cells as whole configs (tables merged key by key, lists and values replaced),
        each named after its cell; [] for a plain config. Raises ValueError naming the bad cell."""
        base = self.model_dump(mode="python", exclude={"cells"})
        out = []
        for i, c in enumerate(self.cells):
            try:
                out.append(Config.model_validate(_merge(base, c)))
            except ValidationError as e:
                raise ValueError(f"cells[{i}] ({c['name']}): {_one_line(e)}") from None
        return out

    def adapter(self, name: str) -> str:
        """The registered engine behind a config name: itself, or a variant's `adapter` option
        (e.g. engines = ["vllm", "vllm-nocache"] with [engine_options.vllm-nocache] adapter = "vllm")."""
        return str(self.engine_options.get(name, {}).get("adapter", name))

    def engine_list(self) -> list[str]:
        """The required engines: `engine`, else `engines` (optional ones not included)."""
        return [self.engine] if self.engine else list(self.engines or [])

    def all_engines(self) -> list[str]:
        return self.engine_list() + ([] if self.engine else [e for e in self.optional_engines
                                                             if e not in self.engine_list()])

    def digest(self) -> str:
        """Hash of the validated config (what was run), for the manifest."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`base` with `over` laid on top: tables merged key by key, anything else replaced."""
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _one_line(err: ValidationError) -> str:
    e = err.errors()[0]
    loc = ".".join(str(p) for p in e["loc"])
    msg = e["msg"].removeprefix("Value error, ")
    if e["type"] == "extra_forbidden":
        msg = "unknown key"
    more = f" (+{len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
    return f"{loc}: {msg}{more}" if loc else f"{msg}{more}"


def load(path: str | Path, engine: str | None = None) -> Config:
    """Read and validate `path`; `engine` overrides the config's engine list with one engine."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} not found")
    try:
        raw = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: invalid TOML: {e}") from None
    if engine is not None:
        raw.pop("engines", None)
        raw.pop("optional_engines", None)
        raw["engine"] = engine
    try:
        cfg = Config.model_validate(raw)
        cfg.cell_configs()  # every cell must validate too: a bad cell fails before anything runs
    except ValidationError as e:
        raise ConfigError(f"{p}: {_one_line(e)}") from None
    except ValueError as e:
        raise ConfigError(f"{p}: {e}") from None
    return cfg
