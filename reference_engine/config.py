"""Configuration: the engine's knobs (`EngineConfig`) and the model's shape (`ModelConfig`).

`ModelConfig` is read from an HF `config.json`; only the architectures whose layers
we implement are accepted, and anything else is rejected with a message naming
what is supported.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16", "float": "float32"}


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        if name not in DTYPES.values():
            raise ValueError(f"unsupported dtype {name}; supported: {', '.join(DTYPES)}")
        return name
    key = _DTYPE_ALIASES.get(str(name).lower(), str(name).lower())
    if key not in DTYPES:
        raise ValueError(f"unsupported dtype {name!r}; supported: {', '.join(DTYPES)}")
    return DTYPES[key]


def resolve_dtype(name: str | torch.dtype, checkpoint: str, device: str = "cpu") -> torch.dtype:
    """`name`, with "auto" resolved as vLLM resolves it (vllm/config/model.py `_resolve_auto_dtype` and
    platforms/cpu.py `supported_dtypes` @ v0.32.0): the checkpoint's `torch_dtype`, except that a
    float32 checkpoint is served in bfloat16 (float16 on a GPU without bf16). vLLM does so on every x86
    and Arm CPU; `inferlab serve` defaults to it, so that no-flag servers compare like for like."""
    if str(name).lower() != "auto":
        return parse_dtype(name)
    dtype = DTYPES.get(_DTYPE_ALIASES.get(checkpoint.lower(), checkpoint.lower()), torch.float32)
    if dtype != torch.float32:
        return dtype
    if torch.device(device).type == "cuda" and not torch.cuda.is_bf16_supported():
        return torch.float16
    return torch.bfloat16


DEFAULT_KV_BYTES = 1 << 30
SPEC_METHODS = ("ngram", "draft_model")


@dataclass
class SpeculativeConfig:
    """vLLM's `speculative_config` keys: method ("ngram" | "draft_model"), num_speculative_tokens,
    prompt_lookup_min / prompt_lookup_max (ngram; both default to 5 as in vLLM, one given sets the
    other), model (draft_model: a smaller model directory sharing the target's tokenizer)."""

    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    model: str | None = None

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "SpeculativeConfig":
        if not isinstance(raw, dict):
            raise ValueError(f"speculative_config must be a dict, got {type(raw).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"speculative_config: unknown keys {unknown}; known: {sorted(known)}")
        raw = dict(raw)
        raw.setdefault("method", "draft_model" if raw.get("model") else None)  # vLLM infers it from `model`
        if raw["method"] not in SPEC_METHODS:
            raise ValueError(f"speculative_config.method must be one of {SPEC_METHODS}, got {raw['method']!r}")
        k = raw.get("num_speculative_tokens")
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"speculative_config.num_speculative_tokens must be a positive integer, got {k!r}")
        spec = cls(**raw)
        if spec.method == "ngram":
            lo, hi = spec.prompt_lookup_min, spec.prompt_lookup_max
            spec.prompt_lookup_min = lo if lo is not None else (hi if hi is not None else 5)
            spec.prompt_lookup_max = hi if hi is not None else spec.prompt_lookup_min
            lo, hi = spec.prompt_lookup_min, spec.prompt_lookup_max
            if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
                raise ValueError(f"speculative_config: need 1 <= prompt_lookup_min <= prompt_lookup_max, "
                                 f"got {lo}, {hi}")
            if spec.model is not None:
                raise ValueError("speculative_config.model is for method 'draft_model', not 'ngram'")
        elif not spec.model:
            raise ValueError("speculative_config.model (the draft model's directory) is required for 'draft_model'")
        return spec


LOAD_FORMATS = ("auto", "dummy")
LINEAR_BACKENDS = ("torch", "onednn")


def default_cuda_graph_sizes(limit: int = 256) -> list[int]:
    """vLLM's default capture sizes, [1, 2, 4, 8, 16, 24, ..., 256], cut at `limit`."""
    return [s for s in [1, 2, 4] + list(range(8, 257, 8)) if s <= limit]


@dataclass
class EngineConfig:
    """Engine knobs. KV capacity comes from one of `kv_cache_tokens`, `kv_cache_bytes` (vLLM's
    `kv_cache_memory_bytes`) or `gpu_memory_utilization` (CUDA: the share of the device's total memory
    the engine may use; the KV cache gets what weights, peak activations and CUDA graphs leave, as in
    vLLM); with none, the cache gets `DEFAULT_KV_BYTES`, capped at `max_num_seqs` full contexts.

    `dtype` "auto": the checkpoint's, a float32 one served in bfloat16, as vLLM (`resolve_dtype`).

    This is data: it validates itself and imports no backend. A backend left None is chosen for the
    device by the module that implements it, when the runner resolves the config
    (`worker/backends.with_default_backends`): `attention_backend` "triton" on CUDA (when triton
    imports), "cpu" on CPU (when its C++ kernel builds), else "torch" (`attention/triton_backend.py`);
    `linear_backend` "onednn" on CPU (weights prepacked for oneDNN; bf16 weights are multiplied as
    fp32 where the CPU has no bf16 dot product), else "torch" (`packed_linear.default_backend`);
    `fused_ops` on, on CPU when the kernels build: the one-pass C++ RMSNorm, rotary and
    SiLU-and-multiply (`fused_ops.default_on`).
    CUDA graphs capture decode steps per batch size in `cuda_graph_sizes` (default: vLLM's, up to
    `max_num_seqs`); they are used only on CUDA, with a backend that supports them (triton), and
    `enforce_eager=True` turns them off. `load_format="dummy"` makes random weights on the device
    instead of reading the safetensors files (benchmarks of a model's shape; as vLLM's).
    `tensor_parallel_size` N > 1: N processes, each holding 1/N of the heads and MLP columns
    (`reference_engine/distributed/`); `num_threads` is then per rank (default: cores // N); one such
    engine per process at a time (torch.distributed has one default group)."""

    model: str
    dtype: str = "float32"
    device: str = "cpu"
    block_size: int = 16
    kv_cache_tokens: int | None = None
    kv_cache_bytes: int | None = None
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    enable_chunked_prefill: bool = True
    record_steps: bool = False
    step_log: str | None = None  # a file: each step's shape and wall time appended as a JSON line (step_log.py)
    attention_backend: str | None = None  # None: "triton" on CUDA if it imports, "cpu" on CPU if it builds
    linear_backend: str | None = None  # None: "onednn" on CPU (when torch has oneDNN), else "torch"
    fused_ops: bool | None = None  # None: the C++ element-wise kernels on CPU when they build (fused_ops.py)
    num_threads: int | None = None  # torch intra-op threads; None keeps torch's default (`serve`: cores - 1)
    seed: int = 0
    enable_prefix_caching: bool = True
    speculative_config: dict | None = None  # vLLM's shape: {"method": "ngram", "num_speculative_tokens": 3}
    enforce_eager: bool = False  # no CUDA graphs (they are CUDA-only anyway)
    cuda_graph_sizes: list[int] | None = None  # decode batch sizes captured; None: vLLM's default list
    gpu_memory_utilization: float | None = None  # (0, 1]: KV sized from device memory (CUDA only)
    load_format: str = "auto"  # "auto": the safetensors files; "dummy": random weights, nothing read
    tensor_parallel_size: int = 1  # ranks, one process each (reference_engine/distributed/)

    @property
    def speculative(self) -> SpeculativeConfig | None:
        return SpeculativeConfig.from_dict(self.speculative_config) if self.speculative_config else None

    def __post_init__(self) -> None:
        if str(self.dtype).lower() != "auto":
            parse_dtype(self.dtype)
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        budgets = [n for n in ("kv_cache_tokens", "kv_cache_bytes", "gpu_memory_utilization")
                   if getattr(self, n) is not None]
        if len(budgets) > 1:
            raise ValueError(f"give one KV budget (kv_cache_tokens, kv_cache_bytes or gpu_memory_utilization), "
                             f"not both {' and '.join(budgets)}")
        for name in ("kv_cache_tokens", "kv_cache_bytes", "max_model_len"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if not isinstance(self.enable_prefix_caching, bool):
            raise ValueError(f"enable_prefix_caching must be a bool, got {self.enable_prefix_caching!r}")
        if self.speculative_config is not None:
            SpeculativeConfig.from_dict(self.speculative_config)
        u = self.gpu_memory_utilization
        if u is not None and (isinstance(u, bool) or not isinstance(u, (int, float)) or not 0 < u <= 1):
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {u!r}")
        if u is not None and torch.device(self.device).type != "cuda":
            raise ValueError(f"gpu_memory_utilization needs a CUDA device (device is {self.device!r}); "
                             "give kv_cache_tokens or kv_cache_bytes")
        if not isinstance(self.enforce_eager, bool):
            raise ValueError(f"enforce_eager must be a bool, got {self.enforce_eager!r}")
        sizes = self.cuda_graph_sizes
        if sizes is not None and (not isinstance(sizes, (list, tuple))
                                  or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes)):
            raise ValueError(f"cuda_graph_sizes must be a list of positive integers, got {sizes!r}")
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format must be one of {LOAD_FORMATS}, got {self.load_format!r}")
        if self.fused_ops is not None and not isinstance(self.fused_ops, bool):
            raise ValueError(f"fused_ops must be a bool, got {self.fused_ops!r}")
        if self.fused_ops and torch.device(self.device).type != "cpu":
            raise ValueError(f"fused_ops runs on CPU only (device is {self.device!r})")
        if self.linear_backend is not None and self.linear_backend not in LINEAR_BACKENDS:
            raise ValueError(f"linear_backend must be one of {LINEAR_BACKENDS}, got {self.linear_backend!r}")
        tp = self.tensor_parallel_size
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise ValueError(f"tensor_parallel_size must be a positive integer, got {tp!r}")
        if tp > 1 and self.speculative_config and self.speculative.method == "draft_model":
            raise ValueError("speculative method 'draft_model' is not supported with tensor_parallel_size > 1 "
                             "(the draft model is not sharded); use 'ngram'")
        if self.linear_backend == "onednn" and torch.device(self.device).type != "cpu":
            raise ValueError(f"linear_backend 'onednn' runs on CPU only (device is {self.device!r})")


@dataclass
class ModelConfig:
    """The shape of a decoder-only transformer, as our layers need it."""

    architecture: str
    family: str  # llama | qwen2 | qwen3
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # q/k/v projections carry a bias (Qwen2)
    qk_norm: bool  # RMSNorm on q and k per head before RoPE (Qwen3)
    torch_dtype: str = "float32"
    sliding_window: int | None = None  # Mistral-style; we cap the context at it (full = sliding there)
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)

    def kv_bytes_per_token(self, dtype: torch.dtype) -> int:
        """K and V, every layer, one token, in `dtype`."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * torch.empty((), dtype=dtype).element_size()

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> "ModelConfig":
        if not Path(model_dir).is_dir():
            raise FileNotFoundError(f"model directory not found: {model_dir}")
        try:
            return cls.from_dict(json.loads((Path(model_dir) / "config.json").read_text()))
        except FileNotFoundError:
            raise FileNotFoundError(f"no config.json in model directory {model_dir}") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"malformed config.json in {model_dir}: {e}") from e

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "ModelConfig":
        archs = raw.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ValueError(
                f"unsupported architecture {archs or raw.get('model_type')!r}; "
                f"supported: {', '.join(sorted(SUPPORTED_ARCHITECTURES))}"
            )
        family = SUPPORTED_ARCHITECTURES[arch]
        try:
            hidden, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
            # transformers 5 moved rope settings into `rope_parameters`; 4.x keeps rope_theta/rope_scaling.
            rope = raw.get("rope_parameters") or {}
            scaling = raw.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
            if scaling is not None and scaling.get("rope_type", scaling.get("type", "default")) == "default":
                scaling = None
            eos = raw.get("eos_token_id")
            window = raw.get("sliding_window") if raw.get("use_sliding_window", True) else None
            return cls(
                architecture=arch,
                family=family,
                vocab_size=int(raw["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(raw["intermediate_size"]),
                num_layers=int(raw["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(raw.get("num_key_value_heads") or heads),
                head_dim=int(raw.get("head_dim") or hidden // heads),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                rope_theta=float(raw.get("rope_theta", rope.get("rope_theta", 10000.0))),
                rope_scaling=scaling,
                max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", family != "llama")),
                attention_bias=bool(raw.get("attention_bias", family == "qwen2")),
                qk_norm=family == "qwen3",
                torch_dtype=str(raw.get("torch_dtype") or raw.get("dtype") or "float32"),
                sliding_window=int(window) if window else None,
                bos_token_id=raw.get("bos_token_id"),
                eos_token_ids=[eos] if isinstance(eos, int) else list(eos or []),
            )
        except KeyError as e:
            raise ValueError(f"config.json lacks required field {e.args[0]!r}") from e
