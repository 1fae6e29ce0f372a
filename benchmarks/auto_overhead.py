"""Where auto's eager time over the configuration it runs (fast with fuse_norm for short calls) goes: the host cost
of auto's dispatch layer (auto routed to a do-nothing backend, against that backend called directly), of the CUDA
capture query it makes, and auto against fast+fn eagerly, sampled as the bench part samples (each call from an idle
GPU, backends interleaved) with many more samples (--reps)."""
from __future__ import annotations

import numpy as np
import pandas as pd

import gdnlab
from benchmarks.context import Context
from benchmarks.env import stamp
from benchmarks.inputs import bench_inputs, call_kwargs, input_sets
from benchmarks.timing import backend_calls, eager_paired, host_walls
from benchmarks.variants import STUDIES, register_study
from gdnlab import auto
from gdnlab.speed import DISPATCH_AUTO, DISPATCH_DIRECT

OUTPUT = "auto_overhead.csv"


def _host_us(fn, n: int = 2000) -> float:
    """Median over seven windows of the mean wall time of `n` calls, in us."""
    return float(np.median(host_walls(fn, n, windows=7, warmup=50)))


def run(ctx: Context) -> pd.DataFrame:
    import torch
    register_study(STUDIES["final"])
    kw = call_kwargs(bench_inputs(1, 512, 0), "fast")

    def noop(q, k, v, g, beta, **_):
        return q, None
    noop.validates_itself = True
    gdnlab.register_backend("noop", noop, overwrite=True)
    lab = auto.LAB
    rows = [dict(what="capture query", us=_host_us(torch.cuda.is_current_stream_capturing))]
    rows.append(dict(what=DISPATCH_DIRECT, us=_host_us(lambda: gdnlab.chunk_gated_delta_rule(**kw, backend="noop"))))
    auto.LAB = "noop"
    try:
        rows.append(dict(what=DISPATCH_AUTO,
                         us=_host_us(lambda: gdnlab.chunk_gated_delta_rule(**kw, backend="auto"))))
    finally:
        auto.LAB = lab
    for T in (512, 1024):
        sets = input_sets(1, T)
        samples, errors = eager_paired({be: backend_calls(be, sets) for be in ("auto", "fast+fn")}, reps=ctx.reps)
        if errors:
            raise RuntimeError(errors)
        a, f = samples["auto"], samples["fast+fn"]
        rows.append(dict(what=f"eager auto / fast+fn, 1x{T}", T=T, auto_ms=float(np.median(a)),
                         fast_fn_ms=float(np.median(f)), ratio_of_medians=float(np.median(a) / np.median(f)),
                         median_paired_ratio=float(np.median(a / f)), samples=len(a)))
    return stamp(pd.DataFrame(rows), ctx.env)
