"""Lab 11 — paged memory: blocks on demand instead of one contiguous max-length slab per request.

Smallest working piece: the `KVCacheManager` (block pool + reference counts), with plain `Request`
objects: allocate slots as tokens arrive, free on finish, and compare the memory held against a
contiguous allocator that must reserve `max_model_len` slots per request up front.

    python docs/handbook/labs/11_paged_memory.py
"""
from reference_engine.core.kv_cache_manager import KVCacheManager
from reference_engine.core.request import Request
from reference_engine.sampling_params import SamplingParams

BS, NUM_BLOCKS, MAX_LEN = 16, 64, 512  # 64 blocks x 16 = 1024 token slots
kv = KVCacheManager(NUM_BLOCKS, BS, enable_prefix_caching=False)
lengths = {"a": 100, "b": 37, "c": 250, "d": 16, "e": 300}  # final length of each request
reqs = {rid: Request(rid, [1] * 8, SamplingParams(max_tokens=n)) for rid, n in lengths.items()}

# Admission: blocks for the prompt only (8 tokens -> 1 block each); nothing reserved for the future.
for r in reqs.values():
    assert kv.allocate_slots(r, r.num_tokens, computed_blocks=[])
    r.num_computed_tokens = r.num_tokens
print(f"admitted {len(reqs)} requests: {kv.num_used} blocks used, {kv.num_free} free")
print(f"a contiguous allocator reserving max_model_len={MAX_LEN} each would need "
      f"{len(reqs) * MAX_LEN} slots > {NUM_BLOCKS * BS} available: only {NUM_BLOCKS * BS // MAX_LEN} fit")

# Decode: each request grows to its final length; a new block is taken only when the last one is full.
for rid, r in reqs.items():
    while r.num_tokens < lengths[rid]:
        if not kv.allocate_slots(r, 1):
            print(f"  {rid}: pool exhausted at {r.num_tokens} tokens -> the scheduler would preempt someone")
            break
        r.output_token_ids.append(2)
        r.num_computed_tokens += 1
    waste = len(r.block_table) * BS - r.num_tokens
    print(f"  {rid}: {r.num_tokens:3} tokens in {len(r.block_table):2} blocks {r.block_table[:6]}"
          f"{'...' if len(r.block_table) > 6 else ''}  (unused slots in its last block: {waste})")
held = sum(r.num_tokens for r in reqs.values())
print(f"tokens stored {held}, slots held {kv.num_used * BS} ({held / (kv.num_used * BS):.0%} of held memory is used); "
      f"contiguous reservation would hold {len(reqs) * MAX_LEN} slots for them ({held / (len(reqs) * MAX_LEN):.0%})")

# Finishing returns blocks to the pool at once; a waiting request can take them next step.
kv.free(reqs["c"])
print(f"after 'c' finishes: {kv.num_used} blocks used, {kv.num_free} free")
