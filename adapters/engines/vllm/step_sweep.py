"""Step times of vLLM-CPU for the step-time model, timed from outside (vLLM's steps cannot be timed
without patching it): offline `vllm.LLM.generate` on controlled batches. Runs in vLLM's own
interpreter and imports nothing of this project:

    .venv-vllm/bin/python adapters/engines/vllm/step_sweep.py MODEL OUT.json [--enforce-eager]

(the vLLM spec's `step_timer`: `make simulate-bench` runs it as its peer-sweep phase)

- decode: B equal prompts of P tokens (ignore_eos), generated to N1 and to N2 tokens; the extra
  N2 - N1 steps are decode steps of B sequences, so one step is (T(N2) - T(N1)) / (N2 - N1), at
  the mean context P + (N1 + N2) / 2;
- prefill: B prompts of P tokens to 1 token (B x P within the token budget): one step, T(1).
Each point is the median of 3 timed calls after one untimed warm-up call. OUT.json holds the steps
in sweep.dump's format ([[[new, context, rows], ...], seconds] per step, a decode point as one step
of B sequences) and vLLM's settings as it read them back (block size, token budget, max sequences,
KV blocks): `inferlab simulate --calibrate-from OUT.json` fits them, `--settings-from OUT.json`
replays with them.
"""
from __future__ import annotations

import json
import random
import statistics
import sys
import time

DECODE = [(b, 128) for b in (1, 2, 4, 8, 12, 16)] + [(4, 512)]
PREFILL = [(1, 32), (1, 128), (1, 512), (4, 128), (8, 128), (2, 1000)]
N1, N2 = 4, 36


def main(argv: list[str]) -> int:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    model, out = argv[0], argv[1]
    c = json.load(open(f"{model}/config.json"))
    heads = c["num_attention_heads"]
    per_token = 2 * c["num_hidden_layers"] * c.get("num_key_value_heads", heads) * (
        c.get("head_dim") or c["hidden_size"] // heads) * 4  # fp32 K and V
    # room for one max-length sequence (8,192) and a margin: vLLM 0.32 checks the model's max length
    # against what the blocks hold after its own rounding (8,192 tokens' bytes estimate 8,064)
    llm = LLM(model=model, dtype="float32", enforce_eager="--enforce-eager" in argv, seed=0,
              kv_cache_memory_bytes=(8192 + 512) * per_token, enable_prefix_caching=False)
    cfg = llm.llm_engine.vllm_config
    settings = {"block_size": cfg.cache_config.block_size, "max_num_seqs": cfg.scheduler_config.max_num_seqs,
                "max_num_batched_tokens": cfg.scheduler_config.max_num_batched_tokens,
                "max_model_len": cfg.model_config.max_model_len,
                "enable_chunked_prefill": bool(cfg.scheduler_config.enable_chunked_prefill),
                "enforce_eager": cfg.model_config.enforce_eager}
    rng = random.Random(0)

    def timed(b: int, p: int, n: int) -> float:
        prompts = [TokensPrompt(prompt_token_ids=[rng.randrange(3, 30000) for _ in range(p)]) for _ in range(b)]
        sp = SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0)
        llm.generate(prompts, sp, use_tqdm=False)  # warm-up: compiled shapes, allocations
        ts = []
        for _ in range(3):
            t = time.perf_counter()
            llm.generate(prompts, sp, use_tqdm=False)
            ts.append(time.perf_counter() - t)
        return statistics.median(ts)

    steps = []
    for b, p in DECODE:
        dt = (timed(b, p, N2) - timed(b, p, N1)) / (N2 - N1)
        steps.append([[[1, p + (N1 + N2) // 2, 1]] * b, dt])
    for b, p in PREFILL:
        steps.append([[[p, p, 1]] * b, timed(b, p, 1)])
    json.dump({"engine": "vllm", "version": __import__("vllm").__version__, "settings": settings, "steps": steps},
              open(out, "w"), indent=1)
    print(f"vllm sweep: {len(steps)} steps, settings {settings} -> {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
