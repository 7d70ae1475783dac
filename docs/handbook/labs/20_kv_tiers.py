"""Lab 20 — KV-cache tiers: blocks evicted from the pool go to a file, and come back on a hit instead of being
recomputed.

Smallest working piece: `FileTier`, a file of KV blocks indexed by the prefix cache's own chain hashes, and
`TieredKVCacheManager`, the engine's real `KVCacheManager` (block pool, hash prefix cache) with two additions:
a cached block that the pool hands out again is first written to the file (SGLang HiCache's write-back policy),
and at admission, after the longest prefix found in the pool, the next blocks found in the file are read back into
free blocks and indexed, so the scheduler admits them as ordinary prefix-cache hits. On a CPU a second tier in RAM
would be the same memory as the pool, so this tier is a file. The lab installs the manager in an `LLMEngine` on the
tiny model with a pool too small for the conversations it serves, runs a multi-turn workload with the tier and
without it, asserts the outputs are identical, prints the hit counters, and times the returning turns' TTFT; the
verdict is computed from the repeats. Last, the arithmetic for a 70B model on an H100 node.

    python docs/handbook/labs/20_kv_tiers.py [--model DIR] [--full]
"""
import argparse
import os
import statistics
import tempfile
import time

import torch

from reference_engine.config import EngineConfig
from reference_engine.core.kv_cache_manager import KVCacheManager
from reference_engine.core.prefix_cache import HashPrefixCache
from reference_engine.engine.llm_engine import LLMEngine
from reference_engine.engine.trace import resolve_model
from reference_engine.sampling_params import SamplingParams

ap = argparse.ArgumentParser()
ap.add_argument("--model", help="model directory (default: models/tiny-llama, made if absent)")
ap.add_argument("--full", action="store_true", help="more users, turns and repeats")
args = ap.parse_args()


# ---- the second tier ----------------------------------------------------------------------------------------------
class FileTier:
    """KV blocks in a file: one fixed-size record per block (every layer's K and V), found by the block's chain hash.
    Nothing is ever dropped here (a real tier evicts too: LMCache and HiCache bound theirs)."""

    def __init__(self, kv_cache: list[tuple[torch.Tensor, torch.Tensor]], path: str):
        self.kv = kv_cache
        k = kv_cache[0][0]
        self.shape = (len(kv_cache), 2, *k.shape[1:])  # one block: layers, K/V, block_size, kv_heads, head_dim
        self.record = torch.empty(self.shape, dtype=k.dtype).numel() * k.element_size()
        self.file = open(path, "w+b", buffering=0)
        self.where: dict[bytes, int] = {}  # chain hash -> record number
        self.written = self.read = 0  # blocks

    def save(self, h: bytes, block: int) -> None:
        if h in self.where:  # the same content is already on file (a block loaded from here, evicted again)
            return
        data = torch.stack([torch.stack((k[block], v[block])) for k, v in self.kv])
        self.file.seek(len(self.where) * self.record)
        self.file.write(data.numpy().tobytes())
        self.where[h] = len(self.where)
        self.written += 1

    def load(self, h: bytes, block: int) -> None:
        self.file.seek(self.where[h] * self.record)
        data = torch.frombuffer(bytearray(self.file.read(self.record)), dtype=self.kv[0][0].dtype).view(self.shape)
        for (k, v), layer in zip(self.kv, data):
            k[block] = layer[0]
            v[block] = layer[1]
        self.read += 1

    def close(self) -> None:
        self.file.close()


class SpillingPrefixCache(HashPrefixCache):
    """The engine's hash prefix cache, except that forgetting a block (the pool is handing it out again) first
    writes its content to the tier. `evict` runs before anything overwrites the block, so the content is intact."""

    def __init__(self, tier: FileTier):
        super().__init__()
        self.tier = tier

    def evict(self, block: int) -> None:
        h = self.hash_of.get(block)
        if h is not None:
            self.tier.save(h, block)
        super().evict(block)


