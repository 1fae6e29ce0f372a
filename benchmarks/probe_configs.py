"""Run one kernel configuration on the GPU in its own process (a crash cannot take the others down) and compare it
with the two-kernel path at BV=64: prints one CSV row `path,BV,num_warps,status,out_equal,state_equal,maxdiff`,
which the breakdown part reads (--probe) to time only configurations that ran correctly.

    python -m benchmarks.probe_configs PATH BV NUM_WARPS      (PATH: two_kernel or fused)
"""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    import torch

    import gdnlab
    from gdnlab.inputs import make_inputs
    path, bv, nw = (sys.argv[1:] if argv is None else argv)[:3]
    bv, nw = int(bv), int(nw)
    kw = make_inputs(B=1, T=200, H=2, HV=4, K=128, V=128, seed=7, decay=0.1, device="cuda").kwargs()
    o2, h2 = gdnlab.chunk_gated_delta_rule(**kw, backend="two_kernel")
    be = {"two_kernel": "two_kernel", "fused": "fused_fixed"}[path]
    try:
        o, h = gdnlab.chunk_gated_delta_rule(**kw, backend=be, BV=bv, num_warps=nw, poison=True)
        torch.cuda.synchronize()
        print(f"{path},{bv},{nw},ok,{torch.equal(o, o2)},{torch.equal(h, h2)},"
              f"{(o.float() - o2.float()).abs().max().item()}")
    except Exception as e:  # noqa: BLE001
        print(f"{path},{bv},{nw},error,,,,{repr(e).splitlines()[0][:160]}")
    return 0


def read_ok(path: str) -> set[tuple[str, int, int]]:
    """The (path, BV, num_warps) configurations of a probe file that ran and matched the two-kernel path bit for bit,
    plus the defaults (the conformance part checks those)."""
    with open(path) as f:
        cells = [line.strip().split(",", 5) for line in f if line.count(",") >= 4]
    ok = {(c[0], int(c[1]), int(c[2])) for c in cells if c[3] == "ok" and c[4] == "True" and c[5].startswith("True")}
    return ok | {("two_kernel", 64, 4), ("fused", 64, 4)}


if __name__ == "__main__":
    sys.exit(main())
