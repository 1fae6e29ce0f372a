"""How the device benchmarks time a call: CUDA-graph replay (device time only), eager calls sampled one at a time
from an idle GPU (device time plus the host's launch span), do_bench windows, and host wall time per call.

Eager samples start from an idle GPU because a lone call in a model starts so too: sampled between other calls
without synchronising, a host-bound call's host work hides behind the device work queued before it (docs/speed-notes.md
items 18-19 show how much that changes FLA's eager time).
"""
from __future__ import annotations

import itertools
import random
import time
from typing import Any, Callable, Sequence

import numpy as np

import gdnlab
from benchmarks.inputs import DEV, call_kwargs, parse_label
from gdnlab.speed import SYNCED

#: How eager_paired samples, written into bench.csv and env.json (gdnlab.speed.eager_method reads it).
EAGER_METHOD = SYNCED


def copy_bandwidth() -> float:
    """The device's copy bandwidth in bytes per second (bytes read + written), the memory floor's yardstick."""
    import torch
    import triton
    x = torch.empty(2 * 1024 ** 3 // 2, dtype=torch.bfloat16, device=DEV).normal_()
    y = torch.empty_like(x)
    ms = triton.testing.do_bench(lambda: y.copy_(x), warmup=50, rep=200, return_mode="median")
    return 2 * x.numel() * 2 / (ms * 1e-3)


def backend_calls(be: str, sets: Sequence[Any], **opts: Any) -> list[Callable[[], Any]]:
    """One call per input set, on backend label `be` (a name, or a name with options: inputs.parse_label)."""
    name, fixed = parse_label(be)
    opts = {**fixed, **opts}
    return [lambda kw=call_kwargs(x, be): gdnlab.chunk_gated_delta_rule(**kw, backend=name, **opts) for x in sets]


def capture(calls: Sequence[Callable[[], Any]]) -> list[Any]:
    """One CUDA graph per call, each captured after a warm-up call."""
    return [gr for gr, _ in capture_with_outputs(calls)]


def capture_with_outputs(calls: Sequence[Callable[[], Any]]) -> list[tuple[Any, Any]]:
    """capture, each graph with what its captured call returned (the tensors every replay writes)."""
    import torch
    graphs = []
    for c in calls:
        c()
        torch.cuda.synchronize()
        gr = torch.cuda.CUDAGraph()
        with torch.cuda.graph(gr):
            out = c()
        graphs.append((gr, out))
    return graphs


def graph_time(calls: Sequence[Callable[[], Any]]) -> float:
    """Median time of replaying the calls' CUDA graphs in turn (nan when a call cannot be captured)."""
    import triton
    from benchmarks.env import log
    try:
        git = itertools.cycle(capture(calls))
        return triton.testing.do_bench(lambda: next(git).replay(), warmup=25, rep=100, return_mode="median")
    except Exception as e:  # noqa: BLE001
        log("graph capture failed", repr(e)[:200])
        return float("nan")


def graph_ms(fn: Callable[[], Any]) -> float:
    """Device time of one call of fn, replayed from a CUDA graph (median of triton.testing.do_bench)."""
    import triton
    return triton.testing.do_bench(capture([fn])[0].replay, warmup=25, rep=100, return_mode="median")


def time_backend(be: str, sets: Sequence[Any], **opts: Any) -> tuple[float, float]:
    """(eager, graph) median ms of backend `be` over the input sets: eager in one do_bench window, graph in replay."""
    import triton
    calls = backend_calls(be, sets, **opts)
    it = itertools.cycle(calls)
    eager = triton.testing.do_bench(lambda: next(it)(), warmup=25, rep=100, return_mode="median")
    return eager, graph_time(calls)


def eager_paired(calls: dict[str, list[Callable[[], Any]]], reps: int = 200,
                 warmup: int = 5) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Eager time of every backend's call, sampled call by call with the backends in a fresh shuffled order each
    repetition, so that host drift (seconds long, up to 2x) hits every backend alike. Each sample is what do_bench
    times: L2 flushed, then the GPU time from an event before the call to one after it, which for a host-bound call
    is the host's launch span. Each sample starts from an idle GPU (synchronised first), as a lone call does.
    Returns (samples in ms by backend, error by backend)."""
    import torch
    flush = torch.empty(256 * 1024 ** 2 // 4, dtype=torch.int32, device=DEV)
    its = {be: itertools.cycle(c) for be, c in calls.items()}
    errors = {}
    for be in list(its):
        try:
            for _ in range(warmup):
                next(its[be])()
        except Exception as e:  # noqa: BLE001
            errors[be] = repr(e)[:300]
            del its[be]
    torch.cuda.synchronize()
    names, events = list(its), {be: [] for be in its}
    rng = random.Random(0)
    for _ in range(reps):
        rng.shuffle(names)
        for be in names:
            torch.cuda.synchronize()
            flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            next(its[be])()
            end.record()
            events[be].append((start, end))
    torch.cuda.synchronize()
    return {be: np.array([a.elapsed_time(b) for a, b in ev]) for be, ev in events.items()}, errors


def host_walls(call: Callable[[], Any], n: int, windows: int = 5, warmup: int = 20) -> list[float]:
    """Host us per call in each of `windows` windows: the wall time of `n` back-to-back calls, synchronised at the
    end of the window, over n (after `warmup` calls)."""
    import torch
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    walls = []
    for _ in range(windows):
        t0 = time.perf_counter()
        for _ in range(n):
            call()
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t0) / n * 1e6)
    return walls
