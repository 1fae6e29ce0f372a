"""Kernel-level times at three lengths: the prologue, the two-kernel walk and outputs, and the fused kernel as
shipped and fixed, per BV and num_warps; per-chunk cost and programs per multiprocessor. With a probe file (see
benchmarks.probe_configs) only the configurations that ran correctly in their own process are timed."""
from __future__ import annotations

import pandas as pd

from benchmarks.context import Context
from benchmarks.env import log, stamp
from benchmarks.inputs import QWEN, bench_inputs

OUTPUT = "breakdown.csv"


def run(ctx: Context) -> pd.DataFrame:
    import triton

    from gdnlab.kernel_params import FUSED_VARIANTS
    from gdnlab.kernels import pipeline
    rows = []
    sms = ctx.env["sms"]
    HV, V = QWEN["HV"], QWEN["V"]
    allowed = lambda path, bv, nw: ctx.probe_ok is None or (path, bv, nw) in ctx.probe_ok
    for T in (2048, 8192, 32768):
        x = pipeline.flatten(**bench_inputs(1, T, 0).kwargs())
        pro = pipeline.prologue(x, True)
        o, ht = pipeline.allocate_outputs(x, output_final_state=True, state_v_first=False)
        nt = x.plan.n_chunks
        t = triton.testing.do_bench(lambda: pipeline.prologue(x, True), return_mode="median")
        rows.append(dict(T=T, stage="prologue (l2norm x2 + cumsum/kkt/solve/wy)", ms=t, programs=nt * HV))
        for bv in (32, 64):
            for nw in (4, 8):
                if not allowed("two_kernel", bv, nw):
                    continue
                t = triton.testing.do_bench(lambda: pipeline.walk(x, pro, "two_kernel", o, ht, state_v_first=False,
                                                                  BV=bv, num_warps=nw), return_mode="median")
                rows.append(dict(T=T, stage="two_kernel (fwd_h + fwd_o)", BV=bv, num_warps=nw, ms=t,
                                 programs=(V // bv) * HV))
        for bv in (16, 32, 64):
            for nw in (4, 8):
                if not allowed("fused", bv, nw):
                    continue
                for name in ("fused_shipped", "fused_fixed"):
                    t = triton.testing.do_bench(lambda: pipeline.walk(
                        x, pro, "fused", o, ht, state_v_first=False, BV=bv, num_warps=nw,
                        **FUSED_VARIANTS[name].options), return_mode="median")
                    rows.append(dict(T=T, stage=name, BV=bv, num_warps=nw, ms=t, programs=(V // bv) * HV,
                                     us_per_chunk=t * 1e3 / nt))
        log("breakdown", T)
    df = pd.DataFrame(rows)
    df["sms"] = sms
    df["programs_per_sm"] = df["programs"] / sms
    return stamp(df, ctx.env)
