"""Every stage of the lab's pipeline and of FLA's, each timed alone in CUDA-graph replay, at four lengths: each lab
configuration is checked bit for bit against the default one on the same inputs (one that differs is not eligible),
then the whole call runs with the fastest eligible configuration of every stage, against FLA. Rows are appended to
stages.csv as they come, so that a crash keeps what ran before it.

The configurations, per stage: the prologue (solve, warps); the state kernel (BV, warps, stages); the output kernel
(BV, warps, stages). Those that fail on some Triton releases (BV < 64 at 4 warps) come last in their list, so that a
crash costs the fewest rows.
"""
from __future__ import annotations

import os
from typing import Any

import pandas as pd

from benchmarks.context import Context
from benchmarks.env import ENV_KEYS, log
from benchmarks.inputs import QWEN, bench_inputs
from benchmarks.timing import graph_ms

OUTPUT = "stages.csv"

PROLOGUES = [("blocks", 4), ("blocks", 2), ("tf32x3", 4)]
STATE_CFGS = [(64, 4, None), (64, 4, 2), (64, 4, 4), (64, 2, None), (64, 8, None), (32, 8, None), (32, 8, 2),
              (32, 2, None), (32, 2, 2), (32, 4, None), (32, 4, 2)]
OUT_CFGS = [(64, 4, None), (64, 4, 2), (64, 8, None), (128, 8, None), (128, 8, 2), (128, 4, None), (128, 4, 2)]


