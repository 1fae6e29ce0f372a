"""Run "fast" with some options once per size on CUDA, in a process of its own, and say whether the output equals
fast's bit for bit: a quick guard before a benchmark whose process one faulting kernel would end.

    python3 benchmarks/check_opts.py "dict(prefetch=True, num_stages=1)" [T ...]
"""
import sys

import torch

import gdnlab
from gdnlab.inputs import make_inputs


def main() -> int:
    opts = eval(sys.argv[1], {"__builtins__": {}, "dict": dict, "True": True, "False": False})  # noqa: S307
    ok = True
    for T in [int(t) for t in sys.argv[2:]] or [512, 1024, 4096, 8192]:
        kw = make_inputs(B=1, T=T, H=16, HV=32, K=128, V=128, seed=T, device="cuda").kwargs()
        o0, h0 = gdnlab.chunk_gated_delta_rule(**kw, backend="fast")
        o, h = gdnlab.chunk_gated_delta_rule(**kw, backend="fast", poison=True, **opts)
        torch.cuda.synchronize()
        same = torch.equal(o, o0) and torch.equal(h, h0)
        print(opts, T, "bit-equal" if same else f"differs by {(o.float() - o0.float()).abs().max().item():.3g}")
        ok &= same
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
