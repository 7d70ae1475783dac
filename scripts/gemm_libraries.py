"""fp32 GEMM speed of MKL (F.linear) against oneDNN's prepacked linear on SmolLM2's projection shapes at
2048 and 4096 rows, 2 threads, best of 3 (the measurement behind the three-layout design's prefill choice, before 2026-12-04).

    .venv/bin/python scripts/gemm_libraries.py
"""
import torch, time
torch.set_num_threads(2)
F=torch.nn.functional
res={}
for M in (2048,4096):
  for (N,K) in ((960,576),(576,576),(3072,576),(576,1536)):
    a=torch.randn(M,K); w=torch.randn(N,K)
    pk=torch.ops.mkldnn._reorder_linear_weight(w)
    fns={"mkl":lambda: F.linear(a,w), "onednn":lambda: torch.ops.mkldnn._linear_pointwise(a,pk,None,"none",[],"")}
    for rep in range(3):
      for name,f in fns.items():
        f(); t=time.perf_counter()
        for _ in range(5): f()
        d=(time.perf_counter()-t)/5
        res.setdefault((M,N,K,name),[]).append(2*M*N*K/d/1e9)
for k,v in res.items(): print(k, "%.0f GFLOP/s"%max(v))
