"""Real model shapes on the GPU, part of check.py: Qwen3-0.6B and Llama-3.1-8B as configs only
(random bf16 weights made on the GPU by both engines; nothing downloaded).

Per shape:
- decode step time at batch 1 / 8 / 64 / 256, with CUDA graphs and eagerly, against the HBM roofline:
  bytes read per step (weights + the batch's KV) / device-to-device copy bandwidth measured in this run;
- prefill tokens/s (each batch's 256-token prompts, in chunks of max_num_batched_tokens);
- output tokens/s against HF transformers `generate()` on the same shape and workload;
- the engine's memory report (weights, KV, activations, graph pool, device), checked against the
  model's shape.
"""
from __future__ import annotations

import json
import time

import torch

import common
from common import (Report, count_replays, free_memory, gib, hf_from_config, hf_generate_tok_s, median,
                              prompts_for, timed)
from reference_engine import LLM, SamplingParams
from reference_engine.worker.cuda_graphs import no_graphs
from reference_engine.tokenizer.make import write_tokenizer

SHAPES = {  # the published config.json values that shape the compute
    "Qwen3-0.6B": dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=151936, hidden_size=1024,
                       intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
                       tie_word_embeddings=True, attention_bias=False, use_sliding_window=False, sliding_window=None,
                       max_window_layers=28, hidden_act="silu", bos_token_id=151643, eos_token_id=151645),
    "Llama-3.1-8B": dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=128256, hidden_size=4096,
                         intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                         head_dim=128, max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
                         rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 8192, "rope_type": "llama3"},
                         tie_word_embeddings=False, attention_bias=False, mlp_bias=False, hidden_act="silu",
                         bos_token_id=128000, eos_token_id=128001),
}
BATCHES = (1, 8, 64, 256)
PROMPT, OUT, STEPS, HF_BATCH = 256, 128, 20, 64  # prompt, output tokens and batch of the HF comparison; steps


def shrink() -> None:
    """--smoke: the same code on CPU, at toy sizes."""
    global BATCHES, PROMPT, OUT, STEPS, HF_BATCH
    BATCHES, PROMPT, OUT, STEPS, HF_BATCH = (1, 4), 16, 8, 4, 4
    for cfg in SHAPES.values():
        cfg.update(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=32, vocab_size=4096, max_window_layers=2)


def write_shape(root, name: str):
    d = root / name
    d.mkdir(parents=True)
    cfg = {**SHAPES[name], "torch_dtype": "bfloat16", "dtype": "bfloat16", "initializer_range": 0.02,
           "attention_dropout": 0.0, "use_cache": True, "pad_token_id": 0}
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
    write_tokenizer(d, 2048, add_bos=False, max_len=4096)  # ids above its vocabulary decode to nothing
    return d


def expected_weight_bytes(cfg: dict, max_model_len: int, elem: int = 2) -> int:
    """Parameters (bf16) + the RoPE cos/sin tables (fp32, max_model_len rows), from the config alone."""
    h, i, v, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    q, kv, d = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"], cfg["head_dim"]
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * i + 2 * h + (2 * d if cfg["model_type"] == "qwen3" else 0)
    params = layers * per_layer + h + v * h * (1 if cfg["tie_word_embeddings"] else 2)
    return elem * params + 2 * 4 * max_model_len * d


def copy_bandwidth(nbytes: int = 1 << 30, iters: int = 20) -> float:
    """Device-to-device copy bandwidth, bytes read + written per second."""
    if common.SMOKE:
        nbytes = 1 << 24
    src = torch.empty(nbytes, dtype=torch.uint8, device=common.DEVICE)
    dst = torch.empty_like(src)
    dst.copy_(src)
    dt = timed(lambda: [dst.copy_(src) for _ in range(iters)])
    del src, dst
    return 2 * nbytes * iters / dt


def weights_read(runner) -> int:
    """Bytes of weights one decode step reads: every parameter, except the embedding table when it is
    not also the LM head (a step reads only its rows)."""
    model = runner.model
    total = sum(p.nbytes for p in {p.data_ptr(): p for p in model.parameters()}.values())
    if model.lm_head.weight is not model.model.embed_tokens.weight:
        total -= model.model.embed_tokens.weight.nbytes
    return total


