"""Run one kernel config on the GPU in its own process (a crash cannot take the others down) and compare it with
the two-kernel path at BV=64: `python3 benchmarks/probe_configs.py PATH BV NUM_WARPS` prints one CSV row."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import gdnlab  # noqa: E402
from gdnlab.inputs import make_inputs  # noqa: E402

path, bv, nw = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
kw = make_inputs(B=1, T=200, H=2, HV=4, K=128, V=128, seed=7, decay=0.1, device="cuda").kwargs()
o2, h2 = gdnlab.chunk_gated_delta_rule(**kw, backend="two_kernel")
be = {"two_kernel": "two_kernel", "fused": "fused_fixed"}[path]
try:
    o, h = gdnlab.chunk_gated_delta_rule(**kw, backend=be, BV=bv, num_warps=nw, poison=True)
    torch.cuda.synchronize()
    print(f"{path},{bv},{nw},ok,{torch.equal(o, o2)},{torch.equal(h, h2)},{(o.float() - o2.float()).abs().max().item()}")
except Exception as e:  # noqa: BLE001
    print(f"{path},{bv},{nw},error,,,,{repr(e).splitlines()[0][:160]}")
