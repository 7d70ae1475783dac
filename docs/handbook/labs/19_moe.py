"""Lab 19 — mixture-of-experts serving: routing, tokens per expert, the grouped GEMM, and expert parallelism's traffic.

Smallest working piece: one MoE layer of Qwen1.5-MoE-A2.7B's routing shape (60 experts, top-4, one shared
expert), built by HF transformers from a `Qwen2MoeConfig` with small widths and random weights (made here; nothing
is downloaded): its router scores the 60 experts per token and keeps the top 4, their softmax probabilities as
weights. Then the same layer three ways: HF's own forward, a loop of one small GEMM pair per expert, and a grouped
GEMM (the experts' tokens padded to one length, two `torch.bmm` calls), asserted equal; the arithmetic intensity
each batch gives the expert weights, from the tokens per expert it measured, against a dense layer of the same
active parameters; the grouped GEMM and the loop timed at a decode-sized and a prefill-sized batch, each verdict
computed from the timings; and the all-to-all of expert parallelism, counted from the routing once per device, not
once per expert, then worked for DeepSeek-V3 on 8 H100s.

    python docs/handbook/labs/19_moe.py [--full]
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from transformers import DeepseekV3Config, MixtralConfig, Qwen2MoeConfig, Qwen2MoeForCausalLM

ap = argparse.ArgumentParser()
ap.add_argument("--full", action="store_true", help="a wider layer and more timed passes")
args = ap.parse_args()
E, K = 60, 4  # Qwen1.5-MoE-A2.7B's routing: 60 experts, top-4 (Qwen2MoeConfig's defaults)
H, I, SHARED = (1024, 512, 2048) if args.full else (512, 256, 1024)  # its widths are 2048, 1408 and 5632
REPEATS = 9 if args.full else 5
GROUPED_MM = getattr(F, "grouped_mm", None)  # torch >= 2.10; the lab skips it where absent


# ---- routing --------------------------------------------------------------------------------------------------------
def route(gate_weight: torch.Tensor, x: torch.Tensor, k: int, norm: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The router: softmax over the experts, keep the top k; Mixtral renormalises their probabilities (norm),
    Qwen1.5-MoE keeps them as they are (`norm_topk_prob` False)."""
    probs = torch.softmax(F.linear(x, gate_weight).float(), dim=-1)
    w, idx = torch.topk(probs, k, dim=-1)
    return (w / w.sum(-1, keepdim=True) if norm else w), idx


def per_expert(idx: torch.Tensor, e: int) -> list[int]:
    return torch.bincount(idx.flatten(), minlength=e).tolist()


# ---- the layer, two ways ---------------------------------------------------------------------------------------------
def moe_loop(x, w, idx, gate_up, down) -> torch.Tensor:
    """One GEMM pair per expert that has tokens: gather its tokens, gate_up, SiLU(gate) * up, down, scatter-add
    weighted. gate_up: (E, 2I, H), down: (E, H, I), as HF stores them."""
    out = torch.zeros_like(x)
    for e in range(gate_up.shape[0]):
        tok, slot = torch.where(idx == e)
        if tok.numel() == 0:
            continue
        g, u = F.linear(x[tok], gate_up[e]).chunk(2, dim=-1)
        out.index_add_(0, tok, F.linear(F.silu(g) * u, down[e]) * w[tok, slot, None])
    return out


def sort_by_expert(idx: torch.Tensor, n_exp: int):
    """The (token, expert) pairs in expert order: their order, each pair's expert and token, tokens per expert."""
    flat = idx.flatten()
    order = torch.argsort(flat, stable=True)
    return order, flat[order], order // idx.shape[1], torch.bincount(flat, minlength=n_exp)


def moe_padded(x, w, idx, gate_up, down) -> tuple[torch.Tensor, int]:
    """A grouped GEMM as a padded `torch.bmm`: every expert's group padded to the longest, all experts in one
    batched matmul per projection (every expert's weights are read, and the padding rows are computed).
    Returns the output and the padding rows."""
    n_exp = gate_up.shape[0]
    order, expert, tok, counts = sort_by_expert(idx, n_exp)
    rows = int(counts.max())
    pos = torch.arange(order.numel()) - (torch.cumsum(counts, 0) - counts)[expert]  # row inside its group
    xp = x.new_zeros(n_exp, rows, x.shape[1])
    xp[expert, pos] = x[tok]
    g, u = torch.bmm(xp, gate_up.transpose(1, 2)).chunk(2, dim=-1)
    y = torch.bmm(F.silu(g) * u, down.transpose(1, 2))[expert, pos] * w.flatten()[order, None]
    return torch.zeros_like(x).index_add_(0, tok, y), n_exp * rows - order.numel()


