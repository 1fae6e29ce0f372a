"""The prologue alone, per way of finishing the solve, num_warps, and l2-norm inside the prologue or not: its time,
and the largest difference of its outputs from the default configuration (0: bit-equal)."""
from __future__ import annotations

import pandas as pd

from benchmarks.context import Context
from benchmarks.env import log, stamp
from benchmarks.inputs import QWEN, bench_inputs

OUTPUT = "prologue_variants.csv"


def run(ctx: Context) -> pd.DataFrame:
    import torch
    import triton

    from gdnlab.kernels import pipeline
    from gdnlab.kernels.prologue import SOLVES
    rows = []
    for T in (512, 8192, 32768):
        x = pipeline.flatten(**bench_inputs(1, T, 0).kwargs())
        base = pipeline.prologue(x, True)
        for solve, nw, fuse in [(s, w, False) for s in SOLVES for w in (2, 4, 8)] + \
                               [("blocks", w, True) for w in (2, 4, 8)]:
            f = lambda: pipeline.prologue(x, True, fuse_norm=fuse, num_warps=nw, solve=solve)
            try:
                p2 = f()
                t = triton.testing.do_bench(f, return_mode="median")
                diff = max(float((getattr(p2, n).float() - getattr(base, n).float()).abs().max())
                           for n in ("q", "k", "g_cum", "w", "u"))
                finite = bool(torch.isfinite(p2.w).all() and torch.isfinite(p2.u).all())
                rows.append(dict(T=T, solve=solve, num_warps=nw, l2norm_inside=fuse, ms=t,
                                 programs=x.plan.n_chunks * QWEN["HV"], maxdiff_default=diff, finite=finite))
            except Exception as e:  # noqa: BLE001
                rows.append(dict(T=T, solve=solve, num_warps=nw, l2norm_inside=fuse, error=repr(e)[:300]))
            log("prologue", T, solve, nw, fuse, rows[-1].get("ms"), rows[-1].get("maxdiff_default"))
    return stamp(pd.DataFrame(rows), ctx.env)
