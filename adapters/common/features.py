"""The two engine features every adapter takes under one name, so one config line means the
same for every engine (each adapter maps them to its engine's own flag or field, or says in
`EngineInfo.unhonoured` why it cannot):

- `enable_prefix_caching = true | false` (absent: the engine's own default);
- `speculative_config = { method = "ngram" | "draft_model", num_speculative_tokens = k,
  prompt_lookup_min = a, prompt_lookup_max = b, model = DRAFT_DIR }`, vLLM's shape and meaning:
  "ngram" proposes the k tokens that followed an earlier occurrence, in the request's own tokens,
  of its last n tokens (n from prompt_lookup_max down to prompt_lookup_min; both default to 5,
  one given sets the other); "draft_model" runs the model in `model` k times per step.

`gaps()` compares what was asked with what the engine reports it runs (`EngineInfo.effective`
keys prefix_caching and speculative: a dict of the uniform keys, or False for "off").
"""
from __future__ import annotations

from typing import Any

OPTIONS = frozenset({"enable_prefix_caching", "speculative_config"})
SPEC_KEYS = ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "model")
METHODS = ("ngram", "draft_model")


def _positive(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"speculative_config.{what} must be a positive integer, got {value!r}")
    return value


def speculative(engine: str, raw: Any) -> dict[str, Any] | None:
    """The uniform speculative config, checked and completed with vLLM's n-gram defaults
    (ValueError naming the problem); None when not given."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError(f"engine {engine!r}: speculative_config must be a table, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(SPEC_KEYS))
    if unknown:
        raise ValueError(f"engine {engine!r}: speculative_config: unknown key(s) {', '.join(unknown)}; "
                         f"known: {', '.join(SPEC_KEYS)}")
    method = raw.get("method") or ("draft_model" if raw.get("model") else None)
    if method not in METHODS:
        raise ValueError(f"engine {engine!r}: speculative_config.method must be one of {', '.join(METHODS)}, "
                         f"got {method!r}")
    spec: dict[str, Any] = {"method": method,
                            "num_speculative_tokens": _positive(raw.get("num_speculative_tokens"),
                                                                "num_speculative_tokens")}
    if method == "ngram":
        if raw.get("model") is not None:
            raise ValueError(f"engine {engine!r}: speculative_config.model is for method draft_model, not ngram")
        lo, hi = raw.get("prompt_lookup_min"), raw.get("prompt_lookup_max")
        lo = _positive(lo, "prompt_lookup_min") if lo is not None else None
        hi = _positive(hi, "prompt_lookup_max") if hi is not None else None
        lo, hi = (lo or hi or 5), (hi or lo or 5)
        if lo > hi:
            raise ValueError(f"engine {engine!r}: speculative_config: prompt_lookup_min {lo} > prompt_lookup_max {hi}")
        spec.update(prompt_lookup_min=lo, prompt_lookup_max=hi)
    else:
        if not raw.get("model"):
            raise ValueError(f"engine {engine!r}: speculative_config.model (the draft model's folder) is required "
                             f"for method draft_model")
        if raw.get("prompt_lookup_min") is not None or raw.get("prompt_lookup_max") is not None:
            raise ValueError(f"engine {engine!r}: speculative_config.prompt_lookup_* are for method ngram")
        spec["model"] = str(raw["model"])
    return spec


def prefix_caching(engine: str, options: dict[str, Any]) -> bool | None:
    """The `enable_prefix_caching` option (None: not given), checked to be a bool."""
    v = options.get("enable_prefix_caching")
    if v is not None and not isinstance(v, bool):
        raise ValueError(f"engine {engine!r}: enable_prefix_caching must be true or false, got {v!r}")
    return v


def gaps(engine: str, options: dict[str, Any], effective: dict[str, Any]) -> dict[str, str]:
    """`unhonoured` entries for the features asked in `options` that the engine's read-back
    settings do not show (absent from `effective`: the engine does not report it)."""
    out: dict[str, str] = {}
    asked = prefix_caching(engine, options)
    if asked is not None:
        ran = effective.get("prefix_caching")
        if ran is None:
            out["enable_prefix_caching"] = (f"{engine}: enable_prefix_caching={str(asked).lower()} was asked; the "
                                            f"engine does not report whether prefix caching is on")
        elif ran != asked:
            out["enable_prefix_caching"] = (f"{engine}: enable_prefix_caching={str(asked).lower()} was asked; "
                                            f"the engine reports {str(ran).lower()}")
    spec = speculative(engine, options.get("speculative_config"))
    if spec is not None:
        ran = effective.get("speculative")
        want = f"{spec['method']} with {spec['num_speculative_tokens']} tokens"
        if ran is None:
            out["speculative_config"] = f"{engine}: {want} was asked; the engine does not report its speculation"
        elif not ran:
            out["speculative_config"] = f"{engine}: {want} was asked; the engine reports no speculation"
        else:
            diff = [f"{k} {ran.get(k)!r} (asked {v!r})" for k, v in spec.items()
                    if k in ran and ran[k] != v and not (k == "model" and _same_path(ran[k], v))]
            if diff:
                out["speculative_config"] = f"{engine}: the engine reports " + ", ".join(diff)
    return out


def _same_path(a: Any, b: Any) -> bool:
    from pathlib import Path

    return Path(str(a)).resolve() == Path(str(b)).resolve()