def moe_ragged(x, w, idx, gate_up, down) -> torch.Tensor:
    """A grouped GEMM without padding: the pairs sorted by expert, one `grouped_mm` call per projection over the
    ragged groups (their ends in `offs`), as vLLM's fused MoE kernel and torch's grouped GEMM do."""
    if GROUPED_MM is None:
        raise RuntimeError("this torch has no grouped_mm")
    order, _, tok, counts = sort_by_expert(idx, gate_up.shape[0])
    offs = torch.cumsum(counts, 0).to(torch.int32)
    g, u = GROUPED_MM(x[tok], gate_up.transpose(1, 2), offs=offs).chunk(2, dim=-1)
    y = GROUPED_MM(F.silu(g) * u, down.transpose(1, 2), offs=offs) * w.flatten()[order, None]
    return torch.zeros_like(x).index_add_(0, tok, y)


# ---- the verdicts, from the numbers ----------------------------------------------------------------------------------
def intensity(tokens: int, k: int, touched: int) -> tuple[float, float]:
    """FLOPs per byte of expert weights (bf16: 2 bytes each) for a batch of `tokens`: every token runs k experts'
    3 H I weights (2 FLOPs each), and each touched expert's weights are read once. A dense layer of the same active
    parameters (one MLP of k I columns) reads k experts' worth for the same FLOPs. Returns (MoE, dense)."""
    flops = 2 * tokens * k  # per 3 H I weights, which cancel
    return flops / (2 * touched), flops / (2 * k)


def gemm_verdict(batch: int, name: str, loop: list[float], grouped: list[float]) -> str:
    """loop / grouped: seconds per pass (several passes). The fastest pass is the estimate; a median more than 50 %
    above it is noise larger than most effects, and the verdict is then inconclusive. "Faster" from 1.2x."""
    for who, ts in (("the loop", loop), (name, grouped)):
        if statistics.median(ts) > 1.5 * min(ts):
            return (f"batch {batch}, {name} against the loop: inconclusive on this machine (the median pass of {who} is "
                    f"{statistics.median(ts) / min(ts) - 1:.0%} above its fastest)")
    a, b = min(loop), min(grouped)
    if b < a / 1.2:
        return f"batch {batch}: {name} {a / b:.1f}x faster than the loop ({b * 1e3:.2f} vs {a * 1e3:.2f} ms)"
    if a < b / 1.2:
        return f"batch {batch}: {name} {b / a:.1f}x slower than the loop ({b * 1e3:.2f} vs {a * 1e3:.2f} ms)"
    return f"batch {batch}: {name} as fast as the loop, within 1.2x ({b * 1e3:.2f} vs {a * 1e3:.2f} ms)"


def timed(fn, repeats: int) -> list[float]:
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return ts


# ---- expert parallelism: what crosses devices -------------------------------------------------------------------------
def sends(idx: torch.Tensor, experts_per_device: int, devices: int) -> tuple[int, int, int]:
    """For tokens spread over `devices` (token t lives on device t % devices, as data-parallel attention leaves it)
    and experts placed in order: copies sent counted once per expert, once per device, and once per remote device."""
    dev = idx // experts_per_device  # (T, k) device of each chosen expert
    home = torch.arange(idx.shape[0]) % devices
    per_expert = idx.numel()
    per_device = sum(len(set(row)) for row in dev.tolist())
    remote = sum(len(set(row) - {h}) for row, h in zip(dev.tolist(), home.tolist()))
    return per_expert, per_device, remote


def main() -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: the timings compare kernels, not thread scaling
    try:
        run()
    finally:
        torch.set_num_threads(threads)


