"""Candidate changes to "fast", by study: each candidate is a registered backend (a base backend with options on top),
checked bit for bit against "fast" and then timed against "fast" and FLA in interleaved rounds, so that drift between
the measurements is shared (`--study STUDY`, variants_STUDY.csv). Studies whose options were removed from the kernels
as slower are in docs/speed-notes.md with the commits that hold their code.
"""
from __future__ import annotations

from typing import Any

import pandas as pd

import gdnlab
from benchmarks.bench import against_fast
from benchmarks.context import Context
from benchmarks.env import log, stamp
from benchmarks.inputs import SHAPES, call_kwargs, floor_bytes, input_sets, tokens_of
from benchmarks.timing import time_backend
from gdnlab.registry import get_backend

#: Candidates by study: name -> (base backend, options on top of it).
STUDIES = {
    # int32 indices in the kernels (the default where no buffer needs int64) against int64 everywhere
    "index": {
        "fast+i64": ("fast", dict(index64=True)),
    },
    # configurations for short prefills, where every input is read cold once (rotated sets): prologue warps, where
    # q is normalised, and the two kernels' V tiles
    "small": {
        "fast+pw4": ("fast", dict(prologue_warps=4)),
        "fast+pw4+nq": ("fast", dict(prologue_warps=4, norm_q_in_output=True)),
        "fast+nq": ("fast", dict(norm_q_in_output=True)),
        "pw4+bv64+o64": ("two_kernel", {}),
        "pw4+bv64+o64+nq": ("two_kernel", dict(norm_q_in_output=True)),
        "pw4+bv32+o64": ("two_kernel", dict(BV=32, out_BV=64)),
        "pw4+bv64+o128": ("two_kernel", dict(out_BV=128)),
        "pw2+bv64+o128": ("two_kernel", dict(prologue_warps=2, out_BV=128)),
    },
    # host work per eager call: q's and k's l2-norm inside the prologue (one launch fewer), or q's inside the
    # output kernel
    "eager": {
        "fast+fn": ("fast", dict(fuse_norm=True)),
        "fast+nq": ("fast", dict(norm_q_in_output=True)),
    },
    # the state kernel's software-pipelining depth (Triton's default is 3; the output kernel kept at 3), and the
    # prologue at one warp (as FLA's re-tuned kkt/solve runs)
    "depth": {
        "fast+hs2": ("fast", dict(num_stages=2, out_stages=3)),
        "fast+hs4": ("fast", dict(num_stages=4, out_stages=3)),
        "fast+pw1": ("fast", dict(prologue_warps=1)),
    },
    # auto's eager pick for short calls (fast with the l2-norm in the prologue), and fast with its walk at Triton's
    # default 3 stages at every size (what fast_by_size's depth rule changes)
    "final": {
        "fast+fn": ("fast", dict(fuse_norm=True)),
        "fast+hs3": ("fast", dict(num_stages=3)),
    },
}


#: Studies that run at a few short lengths only (the others run at every bench shape).
SMALL_SHAPES: dict[str, list[tuple[int, int]]] = dict(small=[(1, 512), (1, 1024), (1, 2048), (1, 8192)])


def output(ctx: Context) -> str:
    """The file a study writes."""
    return f"variants_{ctx.study}.csv"


def register_study(study: dict[str, tuple[str, dict[str, Any]]]) -> None:
    """Register every candidate of a study as a backend (replacing one of the same name)."""
    for name, (base, opts) in study.items():
        if name == base or name in ("fast", "fla", "two_kernel"):
            raise ValueError(f"variant {name!r} would replace the backend it compares with")

        def run(q, k, v, g, beta, _base=base, _opts=opts, **kw):
            return get_backend(_base)(q, k, v, g, beta, **{**_opts, **kw})
        run.validates_itself = True
        gdnlab.register_backend(name, run, overwrite=True)


def run(ctx: Context, shapes: list | None = None, rounds: int = 3) -> pd.DataFrame:
    """Each candidate of STUDIES[study], "fast" and FLA at every bench shape (or `shapes`): first checked bit for
    bit against "fast" (poisoned outputs), then timed (eager and graph) in `rounds` interleaved rounds, so that
    drift between the backends' measurements is shared."""
    import torch
    study, bw = ctx.study, ctx.bandwidth()
    shapes = shapes or SMALL_SHAPES.get(study)
    cands = STUDIES[study]
    register_study(cands)
    names = ["fast", *cands, "fla"]
    rows = []
    for B, T in shapes or SHAPES:
        sets = input_sets(B, T)
        tokens = tokens_of(B, T)
        floor_ms = floor_bytes(sets[0]) / bw * 1e3
        checks = against_fast(call_kwargs(sets[0], "fast"), cands)
        log("variant check", B, T, checks)
        for r in range(rounds):
            for be in names:
                try:
                    ms, gms = time_backend(be, sets)
                    rows.append(dict(backend=be, B=B, T=T if T else tokens, tokens=tokens, round=r, ms=ms,
                                     graph_ms=gms, floor_ms=floor_ms, **checks.get(be, {})))
                except Exception as e:  # noqa: BLE001
                    rows.append(dict(backend=be, B=B, T=T, tokens=tokens, round=r, error=repr(e)[:300]))
                log("variant", be, B, T, r, rows[-1].get("ms"), rows[-1].get("graph_ms"))
        del sets
        torch.cuda.empty_cache()
    df = pd.DataFrame(rows)
    df["study"] = study
    med = df.groupby(["B", "T", "backend"], sort=False)["graph_ms"].median().unstack()
    print((med.div(med["fla"], axis=0)).round(3).to_string(), flush=True)
    df["copy_bw_GBps"] = bw / 1e9
    return stamp(df, ctx.env)