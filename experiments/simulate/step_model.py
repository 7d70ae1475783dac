"""The step-time model: one engine step's duration from roofline terms, each times a fitted
coefficient (issue 40).

Spec-sheet profiles (no `regimes`) sum the terms:

    t = a_w * W/BW + a_kv * KV/BW + a_lin * F/FLOPS + a_att * A/FLOPS + c_seq * B + c_layer * L + c_step

A calibrated profile has one coefficient set per *regime*, the code path the engine's dispatch
table (reference_engine/worker/paths.py) takes for the step's shape: "decode" (every sequence one
query token and at most `fused_max_rows` of them: the one-call C++ layer) or "mixed" (a prefill
chunk in the step, or more decode rows: the module path). In a regime the weight read and the
linear layers' FLOPs overlap (the GEMM streams the weight panels while it multiplies), so they
enter as a max, the rest as a sum:

    t = c_step + max(a_w * W/BW, a_lin * F'/FLOPS) + a_add * F/FLOPS + a_c * Wc/BW + a_kv * KV/BW + a_sh * KVs/BW
        + a_att * A/FLOPS + c_seq * B + c_layer * L

where F' counts the linear rows padded to the GEMM's register tile (`tile_rows`; 1 = no padding), and F the
rows as they are ("linear_add"): the part of each row's multiply the weight stream does not hide. Round 3's sweep
showed it (docs/perf/2026-12-07-heldout-round4.md): with the pair alone, flat from 1 to 12 rows, one-row steps came
out 3-6 % slow and 2-8 rows up to 9-14 % fast on the models past the cache. Wc ("cached") is the weight read of a model whose weights
fit in the profile's `cache_bytes` (half the last-level cache, calibrate.resident_bytes); its W is then 0: a model
read from the cache says nothing about the memory's bandwidth, and fitted in one column with the others, `tiny`
(24 MB) held the per-layer cost at 12 us where the models past the cache say ~0.1 ms. KVs ("kv_shared") is the
KV that a step's sequences read in blocks another of them reads too (a cached prefix several hold), every read after
the first (StepShape.shared); KV is the rest. Round 4's load levels showed why: decode steps of 17-64 rows on 3 shared
prefixes came out 12-24 % slow with every context read whole from memory. A sweep without shared blocks cannot fit
a_sh, and a profile from before it has none: then a_sh = a_kv (`coefficient`), the old prediction.

W: weight bytes read once per step; KV: bytes of every scheduled sequence's context read (sum of
contexts x KV bytes per token); F: the linear layers' FLOPs (2 x layer params x new tokens, plus the
LM head on the rows that sample); A: attention's quadratic FLOPs (4 x layers x heads x head_dim x new
tokens x mean attended context); B: sequences in the step; L: the model's layers. BW and FLOPS are the device
profile's peaks, so each `a_*` is 1 / efficiency (1.0 = at the roofline); `c_seq`, `c_layer` and `c_step` are
seconds. `c_layer` is what a layer costs besides its bytes and FLOPs: the dozen kernel calls of a layer (norms,
RoPE, the KV write, attention, the activation, each a parallel region on CPU, a launch on GPU) and the call into
the layer. Models of one width cannot tell it from the weight read (a layer's bytes are fixed), so it was
invisible until round 1 tested a wider model: 16 layers of 1024 read the same 856 MB 10 % faster than 30 of 768.

Invariant: `predict` is a pure function of (profile, model shape, step shape): the same batch always
costs the same simulated time, on any machine.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

TERMS = ("weights", "cached", "kv", "kv_shared", "linear", "linear_add", "attention", "per_seq", "per_layer",
         "per_step")
OPTIONAL = ("per_layer", "cached", "linear_add", "kv_shared")  # terms a profile written before them may lack: 0
AS_KV = "kv_shared"  # where unfitted (no step of the sweep shared a block), a shared read costs what any KV read does
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1, "int8": 1}


@dataclass(frozen=True)
class ModelShape:
    """What the roofline terms need from a decoder-only transformer."""
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    dtype: str = "float32"  # the weights' (and the matmuls') dtype: picks the profile's FLOPS peak
    kv_dtype: str = "float32"

    @classmethod
    def from_dir(cls, model_dir: str | Path, dtype: str = "float32", kv_dtype: str | None = None) -> "ModelShape":
        c = json.loads((Path(model_dir) / "config.json").read_text())
        heads = c["num_attention_heads"]
        return cls(c["num_hidden_layers"], c["hidden_size"], heads, c.get("num_key_value_heads", heads),
                   c.get("head_dim") or c["hidden_size"] // heads, c["intermediate_size"], c["vocab_size"],
                   dtype, kv_dtype or dtype)

    @property
    def layer_params(self) -> int:
        """Linear-layer parameters of all layers (q, k, v, o and the gated MLP)."""
        h, d = self.hidden, self.head_dim
        attn = h * self.heads * d * 2 + h * self.kv_heads * d * 2
        return self.layers * (attn + 3 * h * self.intermediate)

    @property
    def weight_bytes(self) -> float:
        """Bytes every step reads: the layers and the LM head (embedding rows gathered are negligible)."""
        return (self.layer_params + self.vocab * self.hidden) * DTYPE_BYTES[self.dtype]

    @property
    def signature(self) -> str:
        """The shape as one line (which model a calibration row came from)."""
        return (f"{self.layers} x (hidden {self.hidden}, heads {self.heads}/{self.kv_heads} x {self.head_dim}, "
                f"mlp {self.intermediate}), vocab {self.vocab}, {self.dtype}")

    @property
    def kv_bytes_per_token(self) -> float:
        return 2 * self.layers * self.kv_heads * self.head_dim * DTYPE_BYTES[self.kv_dtype]


@dataclass
class Profile:
    """A device profile: peaks, fitted coefficients and where they came from. `calibrated` False
    means spec-sheet peaks with default efficiencies: every output that uses it says "uncalibrated"."""
    name: str
    bandwidth_gbps: float
    tflops: dict[str, float]  # dense peak per matmul dtype (float32, bfloat16, fp8, ...)
    coef: dict[str, float]
    memory_gb: float | None = None  # device memory (spec profiles: what the KV budget is cut from, gpu.size)
    link_gbps: float | None = None  # GPU-to-GPU link, one direction, GB/s (tensor parallel all-reduces, gpu.py)
    sources: dict = field(default_factory=dict)  # spec number -> datasheet it is read from
    calibrated: bool = False
    machine: str = ""
    engine: str = ""
    version: str = ""
    date: str = ""
    notes: str = ""
    fit: dict = field(default_factory=dict)  # calibration residuals, shapes swept
    regimes: dict[str, dict[str, float]] = field(default_factory=dict)  # {} : sum of `coef` terms
    fused_max_rows: int = 0  # most rows of an all-decode step on the "decode" path (0: no such path)
    tile_rows: int = 1  # the GEMM's rows per register tile (linear FLOPs padded to a multiple)
    served: dict = field(default_factory=dict)  # served overhead terms and their source (served_overhead.py)
    cache_bytes: float = 0  # the last-level cache: a model whose weights fit is read from it ("cached", not "weights")
    anchored: dict = field(default_factory=dict)  # re-timed on the machine's speed since calibration (anchor.py)

    def peak_tflops(self, dtype: str) -> float:
        if dtype not in self.tflops:
            raise ValueError(f"profile {self.name}: no FLOPS peak for {dtype} (has {', '.join(self.tflops)})")
        return self.tflops[dtype]

    @property
    def label(self) -> str:
        if self.anchored:
            return f"{self.name} (calibrated, anchored x{self.anchored['factor']:.3f} at {self.anchored['utc']})"
        return f"{self.name} ({'calibrated' if self.calibrated else 'uncalibrated'})"

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(asdict(self), indent=2) + "\n")
        return p

    @classmethod
    def load(cls, path: str | Path) -> "Profile":
        raw = json.loads(Path(path).read_text())
        for coef in [raw.get("coef", {}), *raw.get("regimes", {}).values()]:
            for k in OPTIONAL:
                coef.setdefault(k, coefficient(coef, k))
        unknown = set(TERMS) ^ set(raw.get("coef", {}))
        if unknown:
            raise ValueError(f"profile {path}: coef must have exactly the terms {', '.join(TERMS)}")
        return cls(**raw)


@dataclass(frozen=True)
class StepShape:
    """One step's batch: per sequence (new tokens, context after the step, rows that sample); `shared`: context tokens
    in KV blocks that another sequence of the step also reads, every read after the first (a cached prefix that
    several hold: StepRecord.shared_kv_tokens)."""
    seqs: tuple[tuple[int, int, int], ...]
    shared: int = 0


def _pad(n: int, tile: int) -> int:
    return -(-n // tile) * tile if n else 0


def features(shape: StepShape, m: ModelShape, prof: Profile, tile_rows: int | None = None) -> dict[str, float]:
    """Each term at the profile's peaks, in seconds (per_seq: sequences; per_step: 1); the linear
    rows padded to `tile_rows` (default: the profile's)."""
    bw, fl = prof.bandwidth_gbps * 1e9, prof.peak_tflops(m.dtype) * 1e12
    tile = tile_rows or prof.tile_rows or 1
    new = ctx = rows = att = 0
    for n, c, r in shape.seqs:
        new += n
        ctx += c
        rows += r
        att += n * (c - (n - 1) / 2)  # causal: query i attends to c - n + i + 1 keys
    w = m.weight_bytes / bw
    cached = m.weight_bytes <= prof.cache_bytes
    shared = min(shape.shared, ctx)
    return {"weights": 0.0 if cached else w, "cached": w if cached else 0.0,
            "kv": (ctx - shared) * m.kv_bytes_per_token / bw, "kv_shared": shared * m.kv_bytes_per_token / bw,
            "linear": 2 * (m.layer_params * _pad(new, tile) + m.vocab * m.hidden * _pad(rows, tile)) / fl,
            "linear_add": 2 * (m.layer_params * new + m.vocab * m.hidden * rows) / fl,
            "attention": 4 * m.layers * m.heads * m.head_dim * att / fl,
            "per_seq": float(len(shape.seqs)), "per_layer": float(m.layers), "per_step": 1.0}


def regime(shape: StepShape, fused_max_rows: int) -> str:
    """The dispatch table's path for the step: "decode" (all one-token sequences, at most
    `fused_max_rows`: the one-call layer) or "mixed" (the modules: prefill chunks, bigger batches)."""
    decode = all(n == 1 for n, _, _ in shape.seqs) and len(shape.seqs) <= fused_max_rows
    return "decode" if decode else "mixed"


def coefficient(coef: dict[str, float], k: str) -> float:
    """A term's coefficient; one a profile lacks is 0, but a shared KV read costs what any KV read does (AS_KV)."""
    return coef.get(k, coef.get("kv", 0.0) if k == AS_KV else 0.0)


def combine(coef: dict[str, float], f: dict[str, float]) -> float:
    """One regime's time: weights and linear overlap (max), the rest add."""
    return (coef["per_step"] * f["per_step"] + max(coef["weights"] * f["weights"], coef["linear"] * f["linear"])
            + coef["kv"] * f["kv"] + coef["attention"] * f["attention"] + coef["per_seq"] * f["per_seq"]
            + sum(coefficient(coef, k) * f[k] for k in OPTIONAL))


def predict(shape: StepShape, m: ModelShape, prof: Profile) -> float:
    """Seconds the step takes under the profile (the engine's compute; a served overhead is the
    replica's, served_overhead.py)."""
    f = features(shape, m, prof)
    if prof.regimes:
        r = regime(shape, prof.fused_max_rows)
        return combine(prof.regimes.get(r) or prof.regimes["mixed"], f)
    return sum(coefficient(prof.coef, k) * f[k] for k in TERMS)


def load_profile(name_or_path: str) -> Profile:
    """A shipped spec-sheet profile by name (h100, h200, a100, l40s) or a profile JSON's path."""
    shipped = Path(__file__).parent / "profiles" / f"{name_or_path.lower()}.json"
    path = shipped if shipped.is_file() else Path(name_or_path)
    if not path.is_file():
        names = sorted(p.stem for p in shipped.parent.glob("*.json"))
        raise ValueError(f"profile {name_or_path!r}: not a file and not one of {', '.join(names)}")
    return Profile.load(path)
