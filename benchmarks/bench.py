"""Speed of every backend at every bench shape: eager (sampled from an idle GPU, backends interleaved) and
CUDA-graph replay (interleaved rounds), with each lab backend's output checked bit for bit against fast's first, and
its replays (from its call plan, from a CUDA graph) against its own output."""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

import gdnlab
from benchmarks.context import Context
from benchmarks.env import implementation, log, stamp
from benchmarks.inputs import call_kwargs, floor_bytes, input_sets, parse_label, tokens_of
from benchmarks.timing import EAGER_METHOD, backend_calls, eager_paired, graph_time

OUTPUT = "bench.csv"


def against_fast(kw: dict[str, Any], backends: list[str]) -> dict[str, dict[str, Any]]:
    """Each lab backend's poisoned output on one input compared with fast's: bit_equal_fast, maxdiff_fast,
    all_written (or the error it raised)."""
    import torch
    o_ref, h_ref = gdnlab.chunk_gated_delta_rule(**kw, backend="fast", poison=True)
    checks = {}
    from gdnlab import peers
    for be in backends:
        if parse_label(be)[0] in peers.PEERS:
            continue
        try:
            name, opts = parse_label(be)
            o, h = gdnlab.chunk_gated_delta_rule(**kw, backend=name, poison=True, **opts)
            torch.cuda.synchronize()
            checks[be] = dict(bit_equal_fast=bool(torch.equal(o, o_ref) and torch.equal(h, h_ref)),
                              maxdiff_fast=float((o.float() - o_ref.float()).abs().max()),
                              all_written=bool(torch.isfinite(o).all()),
                              replays_equal=replays_equal(lambda: gdnlab.chunk_gated_delta_rule(
                                  **kw, backend=name, **opts), o, h))
        except Exception as e:  # noqa: BLE001
            checks[be] = dict(error=repr(e)[:300])
    return checks


def replays_equal(call: Any, o: torch.Tensor, h: torch.Tensor) -> bool:
    """Whether `call`'s outputs equal (o, h) (its poisoned call's, which never uses a plan) bit for bit when it is
    replayed as the timings replay it: an eager call from its recorded plan (gdnlab.plans) and a CUDA graph of it."""
    import torch
    call()  # records the plan
    same = [call()]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = call()
    graph.replay()
    torch.cuda.synchronize()
    same.append(replayed)
    return all(torch.equal(x, o) and torch.equal(y, h) for x, y in same)


def run(ctx: Context, rounds: int = 3) -> pd.DataFrame:
    """Every backend at every bench shape. Eager: eager_paired, ms its median and ms_iqr the interquartile range
    over the median. Graph: `rounds` interleaved rounds of do_bench, graph_ms their median and graph_spread
    (max - min) / median. Each lab backend's output on the first set is compared bit for bit with fast's
    (bit_equal_fast) and its replays with its own (replays_equal). The shapes are the run's (--shapes); the table
    so far is written after each one, so a call cut short keeps the shapes it finished."""
    import torch
    backends, bw = ctx.timed(), ctx.bandwidth()
    rows = []
    for B, T in ctx.bench_shapes():
        sets = input_sets(B, T)
        tokens = tokens_of(B, T)
        floor_ms = floor_bytes(sets[0]) / bw * 1e3
        equal = against_fast(call_kwargs(sets[0], "fast"), backends)
        calls = {be: backend_calls(be, sets) for be in backends}
        eager, errors = eager_paired(calls)
        graphs: dict = {be: [] for be in backends}
        for _ in range(rounds):
            for be in backends:
                if be not in errors:
                    graphs[be].append(graph_time(calls[be]))
        for be in backends:
            if be in errors:
                rows.append(dict(backend=be, implementation=implementation(be), B=B, T=T, tokens=tokens,
                                 error=errors[be]))
                continue
            ms = float(np.median(eager[be]))
            g = np.array(graphs[be], dtype=float)
            gms = float(np.median(g))
            q1, q3 = np.percentile(eager[be], [25, 75])
            rows.append(dict(backend=be, implementation=implementation(be), B=B, T=T if T else tokens,
                             tokens=tokens, ms=ms, graph_ms=gms,
                             ms_iqr=float((q3 - q1) / ms), graph_spread=float(np.ptp(g) / gms),
                             eager_samples=len(eager[be]), eager_method=EAGER_METHOD, rounds=len(g),
                             seed=f"0..{len(sets) - 1} (rotated sets)",
                             tokens_per_s=tokens / (min(ms, gms if gms == gms else ms) * 1e-3),
                             floor_ms=floor_ms, bit_equal_fast=equal.get(be, {}).get("bit_equal_fast"),
                             replays_equal=equal.get(be, {}).get("replays_equal"),
                             error=""))
            log("bench", be, B, T, round(ms, 4), round(gms, 4), "iqr", round(rows[-1]["ms_iqr"], 3))
        del sets, calls
        torch.cuda.empty_cache()
        ctx.checkpoint(OUTPUT, _frame(rows, bw, ctx))
    return _frame(rows, bw, ctx)


def _frame(rows: list[dict[str, Any]], bw: float, ctx: Context) -> pd.DataFrame:
    """The bench rows as the part's table: the copy bandwidth and the run's environment on every row."""
    df = pd.DataFrame(rows)
    df["copy_bw_GBps"] = bw / 1e9
    return stamp(df, ctx.env)
