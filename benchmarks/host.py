"""Host time per eager call: at these sizes the host, not the GPU, sets an eager call's pace."""
from __future__ import annotations

import json
import os
import time

import numpy as np
import pandas as pd

from benchmarks.context import Context
from benchmarks.env import log, stamp
from benchmarks.inputs import bench_inputs, call_kwargs
from benchmarks.timing import host_walls

OUTPUT = "host.csv"


def run(ctx: Context, tokens: tuple[int, ...] = (512, 2048), n: int = 300, settle_s: float = 5.0) -> pd.DataFrame:
    """Host time per eager call: the wall time of `n` back-to-back calls on one input, synchronised once at the
    end (at these sizes the host, not the GPU, sets the pace), per backend and size, after every pair's first call
    and `settle_s` seconds of calls; fast's call at the smallest size is profiled with cProfile into
    host_profile.txt (where the host time goes)."""
    import cProfile
    import io
    import pstats

    import torch

    import gdnlab
    backends = ctx.timed()
    rows = []
    kws = {T: call_kwargs(bench_inputs(1, T, 0), "fast") for T in tokens}
    for T, kw in kws.items():  # every pair once before any is timed: the first pair timed read high (notes item 23)
        for be in backends:
            gdnlab.chunk_gated_delta_rule(**kw, backend=be)
    first = kws[tokens[0]]
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < settle_s:  # the host's speed settles over seconds of calls (notes item 25)
        gdnlab.chunk_gated_delta_rule(**first, backend=backends[0])
    torch.cuda.synchronize()
    for T, kw in kws.items():
        for be in backends:
            walls = host_walls(lambda: gdnlab.chunk_gated_delta_rule(**kw, backend=be), n)
            rows.append(dict(backend=be, B=1, T=T, tokens=T, us_per_call=float(np.median(walls)),
                             us_min=float(min(walls)), us_max=float(max(walls)), calls=n))
            log("host", be, T, round(rows[-1]["us_per_call"], 1))
    kw = kws[tokens[0]]
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        gdnlab.chunk_gated_delta_rule(**kw, backend="fast")
    torch.cuda.synchronize()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(30)
    with open(os.path.join(ctx.out, "host_profile.txt"), "w") as f:
        f.write(f"fast, B=1 T={tokens[0]}, {n} eager calls, cProfile sorted by tottime\n{json.dumps(ctx.env)}\n")
        f.write(buf.getvalue())
    return stamp(pd.DataFrame(rows), ctx.env)
