"""The prefill half of the C++ CPU attention kernel (source: csrc/attention_prefill.cpp; `cpp_kernel.py`
describes decode, and `module()` there is the extension both are in).

`prefill(q, k_cache, v_cache, block_tables, seq_lens, query_start, scale, out)`: chunks of several
query tokens per sequence (q (N, H, D), the chunks back to back, `query_start` (B+1,) int64 their
offsets), each token attending causally to its sequence's keys in the cache up to its own position
(prefix-cached context and earlier chunks included), one task per (sequence, 16-row tile, kv head).

A task holds its R = 16 x G query vectors (G query heads per kv head) transposed, `qt (D, R8)` (R
padded to R8, a multiple of 8, with zero rows), and keeps each block's scores key-major,
`s[t * R8 + i]`: a score tile is then 16 query rows x 6 keys in twelve registers, summed over d
with one broadcast key element against two vectors of q — no horizontal sums, which the
row-major dot products of the decode kernel need — and the online softmax runs over 8 query rows
per vector (`exp8`). Every score and every output element still sums its terms in a fixed order
(d in order; keys in order), whatever the tile or thread.

`prefill_amx` (csrc/attention_amx.cpp), bf16 where the GEMM runs on AMX (`cpu_backend.amx_prefill`): the
same contract on the tile unit. A task (sequence, kv head, 32 query tokens) lays out the keys it sees once
as K^T and V in AMX's B-tile order; per 16 query rows, S = Q K^T and O = P V are tile products, the softmax
is online in fp32 over 256-key chunks at fixed key positions, P is rounded to bf16 before P V. q may be a
view with any token stride (the qkv projection's rows). A row's bits depend on its query, its keys and
those fixed chunks only: batch-, tile- and prefix-invariant, but not the fp32-sum kernel's bits.
"""
