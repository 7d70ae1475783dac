import time, sys
from experiments.simulate import operators
from experiments.simulate.step_model import ModelShape
import torch
for d in ("models/heldout-deep", "models/heldout-broad"):
    m = ModelShape.from_dir(d)
    print(time.strftime("%T"), d, f"pass {operators.time_pass(m, 2) * 1e3:.2f} ms", flush=True)
x = torch.empty(256 * 2**20, dtype=torch.float32).uniform_()  # 1 GiB
torch.set_num_threads(2)
ts = []
for _ in range(7):
    t0 = time.perf_counter(); x.sum(); ts.append(time.perf_counter() - t0)
ts.sort(); print(time.strftime("%T"), f"1 GiB read: {2**30 / ts[3] / 1e9:.1f} GB/s (median of 7)")
