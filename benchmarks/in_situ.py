"""Device time of every kernel inside one whole call, replayed from a CUDA graph under torch.profiler (CUPTI traces
a graph's kernels), per bench shape and backend: what each stage costs where it runs cold, next to the time of the
same replays (the rest is gaps between kernels)."""
from __future__ import annotations

from typing import Any

import pandas as pd

from benchmarks.context import Context
from benchmarks.env import log, stamp
from benchmarks.inputs import QWEN, input_sets, lengths_of, parse_label, tokens_of
from benchmarks.timing import backend_calls, capture

OUTPUT = "in_situ.csv"


def output_layout(label: str, B: Any, T: Any, sms: int) -> dict[str, Any]:
    """How a fast-labelled backend writes its output at this bench shape (gdnlab.backends.fast_options), for
    gdnlab.traffic's byte count: its output blocks (`out_chunks`, chunks per output program) and whether the state
    kernel writes the output (`fused_output`) and the prologue stores T only (`walk_t`); None for each for other
    backends."""
    from gdnlab.backends import fast_options
    from gdnlab.traffic import LAYOUT
    name, opts = parse_label(label)
    if name != "fast":
        return dict.fromkeys(LAYOUT)
    got = fast_options(lengths_of(B, T), HV=QWEN["HV"], V=QWEN["V"], sms=sms, **opts)
    return {n: type(d)(got.get(n, d)) for n, d in LAYOUT.items()}


def run(ctx: Context, backends: tuple[str, ...] = ("fast", "fla")) -> pd.DataFrame:
    """The in-situ profile of `backends` (the run's --backends when given) at every bench shape (see the module
    docstring)."""
    backends = tuple(ctx.backends) if ctx.backends else backends
    import torch
    from torch.profiler import ProfilerActivity, profile

    rows = []
    reps = 20
    for B, T in ctx.bench_shapes():
        sets = input_sets(B, T)
        tokens = tokens_of(B, T)
        for be in backends:
            try:
                graphs = capture(backend_calls(be, sets))
                for gr in graphs:
                    gr.replay()
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    start.record()
                    for i in range(reps):
                        graphs[i % len(graphs)].replay()
                    end.record()
                    torch.cuda.synchronize()
                span = start.elapsed_time(end) / reps
                for ev in prof.key_averages():
                    t = getattr(ev, "self_device_time_total", None)
                    t = getattr(ev, "self_cuda_time_total", 0) if t is None else t
                    if t:
                        rows.append(dict(backend=be, B=B, T=T if T else tokens, tokens=tokens, kernel=ev.key[:120],
                                         calls_per_call=ev.count / reps, us_per_call=t / reps,
                                         call_ms_profiled=span, **output_layout(be, B, T, ctx.env["sms"])))
            except Exception as e:  # noqa: BLE001
                rows.append(dict(backend=be, B=B, T=T, tokens=tokens, error=repr(e)[:300]))
            log("in situ", be, B, T, sum(r.get("us_per_call", 0) for r in rows if r["backend"] == be
                                         and r["B"] == B and r["tokens"] == tokens))
        del sets
        torch.cuda.empty_cache()
    df = pd.DataFrame(rows)
    return stamp(df, ctx.env)
