"""One `max_model_len` for every engine of a run, and the check that the pinned KV budget holds it.

Left alone, each engine takes the model's own context (8 k-128 k for real models) as its longest
sequence, and an engine that checks at start that its KV cache holds one such sequence (vLLM,
SGLang's --context-length, TensorRT-LLM's max_seq_len, TGI's --max-total-tokens) refuses a pinned
budget below it, after minutes of start-up. The harness therefore gives every engine the same
length: the workload's longest request (prompt + output) rounded up to the largest block size
among the engines, capped by the model's context, unless the config's `max_model_len` says
otherwise; and it checks the budget against that length before anything starts.
"""
from __future__ import annotations

import math
from typing import Any

from adapters import registry


def block_size(adapter: str, options: dict[str, Any]) -> int | None:
    """This engine's KV block size: its option that sets it, else its spec's default (None: an engine whose KV
    the harness does not size, such as the HF baseline or an attached server)."""
    spec = registry.spec(adapter)
    if spec is None or spec.block_size is None or options.get("url"):
        return None
    key = spec.block_option
    return int(options.get(key) or spec.block_size) if key else spec.block_size


def reserved_blocks(adapter: str) -> int:
    """Blocks the engine keeps out of its pool (its spec's `reserved_blocks`, e.g. vLLM v1's null block)."""
    spec = registry.spec(adapter)
    return spec.reserved_blocks if spec is not None else 0


def longest_request(items) -> int:
    """The longest prompt + output of the workload (warm-up included: it goes through the same engine)."""
    return max((len(it.prompt_token_ids) + it.output_len for it in items), default=1)


def choose(cfg, items, model_context: int | None) -> int:
    """The run's max_model_len: the config's, else the longest request rounded up to the largest block
    size among the engines and capped by the model's context. ValueError (a config error) where the
    workload cannot fit."""
    longest = longest_request(items)
    if cfg.max_model_len is not None:
        if model_context and cfg.max_model_len > model_context:
            raise ValueError(f"max_model_len = {cfg.max_model_len} exceeds the model's context ({model_context} "
                             f"tokens); lower it")
        if cfg.max_model_len < longest:
            raise ValueError(f"max_model_len = {cfg.max_model_len} is below the workload's longest request "
                             f"({longest} tokens, prompt + output); raise it or shorten the workload")
        return cfg.max_model_len
    if model_context and longest > model_context:
        raise ValueError(f"the workload's longest request ({longest} tokens, prompt + output) exceeds the model's "
                         f"context ({model_context} tokens); shorten the workload")
    sizes = [b for n in cfg.all_engines() if (b := block_size(cfg.adapter(n), cfg.engine_options.get(n, {})))]
    step = max(sizes, default=1)
    length = math.ceil(longest / step) * step
    return min(length, model_context) if model_context else length


def kv_needed(adapter: str, block: int, max_model_len: int) -> int:
    """KV tokens an engine needs to hold one sequence of max_model_len: whole blocks, plus reserved ones."""
    return (math.ceil(max_model_len / block) + reserved_blocks(adapter)) * block


def check_kv(cfg, max_model_len: int) -> None:
    """ValueError, one line naming the numbers and the fix, when a pinned KV budget (`[kv] tokens` or an
    engine's own kv_cache_tokens) cannot hold one sequence of max_model_len in that engine's blocks."""
    for name in cfg.all_engines():
        adapter, opts = cfg.adapter(name), cfg.engine_options.get(name, {})
        tokens, block = opts.get("kv_cache_tokens", cfg.kv.tokens), block_size(adapter, opts)
        if tokens is None or block is None:
            continue
        length = int(opts.get("max_model_len") or max_model_len)  # an engine's own option wins (runner)
        need = kv_needed(adapter, block, length)
        if tokens < need:
            reserved = reserved_blocks(adapter)
            extra = f" + {reserved} reserved block" if reserved else ""
            raise ValueError(f"the KV budget of {tokens} tokens cannot hold one sequence of max_model_len "
                             f"{length} in engine {name!r} ({block}-token blocks{extra}: {need} tokens); "
                             f"set [kv] tokens >= {need}, or max_model_len <= "
                             f"{(tokens // block - reserved) * block}")