def measure_batch(e, batch: int, prompts, bw: float) -> dict:
    runner = e.runner
    run, times = runner.run, []

    def timed_run(*a, **k):
        t = time.perf_counter()
        out = run(*a, **k)
        times.append(time.perf_counter() - t)
        return out

    runner.run = timed_run
    params = SamplingParams(max_tokens=2 * STEPS + 10, temperature=0.0, ignore_eos=True)
    rids = [e.add_request(p, params) for p in prompts[:batch]]
    reqs = [e.requests[r] for r in rids]
    t0 = time.perf_counter()
    while not all(r.output_token_ids for r in reqs):
        e.step()
    prefill = time.perf_counter() - t0
    res = {"prefill_tok_s": batch * PROMPT / prefill}
    for mode in ("graphs", "eager"):
        with (no_graphs(runner.graphs) if mode == "eager" else _null()):
            e.step()
            e.step()  # warm
            ctx = sum(r.num_tokens for r in reqs)
            steps, times[:] = [], []
            for _ in range(STEPS // 2):
                t = time.perf_counter()
                e.step()
                steps.append(time.perf_counter() - t)
            ctx = (ctx + sum(r.num_tokens for r in reqs)) / 2
        res[f"{mode}_ms"] = median(steps) * 1e3
        res[f"{mode}_runner_ms"] = median(times) * 1e3
        roof = (weights_read(runner) + ctx * runner.kv_bytes_per_token) / bw
        res[f"{mode}_roof"] = roof * 1e3
    for r in rids:
        e.abort(r)
    runner.run = run
    return res


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def check_shape(rep: Report, root, name: str, bw: float) -> dict:
    rep.section(f"{name} shape (random bf16 weights made on the GPU)")
    d = write_shape(root, name)
    cfg = SHAPES[name]
    prompts = prompts_for(min(cfg["vocab_size"], 100_000), max(BATCHES), PROMPT, PROMPT + 1, seed=3)
    cuda = common.DEVICE == "cuda"
    kw = dict(gpu_memory_utilization=0.5) if name.startswith("Qwen3") and cuda else dict(kv_cache_tokens=90_000)
    free_memory()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    # No prefix caching: every batch reuses prompts[:b] and aborted requests leave their blocks cached, so
    # prefill tok/s would be partly cache hits, and the engine would skip prefill work HF does in the comparison.
    llm = LLM(str(d), device=common.DEVICE, dtype="bfloat16", load_format="dummy", max_model_len=1024, max_num_seqs=256,
              max_num_batched_tokens=8192, enable_prefix_caching=False, **kw)
    e = llm.engine
    g = e.runner.graphs
    rep.add(f"Engine up in {time.perf_counter() - t:.1f} s: {e.effective_config()['attention_backend']} attention, "
            f"{len(g.sizes) if g else 0} CUDA graphs captured in {g.capture_s if g else 0:.1f} s, "
            f"KV {e.runner.kv_capacity_tokens:,} tokens ({', '.join(f'{k}={v}' for k, v in kw.items())}). "
            f"Device-to-device copy bandwidth {bw / 1e12:.2f} TB/s (bytes read + written per second).", "")
    if cuda:
        rep.check(g is not None, f"{name}: CUDA graphs captured by default on CUDA")
    seen = count_replays(llm)
    rows, res = [], {}
    for b in BATCHES:
        m = res[b] = measure_batch(e, b, prompts, bw)
        rows.append([b, f"{m['graphs_ms']:.2f}", f"{m['graphs_runner_ms']:.2f}", f"{m['eager_ms']:.2f}",
                     f"{m['eager_ms'] / m['graphs_ms']:.1f}x", f"{m['graphs_roof']:.2f}",
                     f"{100 * m['graphs_roof'] / m['graphs_ms']:.0f} %", f"{m['prefill_tok_s']:,.0f}"])
    if cuda:
        rep.check(len(seen) > 0, f"{name}: decode steps replayed CUDA graphs ({len(seen)} replays)")
    rep.add(f"Decode step (engine.step, median of {STEPS // 2}; runner = forward + sampling) after {PROMPT}-token "
            "prompts; roofline = (weights read + KV read) / copy bandwidth:", "")
    rep.table(["batch", "graphs ms", "runner ms", "eager ms", "graphs speed-up", "roofline ms", "% of roofline",
               "prefill tok/s"], rows)
    params = SamplingParams(max_tokens=OUT, temperature=0.0, ignore_eos=True)
    dt = timed(lambda: llm.generate(prompts[:HF_BATCH], params))
    res["engine_tok_s"] = HF_BATCH * OUT / dt
    hits = e.stats().prefix_cache_hits
    rep.check(hits == 0, f"{name}: no prefix-cache hits ({hits} tokens), so prefill and the HF comparison are uncached")
    mem = e.memory_report()
    expect = expected_weight_bytes(cfg, e.max_model_len)
    rep.add("Memory (GiB), the engine's report (`LLMEngine.memory_report()`):", "")
    keys = ["weights", "kv_allocated", "kv_peak_used", "activation_peak", "graph_pool", "torch_reserved",
            "device_used", "process_used", "device_total"]
    rep.table(keys + ["kv bytes/token"], [[gib(mem[k]) if k in mem else "-" for k in keys]
                                          + [f"{mem['kv_bytes_per_token']:,}"]])
    rep.check(mem["weights"] == expect,
              f"{name}: reported weights {mem['weights']:,} B = the shape's {expect:,} B (params + RoPE tables)")
    held = mem.get("torch_allocated", mem["weights"] + mem["kv_allocated"])  # (no device readings on CPU)
    rep.check(held >= mem["weights"] + mem["kv_allocated"] and 0 < mem["kv_peak_used"] <= mem["kv_allocated"],
              f"{name}: torch holds at least weights + KV; KV peak within the allocation")
    if "gpu_memory_utilization" in kw:
        peak = torch.cuda.max_memory_reserved()
        rep.check(peak <= 0.5 * mem["device_total"],
                  f"{name}: gpu_memory_utilization 0.5 respected (torch peak reserved {gib(peak)} GiB of "
                  f"{gib(mem['device_total'])})")
    del llm, e, g
    free_memory()
    try:  # the engine's numbers above stand even if HF cannot build this architecture
        model = hf_from_config(d, torch.bfloat16)
        res["hf_tok_s"] = hf_generate_tok_s(model, prompts[:HF_BATCH], OUT, cudnn=True)
        res["hf_nocudnn_tok_s"] = hf_generate_tok_s(model, prompts[:HF_BATCH], OUT, cudnn=False)
        del model
    except Exception as err:
        rep.check(False, f"{name}: HF baseline raised {type(err).__name__}: {err}")
        return res
    finally:
        free_memory()
    best = max(res["hf_tok_s"], res["hf_nocudnn_tok_s"])
    rep.add(f"Output tok/s, {HF_BATCH} prompts x {PROMPT} tokens, {OUT} out, greedy: engine {res['engine_tok_s']:,.0f}; "
            f"HF generate {res['hf_tok_s']:,.0f} (default SDPA), {res['hf_nocudnn_tok_s']:,.0f} (no cuDNN SDPA): "
            f"x{res['engine_tok_s'] / best:.1f} the faster HF.", "")
    return res