def run() -> None:
    cfg = Qwen2MoeConfig(vocab_size=512, hidden_size=H, intermediate_size=SHARED, moe_intermediate_size=I,
                         shared_expert_intermediate_size=SHARED, num_hidden_layers=1, num_attention_heads=8,
                         num_key_value_heads=2, num_experts=E, num_experts_per_tok=K)
    torch.manual_seed(0)
    moe = Qwen2MoeForCausalLM(cfg).model.layers[0].mlp.eval()  # HF's Qwen2MoeSparseMoeBlock, initialised at random
    gate_up, down, gate = moe.experts.gate_up_proj.detach(), moe.experts.down_proj.detach(), moe.gate.weight.detach()

    def shared(x):  # the shared expert every token runs, scaled by its own sigmoid gate
        return torch.sigmoid(moe.shared_expert_gate(x)) * moe.shared_expert(x)
    print(f"layer: Qwen2MoeSparseMoeBlock from Qwen2MoeConfig(hidden {H}, moe_intermediate {I}, shared expert {SHARED}, "
          f"{E} experts, top-{K}); each routed expert {3 * H * I:,} weights (gate, up, down); {K * 3 * H * I:,} of "
          f"{E * 3 * H * I:,} routed weights active per token, plus the shared expert's {3 * H * SHARED:,}")

    x = torch.randn(16, H, generator=torch.Generator().manual_seed(1))
    w, idx = route(gate, x, K, cfg.norm_topk_prob)
    print("routing of 3 tokens: " + "; ".join(f"token {t} -> experts {idx[t].tolist()} weights "
                                               f"{[round(v, 3) for v in w[t].tolist()]}" for t in range(3)))

    with torch.inference_mode():
        hf = moe(x[None])[0]
        loop = moe_loop(x, w, idx, gate_up, down) + shared(x)
        padded = moe_padded(x, w, idx, gate_up, down)[0] + shared(x)
        ragged = moe_ragged(x, w, idx, gate_up, down) + shared(x) if GROUPED_MM else padded
    tol = 1e-5 * hf.abs().max().item()
    diffs = {n: (y - hf).abs().max().item() for n, y in (("loop", loop), ("padded", padded), ("ragged", ragged))}
    print(f"16 tokens, max |difference| from HF's forward: the per-expert loop {diffs['loop']:.1e}, the padded bmm "
          f"{diffs['padded']:.1e}, grouped_mm "
          f"{format(diffs['ragged'], '.1e') if GROUPED_MM else '(absent in this torch)'} "
          f"({'all equal to fp32 rounding' if max(diffs.values()) < tol else 'DIFFERENT'}, tolerance {tol:.1e})")
    assert max(diffs.values()) < tol, diffs

    # tokens per expert and the intensity they give the weights
    xs = torch.randn(4096, H, generator=torch.Generator().manual_seed(2))
    _, big = route(gate, xs, K, cfg.norm_topk_prob)
    print("tokens per expert, and FLOPs per byte of expert weights (bf16) against a dense layer of the same "
          "active parameters:")
    for b in (1, 4, 16, 64, 256, 1024, 4096):
        counts = per_expert(big[:b], E)
        touched = sum(c > 0 for c in counts)
        moe_i, dense_i = intensity(b, K, touched)
        shown = f"{counts}" if b <= 16 else f"{min(counts)}-{max(counts)}"
        print(f"  batch {b:>4}: tokens per expert {shown}, {touched} of {E} experts read; intensity {moe_i:.1f} "
              f"against dense {dense_i:.1f} ({dense_i / moe_i:.1f}x lower)")
    counts = per_expert(big, E)
    print(f"  imbalance at batch 4096: the busiest expert has {max(counts)} tokens, {max(counts) / (4096 * K / E):.2f}x "
          f"the mean {4096 * K // E}: its GEMM sets the layer's time, on one device or across an expert-parallel group")

    # the grouped GEMM against the loop, timed
    for b in (16, 2048):
        xb = xs[:b]
        wb, ib = route(gate, xb, K, cfg.norm_topk_prob)
        with torch.inference_mode():
            out_loop = moe_loop(xb, wb, ib, gate_up, down)
            out_padded, pad = moe_padded(xb, wb, ib, gate_up, down)
            variants = [("loop", moe_loop), ("padded", moe_padded)] + ([("ragged", moe_ragged)] if GROUPED_MM else [])
            for _, f in variants[1:]:
                y = f(xb, wb, ib, gate_up, down)
                y = y[0] if isinstance(y, tuple) else y
                assert (out_loop - y).abs().max() < 1e-5 * out_loop.abs().max(), "a grouped GEMM differs from the loop"
            t = {n: timed(lambda f=f: f(xb, wb, ib, gate_up, down), REPEATS) for n, f in variants}
        counts = per_expert(ib, E)
        print(f"batch {b}: {sum(c > 0 for c in counts)} of {E} experts have tokens, at most {max(counts)}; the padded "
              f"bmm computes {E} x {max(counts)} rows, {pad} of them padding; timed, one thread, fastest of {REPEATS}:")
        print("  " + gemm_verdict(b, "the padded bmm", t["loop"], t["padded"]))
        if GROUPED_MM:
            print("  " + gemm_verdict(b, "grouped_mm", t["loop"], t["ragged"]))

    # expert parallelism: count the copies the routing sends
    per_exp, per_dev, remote = sends(big, E // 4, 4)
    print(f"expert parallelism over 4 devices ({E // 4} experts each), 4096 tokens routed top-{K}: {per_exp:,} copies "
          f"counted once per expert, {per_dev:,} once per device ({per_exp / per_dev:.2f}x fewer), of which "
          f"{remote:,} leave their own device")

    # the worked number: DeepSeek-V3, EP=8 on 8 H100 SXM over NVLink (900 GB/s total per GPU, 450 GB/s each way)
    ds = DeepseekV3Config()
    moe_layers = ds.num_hidden_layers - ds.first_k_dense_replace
    groups = ds.topk_group  # experts chosen within at most this many of the n_group groups; group g = device g at EP=8
    remote_dev = groups - groups / ds.n_group  # its own device is one of its groups with probability 4/8
    tokens, link = 128, 450e9
    hb = ds.hidden_size * 2  # one token's hidden state in bf16
    dev_bytes = 2 * tokens * remote_dev * hb  # dispatch + combine, per GPU per MoE layer
    exp_bytes = 2 * tokens * ds.num_experts_per_tok * (1 - 1 / 8) * hb
    print(f"DeepSeek-V3 (DeepseekV3Config: {ds.n_routed_experts} experts in {ds.n_group} groups, top-"
          f"{ds.num_experts_per_tok} within {groups} groups, hidden {ds.hidden_size}, {moe_layers} MoE layers), EP=8 "
          f"on 8 H100s, {tokens} tokens per GPU: a token reaches at most {groups} devices, {remote_dev:.1f} of them "
          f"remote on average when its groups are uniform; dispatch + combine {dev_bytes / 1e6:.1f} MB per GPU per MoE "
          f"layer, {dev_bytes / link * 1e6:.0f} us at 450 GB/s, {moe_layers * dev_bytes / link * 1e3:.2f} ms per step "
          f"(counted once per expert: {exp_bytes / 1e6:.1f} MB, {moe_layers * exp_bytes / link * 1e3:.2f} ms)")
    ridge = 989e12 / 3.35e12
    mx, qw = MixtralConfig(), Qwen2MoeConfig()  # their defaults are Mixtral-8x7B's and Qwen1.5-MoE-A2.7B's shapes
    print(f"H100 SXM ridge {ridge:.0f} FLOP/byte (989 dense bf16 TFLOPS / 3.35 TB/s): a dense layer reaches it at "
          f"batch {ridge:.0f}; an MoE layer's experts at {ridge:.0f} tokens each, a batch of "
          f"{ridge * mx.num_local_experts / mx.num_experts_per_tok:,.0f} for Mixtral-8x7B ({mx.num_local_experts} experts, "
          f"top-{mx.num_experts_per_tok}), {ridge * qw.num_experts / qw.num_experts_per_tok:,.0f} for Qwen1.5-MoE-A2.7B "
          f"({qw.num_experts}, top-{qw.num_experts_per_tok}) and "
          f"{ridge * ds.n_routed_experts / ds.num_experts_per_tok:,.0f} for DeepSeek-V3 ({ds.n_routed_experts}, "
          f"top-{ds.num_experts_per_tok})")


if __name__ == "__main__":
    main()
