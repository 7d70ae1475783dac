"""Runs vLLM 0.32.0's own sampler on cases from test_sampler_vs_vllm.py; run by `.venv-vllm/bin/python`.

argv: cases.json cases.npz out.npz. For each case it builds what vLLM's InputBatch would (a
`SamplingMetadata` from real `vllm.SamplingParams`, the min-p and min-tokens logits processors fed
through `BatchUpdate`) and calls `Sampler.forward` unchanged, with one substitution: the final
top-k/top-p *draw* is replaced by a probe that calls vLLM's `apply_top_k_top_p` and records the
distribution it would draw from (the draw itself is random and platform-specific). Everything
before it — float32 cast, min-tokens ban, penalties, greedy argmax, temperature, min-p — is
vLLM's code in vLLM's order. Exit code 3 with a message when the version or an import moved.
"""
import json
import sys
from types import SimpleNamespace

PINNED = "0.32.0"

try:
    import numpy as np
    import torch
    import vllm

    if vllm.__version__ != PINNED:
        raise ImportError(f"vLLM is {vllm.__version__}, this probe is written against {PINNED}")
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.logits_processor.builtin import MinPLogitsProcessor, MinTokensLogitsProcessor
    from vllm.v1.sample.logits_processor.interface import BatchUpdate
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p
    from vllm.v1.sample.sampler import Sampler
except ImportError as err:  # noqa: BLE001
    print(f"VLLM-MOVED: {err}", file=sys.stderr)
    sys.exit(3)


class Probe(torch.nn.Module):
    """Stands in for TopKTopPSampler: vLLM's masking, then record softmax instead of drawing."""

    def __init__(self):
        super().__init__()
        self.probs = None

    def forward(self, logits, generators, k, p):
        x = apply_top_k_top_p(logits, k, p)
        self.probs = x.softmax(dim=-1, dtype=torch.float32)
        return x.argmax(-1), None


def metadata(rows, vocab, eos):
    n = len(rows)
    params = []
    for r in rows:
        sp = SamplingParams(temperature=r["temperature"], top_k=r["top_k"], top_p=r["top_p"], min_p=r["min_p"],
                            repetition_penalty=r["repetition_penalty"], presence_penalty=r["presence_penalty"],
                            frequency_penalty=r["frequency_penalty"], min_tokens=r["min_tokens"],
                            stop_token_ids=r["stop_token_ids"], max_tokens=64)
        sp.update_from_generation_config({}, eos)  # what the engine does: EOS joins the stop ids
        params.append(sp)
    greedy = [sp.temperature < 1e-5 for sp in params]  # SamplingType.GREEDY
    temp = torch.tensor([0.0 if g else sp.temperature for g, sp in zip(greedy, params)], dtype=torch.float32)
    top_k = torch.tensor([sp.top_k if 0 < sp.top_k < vocab else vocab for sp in params], dtype=torch.int32)
    top_p = torch.tensor([sp.top_p for sp in params], dtype=torch.float32)
    longest = max(len(r["prompt"]) for r in rows)
    prompt = torch.tensor([r["prompt"] + [vocab] * (longest - len(r["prompt"])) for r in rows], dtype=torch.int64)
    cfg = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=n))
    cpu = torch.device("cpu")
    procs = [MinPLogitsProcessor(cfg, cpu, False), MinTokensLogitsProcessor(cfg, cpu, False)]
    update = BatchUpdate(batch_size=n, removed=[], moved=[],
                         added=[(i, sp, r["prompt"], r["output"]) for i, (sp, r) in enumerate(zip(params, rows))])
    for proc in procs:
        proc.update_state(update)
    pen = lambda name: torch.tensor([getattr(sp, name) for sp in params], dtype=torch.float32)  # noqa: E731
    return SamplingMetadata(
        temperature=None if all(greedy) else temp, all_greedy=all(greedy), all_random=not any(greedy),
        top_p=None if all(sp.top_p >= 1 for sp in params) else top_p,
        top_k=None if all(not 0 < sp.top_k < vocab for sp in params) else top_k,
        generators={}, max_num_logprobs=None,
        no_penalties=all(sp.repetition_penalty == 1 and sp.presence_penalty == 0 and sp.frequency_penalty == 0
                         for sp in params),
        prompt_token_ids=prompt, frequency_penalties=pen("frequency_penalty"),
        presence_penalties=pen("presence_penalty"), repetition_penalties=pen("repetition_penalty"),
        output_token_ids=[r["output"] for r in rows], allowed_token_ids_mask=None, bad_words_token_ids={},
        logitsprocs=LogitsProcessors(procs),
    ), greedy


def main(cases_json, cases_npz, out_npz):
    cases = json.load(open(cases_json))
    arrays = np.load(cases_npz)
    out = {}
    for i, case in enumerate(cases):
        logits = torch.from_numpy(arrays[f"logits{i}"])
        if case["bf16"]:
            logits = logits.to(torch.bfloat16)  # exact: the values were bf16 to begin with
        md, greedy = metadata(case["rows"], logits.shape[-1], case["eos"])
        sampler = Sampler()
        sampler.topk_topp_sampler = Probe()
        sampled = sampler(logits.clone(), md).sampled_token_ids[:, 0]
        probs = sampler.topk_topp_sampler.probs
        out[f"probs{i}"] = (probs if probs is not None else torch.zeros(logits.shape)).numpy()
        out[f"greedy{i}"] = np.array([int(t) if g else -1 for t, g in zip(sampled.tolist(), greedy)])
        out[f"logprobs{i}"] = Sampler.compute_logprobs(logits).numpy()  # raw logprobs (vLLM's default mode)
    np.savez(out_npz, **out)
    print(f"ok {len(cases)} cases, vLLM {vllm.__version__}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