def run(ctx: Context) -> pd.DataFrame:
    """The stage study (see the module docstring)."""
    import dataclasses
    import json

    import torch

    import gdnlab
    from gdnlab.kernels import l2norm, pipeline
    HV, V = QWEN["HV"], QWEN["V"]
    path = os.path.join(ctx.out, OUTPUT)
    rows: list[dict] = []

    def add(**r):
        r.update({k: ctx.env[k] for k in ENV_KEYS})
        rows.append(r)
        pd.DataFrame(rows).to_csv(path, index=False)
        log("stage", {k: v for k, v in r.items() if k not in ENV_KEYS})

    for T in (512, 2048, 8192, 32768):
        inp = bench_inputs(1, T, 0)
        x = pipeline.flatten(**inp.kwargs())
        add(T=T, stage="l2norm q+k", config="", ms=graph_ms(lambda: (l2norm(x.q), l2norm(x.k))))
        xn = dataclasses.replace(x, q=l2norm(x.q), k=l2norm(x.k))
        base = pipeline.prologue(xn, False)
        best_pro = None
        for form, nw in PROLOGUES:
            try:
                p2 = pipeline.prologue(xn, False, num_warps=nw, solve=form)
                torch.cuda.synchronize()
                same = all(torch.equal(getattr(p2, n), getattr(base, n)) for n in ("g_cum", "w", "u"))
                diff = max(float((getattr(p2, n).float() - getattr(base, n).float()).abs().max()) for n in ("w", "u"))
                t = graph_ms(lambda: pipeline.prologue(xn, False, num_warps=nw, solve=form))
                add(T=T, stage="prologue", config=f"{form} w{nw}", form=form, num_warps=nw, ms=t, bit_equal=same,
                    maxdiff=diff, programs=x.plan.n_chunks * HV)
                if best_pro is None or t < best_pro[0]:
                    best_pro = (t, form, nw)
            except Exception as e:  # noqa: BLE001
                add(T=T, stage="prologue", config=f"{form} w{nw}", error=repr(e)[:300])
        o, ht = pipeline.allocate_outputs(x, output_final_state=True, state_v_first=False)

        def walk(BV: int = 64, **opts: Any) -> None:
            pipeline.walk(x, base, "two_kernel", o, ht, state_v_first=False, BV=BV, **opts)

        walk()
        o_ref, ht_ref = o.clone(), ht.clone()

        def trial(stage: str, cfg: tuple, programs: int, **opts) -> float | None:
            """Run two_kernel with opts, compare with the default bit for bit, time it; its ms if bit-equal."""
            label = "BV{} w{} s{}".format(*cfg)
            try:
                o.fill_(float("nan"))
                walk(**opts)
                torch.cuda.synchronize()
                same = torch.equal(o, o_ref) and torch.equal(ht, ht_ref)
                t = graph_ms(lambda: walk(**opts))
                add(T=T, stage=stage, config=label, BV=cfg[0], num_warps=cfg[1], num_stages=cfg[2], ms=t,
                    bit_equal=same, maxdiff=float((o.float() - o_ref.float()).abs().max()), programs=programs)
                return t if same else None
            except Exception as e:  # noqa: BLE001
                add(T=T, stage=stage, config=label, error=repr(e)[:300])
                return None

        # the state kernel's configs, the output kernel fixed; then the output kernel's, with the best state config
        timed = {c: trial("fwd_h + fwd_o(64, w4)", c, (V // c[0]) * HV, BV=c[0], num_warps=c[1], num_stages=c[2],
                          out_BV=64, out_warps=4) for c in STATE_CFGS}
        hbv, hnw, hns = min((c for c in timed if timed[c] is not None), key=timed.get)
        timed = {c: trial(f"fwd_h(BV{hbv} w{hnw} s{hns}) + fwd_o", c, (V // c[0]) * x.plan.n_chunks * HV, BV=hbv,
                          num_warps=hnw, num_stages=hns, out_BV=c[0], out_warps=c[1], out_stages=c[2])
                 for c in OUT_CFGS}
        obv, onw, ons = min((c for c in timed if timed[c] is not None), key=timed.get)
        # FLA's stages, each alone
        try:
            from fla.modules.norm.l2norm import l2norm_fwd
            from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_h
            from fla.ops.common.chunk_o import chunk_fwd_o
            from fla.ops.gated_delta_rule.chunk_fwd import chunk_gated_delta_rule_fwd_intra
            from fla.ops.utils import chunk_local_cumsum
            from fla.ops.utils.constant import RCP_LN2
            q4, k4, v4, g4, b4 = inp.q, inp.k, inp.v, inp.g.float(), inp.beta
            add(T=T, stage="fla l2norm q+k", ms=graph_ms(lambda: (l2norm_fwd(q4), l2norm_fwd(k4))))
            qf, kf = l2norm_fwd(q4)[0], l2norm_fwd(k4)[0]
            add(T=T, stage="fla cumsum", ms=graph_ms(lambda: chunk_local_cumsum(g4, chunk_size=64, scale=RCP_LN2)))
            gc = chunk_local_cumsum(g4, chunk_size=64, scale=RCP_LN2)
            add(T=T, stage="fla intra (kkt+solve, w/u)",
                ms=graph_ms(lambda: chunk_gated_delta_rule_fwd_intra(k=kf, v=v4, g=gc, beta=b4)))
            w, u, _ = chunk_gated_delta_rule_fwd_intra(k=kf, v=v4, g=gc, beta=b4)
            add(T=T, stage="fla fwd_h", ms=graph_ms(lambda: chunk_gated_delta_rule_fwd_h(
                k=kf, w=w, u=u, g=gc, initial_state=x.h0, output_final_state=True)))
            hh, vn, _ = chunk_gated_delta_rule_fwd_h(k=kf, w=w, u=u, g=gc, initial_state=x.h0,
                                                     output_final_state=True)
            add(T=T, stage="fla fwd_o", ms=graph_ms(lambda: chunk_fwd_o(q=qf, k=kf, v=vn, h=hh, g=gc, scale=0.1)))
        except Exception as e:  # noqa: BLE001
            add(T=T, stage="fla stages", error=repr(e)[:300])
        # whole calls: the default, and the fastest eligible config of every stage
        kw = inp.kwargs()
        _, pform, pnw = best_pro
        best = dict(prologue_solve=pform, prologue_warps=pnw, BV=hbv, num_warps=hnw, num_stages=hns, out_BV=obv,
                    out_warps=onw, out_stages=ons)
        for name, be, opts in [("two_kernel", "two_kernel", {}), ("fast (current)", "fast", {}),
                               ("best stages", "two_kernel", best), ("fla", "fla", {})]:
            try:
                add(T=T, stage="whole call", config=name, options=json.dumps(opts),
                    ms=graph_ms(lambda: gdnlab.chunk_gated_delta_rule(**kw, backend=be, **opts)))
            except Exception as e:  # noqa: BLE001
                add(T=T, stage="whole call", config=name, error=repr(e)[:300])
        del inp, base
        torch.cuda.empty_cache()
    return pd.DataFrame(rows)