class TieredKVCacheManager(KVCacheManager):
    """The engine's KV-cache manager over the same pool, with the file as a second tier under its prefix cache."""

    def __init__(self, num_blocks: int, block_size: int, tier: FileTier):
        super().__init__(num_blocks, block_size, enable_prefix_caching=True)
        self.cache = SpillingPrefixCache(tier)
        self.tier = tier
        self.tier_hit_tokens = 0

    def get_computed_blocks(self, req):
        blocks, n_hit = super().get_computed_blocks(req)  # the pool first (it also computes the request's hashes)
        limit = (req.num_tokens - 1) // self.block_size  # as the pool's lookup: the last prompt token is computed
        wanted = []
        for h in req.block_hashes[len(blocks):limit]:
            if h not in self.tier.where:
                break
            wanted.append(h)
        if not wanted or len(wanted) > self.pool.num_free:
            return blocks, n_hit
        # Bring them back: fresh blocks (evicting what the pool would evict next: it spills to the file), the
        # content read into them, indexed, then released as cached-and-free, exactly what a hit on a block
        # freed earlier looks like. The scheduler's own lookup then finds the longer prefix.
        fresh = self.pool.allocate(len(wanted))
        for h, b in zip(wanted, fresh):
            self.cache.evict(b)
            self.tier.load(h, b)
            self.cache.insert(h, b)
        self.pool.free(fresh)
        self.tier_hit_tokens += len(wanted) * self.block_size
        return super().get_computed_blocks(req)


# ---- the workload -------------------------------------------------------------------------------------------------
def conversations(users: int, turns: int, doc: int, question: int, seed: int = 0) -> list[list[list[int]]]:
    """Per user, per turn, the new user message's tokens (the first turn carries the user's own document)."""
    g = torch.Generator().manual_seed(seed)

    def ids(n):
        return (torch.randint(10, 8000, (n,), generator=g)).tolist()
    return [[ids(doc + question)] + [ids(question) for _ in range(turns - 1)] for _ in range(users)]


def serve(model: str, convs, answer: int, pool_tokens: int, tiered: bool) -> dict:
    """Users take turns (user 0 turn 0, user 1 turn 0, ..., user 0 turn 1, ...), one request at a time, each turn's
    prompt the whole conversation so far. Returns outputs, per-turn TTFT and the counters."""
    eng = LLMEngine(EngineConfig(model=model, kv_cache_tokens=pool_tokens))
    tier = None
    if tiered:  # replace the scheduler's manager by the tiered one over the same pool, before any request
        kv = eng.scheduler.kv
        tier = FileTier(eng.runner.kv_cache, os.path.join(tempfile.mkdtemp(prefix="inferlab-kv-tier-"), "blocks"))
        eng.scheduler.kv = TieredKVCacheManager(kv.num_blocks, kv.block_size, tier)
    history = [[] for _ in convs]
    outputs, ttft = [], {}
    params = SamplingParams(max_tokens=answer, temperature=0.0, ignore_eos=True)
    try:
        for turn in range(len(convs[0])):
            for u, conv in enumerate(convs):
                prompt = history[u] + conv[turn]
                rid = f"u{u}t{turn}"
                t0 = time.perf_counter()
                eng.add_request(prompt, params, request_id=rid)
                out = []
                while eng.has_unfinished():
                    for d in eng.step():
                        if not out and d.new_token_ids:
                            ttft[rid] = (time.perf_counter() - t0) * 1e3
                        out += d.new_token_ids
                outputs.append(out)
                history[u] = prompt + out
        st = eng.stats()
        mgr = eng.scheduler.kv
        return {"outputs": outputs, "ttft": ttft, "queries": st.prefix_cache_queries, "hits": st.prefix_cache_hits,
                "tier_hits": getattr(mgr, "tier_hit_tokens", 0), "written": tier.written if tier else 0,
                "read": tier.read if tier else 0, "record": tier.record if tier else 0,
                "blocks": mgr.num_blocks, "block_size": mgr.block_size}
    finally:
        if tier:
            tier.close()


# ---- the verdict, from the repeats --------------------------------------------------------------------------------
def verdict(with_tier: list[float], without: list[float]) -> str:
    """Median TTFT (ms) of the returning turns, one value per repeat and arrangement. A side is faster only where
    every repeat of it beats every repeat of the other."""
    rng = f"with the tier {min(with_tier):.1f}-{max(with_tier):.1f} ms, without {min(without):.1f}-{max(without):.1f} ms"
    if max(with_tier) < min(without):
        return f"the file tier cut the returning turns' TTFT {min(without) / max(with_tier):.1f}x at least ({rng})"
    if max(without) < min(with_tier):
        return (f"reading the file was slower than recomputing: the returning turns' TTFT rose "
                f"{min(with_tier) / max(without):.1f}x at least ({rng})")
    return f"inconclusive on this machine: the repeats overlap ({rng})"


