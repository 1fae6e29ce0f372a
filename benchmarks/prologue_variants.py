"""The prologue alone with fast's l2-norm handling (folded into the gates), per way of forming T and num_warps: its
time (graph replay, so that the launches' host time is left out) and the largest difference of its outputs from
the default solve at the same warps (0: bit-equal). The forms: the default block substitution on a whole-chunk A
("blocks"), the same with register moves ("moves"), with the diagonal blocks inverted by products ("doubling"),
by_blocks, and "identity" (no solve, T = I: a timing study's form with wrong numbers, what the rest of the
prologue costs). Earlier runs timed the other norm handlings (docs/speed-notes.md items 30, 34 and 35)."""
from __future__ import annotations

import pandas as pd

from benchmarks.context import Context
from benchmarks.env import log, stamp
from benchmarks.inputs import QWEN, bench_inputs
from benchmarks.timing import graph_ms

OUTPUT = "prologue_variants.csv"
#: l2-norm handling: (fuse_norm, fold_norm, split_wu)
NORMS = {"fold": (False, True, False)}
#: The forms timed after the default (their baseline; tf32x3 and ieee lost 1.9-6.7x to the blocks in
#: 2026-12-02T1654-prologue).
OTHERS = ("moves", "doubling", "by_blocks", "identity")


def run(ctx: Context) -> pd.DataFrame:
    import torch

    from gdnlab.kernels import pipeline
    from gdnlab.kernels.prologue import SOLVE
    rows = []
    for T in (512, 8192, 32768):
        x = pipeline.flatten(**bench_inputs(1, T, 0).kwargs())
        for norm, (fuse, fold, split) in NORMS.items():
            for nw in (2, 4):
                base = None
                for solve in (SOLVE, *OTHERS):
                    f = lambda: pipeline.prologue(x, True, fuse_norm=fuse, num_warps=nw, solve=solve,  # noqa: E731
                                                  fold_norm=fold, split_wu=split)
                    row = dict(T=T, solve=solve, num_warps=nw, norm=norm, programs=x.plan.n_chunks * QWEN["HV"])
                    try:
                        p2 = f()
                        base = base or p2
                        row["ms"] = graph_ms(f)
                        row["maxdiff_default"] = max(
                            float((getattr(p2, n).float() - getattr(base, n).float()).abs().max())
                            for n in ("q", "k", "g_cum", "w", "u"))
                        row["finite"] = bool(torch.isfinite(p2.w).all() and torch.isfinite(p2.u).all())
                    except Exception as e:  # noqa: BLE001
                        row["error"] = repr(e)[:300]
                    rows.append(row)
                    log("prologue", T, norm, nw, solve, row.get("ms"), row.get("maxdiff_default"))
    return stamp(pd.DataFrame(rows), ctx.env)
