"""Where auto's eager time over the configuration it runs (fast with fuse_norm below 2048 tokens) goes, on CUDA
(benchmarks/NOTES.md item 20): the host cost of auto's dispatch layer (auto routed to a do-nothing backend, against
that backend called directly), of the CUDA capture query it makes, and auto against fast+fn eagerly, sampled as
h200.py's bench does (each call from an idle GPU, backends interleaved) with many more samples.

    python3 benchmarks/auto_overhead.py --out DIR
"""
import argparse
import os

import numpy as np
import pandas as pd
import torch

import h200
import gdnlab
from gdnlab import auto
from gdnlab.speed import DISPATCH_AUTO, DISPATCH_DIRECT


def _host_us(fn, n: int = 2000) -> float:
    """Median over seven windows of the mean wall time of `n` calls, in us."""
    return float(np.median(h200.host_walls(fn, n, windows=7, warmup=50)))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=1000)
    args = ap.parse_args()
    env = h200.env_info()
    h200._register_variants(h200.STUDIES["final"])
    kw = h200._kwargs(h200._inputs(1, 512, 0), "fast")

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
        sets = h200._sets(1, T)
        samples, errors = h200.eager_paired({be: h200._calls(be, sets) for be in ("auto", "fast+fn")}, reps=args.reps)
        if errors:
            raise RuntimeError(errors)
        a, f = samples["auto"], samples["fast+fn"]
        rows.append(dict(what=f"eager auto / fast+fn, 1x{T}", T=T, auto_ms=float(np.median(a)),
                         fast_fn_ms=float(np.median(f)), ratio_of_medians=float(np.median(a) / np.median(f)),
                         median_paired_ratio=float(np.median(a / f)), samples=len(a)))
    df = h200._stamp(pd.DataFrame(rows), env)
    df.to_csv(os.path.join(args.out, "auto_overhead.csv"), index=False)
    print(df.to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
