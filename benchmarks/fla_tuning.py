"""Is FLA's run-to-run spread its autotuner? Per size, several times: clear every FLA autotuner's cache (and its
on-disk results, so that it times its configs again), call FLA once (it re-tunes), time it in graph replay (rotated
sets) next to fast, and record the configs it picked."""
from __future__ import annotations

import json
import sys

import pandas as pd

from benchmarks.context import Context
from benchmarks.env import log, stamp
from benchmarks.inputs import call_kwargs, input_sets
from benchmarks.timing import time_backend

OUTPUT = "fla_tuning.csv"


def _fla_autotuners() -> dict:
    """Every triton Autotuner object in the loaded fla modules, by qualified name."""
    from triton.runtime.autotuner import Autotuner
    found = {}
    for mname, mod in list(sys.modules.items()):
        if mname.startswith("fla.") and mod is not None:
            for aname, obj in list(vars(mod).items()):
                for _ in range(4):  # through heuristics and other wrappers, to the autotuner
                    if isinstance(obj, Autotuner):
                        found[f"{mname}.{aname}"] = obj
                        break
                    obj = getattr(obj, "fn", None)
    return found


def run(ctx: Context, draws: int = 4) -> pd.DataFrame:
    """`draws` re-tunes of FLA per size of ctx.fla_tokens (one sequence each), see the module docstring."""
    import torch

    import gdnlab
    rows = []
    for T in ctx.fla_tokens:
        sets = input_sets(1, T)
        for d in range(draws):
            for tuner in _fla_autotuners().values():
                tuner.cache.clear()
                if hasattr(tuner, "cache_results"):
                    tuner.cache_results = False
            gdnlab.chunk_gated_delta_rule(**call_kwargs(sets[0], "fla"), backend="fla")
            torch.cuda.synchronize()
            _, gms = time_backend("fla", sets)
            picked = {n.split(".")[-1]: str(c) for n, t in _fla_autotuners().items() for c in t.cache.values()}
            _, fast_gms = time_backend("fast", sets)
            rows.append(dict(T=T, draw=d, fla_graph_ms=gms, fast_graph_ms=fast_gms, configs=json.dumps(picked)))
            log("fla tuning", T, d, gms, fast_gms, picked)
        del sets
        torch.cuda.empty_cache()
    df = pd.DataFrame(rows)
    return stamp(df, ctx.env)