def seventy_b() -> None:
    """The worked number: Llama-3.1-70B (80 layers, 8 KV heads of 128, bf16) on one 8-H100 node at TP=8."""
    layers, kv_heads, dim, params = 80, 8, 128, 70.6e9
    per_token = 2 * layers * kv_heads * dim * 2
    prefix = 8192
    nbytes = prefix * per_token
    flops = 2 * params * prefix  # the matmuls of a prefill; attention adds more
    node_flops, pcie = 8 * 989e12, 8 * 64e9  # dense bf16 peak; PCIe Gen5 x16, 64 GB/s each way per GPU
    recompute = flops / node_flops
    print(f"Llama-3.1-70B KV: 2 x {layers} layers x {kv_heads} KV heads x {dim} x 2 B = {per_token:,} B per token "
          f"({per_token // 8:,} B on each GPU at TP=8); an {prefix:,}-token prefix is {nbytes / 1e9:.2f} GB")
    print(f"recomputing it: 2 x {params / 1e9:.1f} B x {prefix:,} = {flops / 1e15:.2f} PFLOP, {recompute * 1e3:.0f} ms at "
          f"the node's {node_flops / 1e15:.1f} PFLOP/s (989 TFLOPS per H100, 100% of peak); reading it back from host "
          f"memory over PCIe Gen5 (64 GB/s per GPU, each GPU its eighth): {nbytes / pcie * 1e3:.1f} ms; any tier "
          f"delivering more than {nbytes / recompute / 1e9:.1f} GB/s to the node beats recomputing at peak")
    hbm, host, nvme = 8 * 80e9 - 2 * params, 2e12, 8 * 3.84e12  # DGX H100: 640 GB HBM, 2 TB DDR5, 8 x 3.84 TB NVMe
    print(f"room on a DGX H100: HBM after the {2 * params / 1e9:.0f} GB of weights {hbm / per_token / 1e6:.2f} M tokens "
          f"(before activations); 2 TB of host memory {host / per_token / 1e6:.1f} M; 8 x 3.84 TB of NVMe "
          f"{nvme / per_token / 1e6:.0f} M")


def main() -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: a second one spins at every barrier while a neighbour holds its core
    try:
        run(resolve_model(args.model))
    finally:
        torch.set_num_threads(threads)


def run(model: str) -> None:
    users, turns, repeats = (8, 4, 5) if args.full else (5, 3, 3)
    doc, question, answer, pool = 160, 16, 8, 512
    convs = conversations(users, turns, doc, question)
    print(f"workload: {users} users x {turns} turns, taken in turn; each user's first message a {doc + question}-token "
          f"document and question, each later one {question} tokens, answers {answer} tokens; every prompt is the "
          f"whole conversation so far. Pool: {pool} tokens, less than the conversations hold")
    runs = {True: [], False: []}
    for _ in range(repeats):  # alternating, so both sides see the same machine
        for tiered in (True, False):
            runs[tiered].append(serve(model, convs, answer, pool, tiered))
    a, b = runs[True][0], runs[False][0]
    assert all(r["outputs"] == b["outputs"] for r in runs[True] + runs[False]), "outputs differ with the tier"
    print(f"outputs identical with and without the tier: {len(b['outputs'])} requests, {answer} greedy tokens each")
    print(f"without the tier: {b['hits']:,} of {b['queries']:,} prompt tokens found cached "
          f"({b['hits'] / b['queries']:.0%}); with it: {a['hits']:,} ({a['hits'] / a['queries']:.0%}), of which "
          f"{a['tier_hits']:,} read back from the file")
    print(f"tier counters: {a['written']} blocks written ({a['written'] * a['record']:,} B), {a['read']} read back "
          f"({a['read'] * a['record']:,} B); a block is {a['block_size']} tokens x {a['record'] // a['block_size']:,} B; "
          f"the pool holds {a['blocks']} blocks")
    returning = [rid for rid in b["ttft"] if not rid.endswith("t0")]
    med = {t: [statistics.median(r["ttft"][rid] for rid in returning) for r in runs[t]] for t in (True, False)}
    print("returning turns' median TTFT per repeat: with the tier " + ", ".join(f"{x:.1f}" for x in med[True])
          + " ms; without " + ", ".join(f"{x:.1f}" for x in med[False]) + " ms")
    print("verdict: " + verdict(med[True], med[False]))
    seventy_b()


if __name__ == "__main__":
    main()
