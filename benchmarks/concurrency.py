"""How much of a call leaves the GPU idle: two independent calls of one backend, each replayed from its own CUDA
graph, once one after the other on one stream and once side by side on two streams (speed notes item 44). A pair
that takes much less side by side than in turn has idle resources in each call (fast's state kernel walks one
program per V tile and value head, bound by its dependent chain), which a call that overlaps its own stages by chunk
ranges could fill."""
from __future__ import annotations

import pandas as pd

from benchmarks.context import Context
from benchmarks.env import log, stamp
from benchmarks.inputs import input_sets, tokens_of
from benchmarks.timing import backend_calls, capture_with_outputs

OUTPUT = "concurrency.csv"
#: One sequence where fast's walk has one program per multiprocessor, and the two batches of the bench shapes.
SHAPES = [(1, 8192), (1, 32768), (8, 2048), (4, 8192)]


def run(ctx: Context, backends: tuple[str, ...] = ("fast",)) -> pd.DataFrame:
    """Per shape and backend (the run's --backends when given): median ms of one replay, of two in turn and of two
    side by side (triton's do_bench, as benchmarks.timing.graph_time: events on the current stream around the whole
    pair, the L2 flushed before each sample), and whether every output after the side by side replays equals the
    same graph's output replayed alone."""
    backends = tuple(ctx.backends) if ctx.backends else backends
    import torch
    import triton

    rows = []
    streams = torch.cuda.Stream(), torch.cuda.Stream()
    for B, T in SHAPES:
        sets = input_sets(B, T)[:2]
        for be in backends:
            try:
                (g0, out0), (g1, out1) = capture_with_outputs(backend_calls(be, sets))
                alone = []
                for gr, out in ((g0, out0), (g1, out1)):
                    gr.replay()
                    torch.cuda.synchronize()
                    alone.append([t.clone() for t in _written(out)])

                def side_by_side() -> None:
                    main = torch.cuda.current_stream()
                    for s, gr in zip(streams, (g0, g1)):
                        s.wait_stream(main)
                        with torch.cuda.stream(s):
                            gr.replay()
                    for s in streams:
                        main.wait_stream(s)

                times = {name: triton.testing.do_bench(fn, warmup=10, rep=100, return_mode="median") for name, fn in (
                    ("one_ms", g0.replay), ("in_turn_ms", lambda: (g0.replay(), g1.replay())),
                    ("side_by_side_ms", side_by_side))}
                side_by_side()
                torch.cuda.synchronize()
                equal = all(torch.equal(a, b) for out, ref in zip((out0, out1), alone)
                            for a, b in zip(_written(out), ref))
                rows.append(dict(backend=be, B=B, T=T, tokens=tokens_of(B, T), **times,
                                 side_by_side_over_in_turn=times["side_by_side_ms"] / times["in_turn_ms"],
                                 outputs_equal=equal))
            except Exception as e:  # noqa: BLE001
                rows.append(dict(backend=be, B=B, T=T, tokens=tokens_of(B, T), error=repr(e)[:300]))
            log("concurrency", rows[-1])
        del sets
        torch.cuda.empty_cache()
    return stamp(pd.DataFrame(rows), ctx.env)


def _written(out: tuple) -> list:
    """The tensors a call returned (the final state is None when not asked for)."""
    return [t for t in out if t is not None]
