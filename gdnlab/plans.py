"""Call plans: a repeated call of the lab's Triton pipeline replayed from what its first call launched.

At small sizes a call's time is the host's: binding options, building the prologue and state stages, allocating
eight buffers and launching four kernels cost more than the kernels run. Everything but the tensors' addresses is
fixed by the call's signature (:func:`gdnlab.kernels.pipeline.signature`: shapes, dtypes, devices, options,
cu_seqlens values), so the first call with a signature runs the pipeline as usual while its launches are recorded
(:func:`gdnlab.interp.recorded_launches`), and :func:`record` turns them into a :class:`Plan`: each launch with every
tensor argument replaced by a slot (one of the flattened inputs, a buffer the pipeline allocated, or a chunk-plan
tensor that the signature fixes) and, on CUDA, the compiled kernel's handle (gdnlab.handles). :func:`replay` then
allocates the outputs, takes the intermediate buffers from a workspace, and launches.

The workspace is one byte buffer per (device, stream, thread), as large as the largest plan's intermediates up to
:data:`WORKSPACE_BYTES` (larger calls allocate theirs, as a first call does): calls on one stream run in order,
so a buffer one call's kernels have finished with can be the next call's; a call being captured into a CUDA graph
allocates its own (from the graph's pool). A plan is built only when every tensor a launch takes is accounted for;
otherwise the call keeps running the pipeline. Poisoned calls never use plans (their buffers are NaN-filled).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from gdnlab import handles, interp
from gdnlab.kernels.pipeline import Flat, shaped_output

__all__ = ["Plan", "Step", "WORKSPACE_BYTES", "key", "lookup", "record", "replay", "clear", "cached_plans"]

#: Largest workspace (bytes) a plan's intermediates are taken from; larger calls allocate theirs per call.
WORKSPACE_BYTES = 64 << 20
#: Plans kept (least recently used dropped first).
LIMIT = 256
#: Byte alignment of each intermediate inside the workspace (Triton specialises pointers on 16).
ALIGN = 256
#: Slot sources: the call's flattened inputs (Flat.q, k, v, g, beta, h0), the plan's buffers.
INPUT, BUFFER = 0, 1


@dataclass(frozen=True)
class Step:
    """One recorded launch: `base` is its positional arguments with None where `slots` put a tensor
    ``(position, INPUT or BUFFER, index)``; `handle` is its compiled launch (gdnlab.handles.entry) or None."""

    kernel: Any
    grid: tuple[int, ...]
    kwargs: dict[str, Any]
    base: tuple[Any, ...]
    slots: tuple[tuple[int, int, int], ...]
    handle: tuple | None


@dataclass
class Plan:
    """A call's launches and buffers (shape, dtype); `output` and `state` are the indices of the flat output and
    the final state (None when not asked for) among the buffers, the others are intermediates at `offsets` (bytes)
    in a workspace of `workspace_bytes`."""

    device: torch.device
    steps: tuple[Step, ...]
    buffers: tuple[tuple[tuple[int, ...], torch.dtype], ...]
    output: int
    state: int | None
    offsets: dict[int, int]
    workspace_bytes: int
    views: dict[tuple, tuple[torch.Tensor, dict[int, torch.Tensor]]] = field(default_factory=dict)


_PLANS: OrderedDict[tuple, Plan | None] = OrderedDict()
_POOLS: dict[tuple, torch.Tensor] = {}


def _inputs(x: Flat) -> tuple[torch.Tensor | None, ...]:
    return x.q, x.k, x.v, x.g, x.beta, x.h0


def key(token: Any, x: Flat, options: dict[str, Any]) -> tuple | None:
    """The plan key of a call: `token` (which backend), the call's signature, its options, and its inputs'
    16-byte alignment (Triton specialises on it); None when the call cannot use a plan (no signature, poison,
    launches being recorded for another target, or unhashable options)."""
    if x.key is None or options.get("poison") or interp._RECORDING:
        return None
    k = (token, x.key, tuple(options.items()),
         tuple(t.data_ptr() & 15 if t is not None else None for t in _inputs(x)))
    try:
        hash(k)
    except TypeError:
        return None
    return k


def lookup(k: tuple | None) -> Plan | None:
    """The plan recorded under `k`, or None."""
    if k is None:
        return None
    plan = _PLANS.get(k)
    if plan is not None:
        _PLANS.move_to_end(k)
    return plan


def _whole(t: torch.Tensor) -> bool:
    """t is a whole allocation of its own (as gdnlab.kernels.prologue.alloc makes): contiguous, from its storage's
    first byte to its last."""
    return (t.is_contiguous() and t.storage_offset() == 0
            and t.untyped_storage().nbytes() == t.numel() * t.element_size())


def _build(launches: list, x: Flat, o: torch.Tensor, ht: torch.Tensor | None, made: list[torch.Tensor]
           ) -> Plan | None:
    """The plan of these launches, or None where some tensor argument is neither an input, nor the chunk plan's,
    nor one the call made itself (`made`): replaying it from a workspace would hand the kernel other memory."""
    inputs = {id(t): i for i, t in enumerate(_inputs(x)) if t is not None}
    fixed = {id(t) for t in x.plan.tensors()}
    own = {id(t) for t in made}
    found: dict[int, int] = {}
    buffers: list[torch.Tensor] = []
    steps = []
    for L in launches:
        base, slots = list(L.args), []
        for pos, a in enumerate(L.args):
            if not isinstance(a, torch.Tensor) or id(a) in fixed:
                continue
            if id(a) in inputs:
                slots.append((pos, INPUT, inputs[id(a)]))
            else:
                if id(a) not in found:
                    if id(a) not in own or not _whole(a):
                        return None
                    found[id(a)] = len(buffers)
                    buffers.append(a)
                slots.append((pos, BUFFER, found[id(a)]))
            base[pos] = None
        handle = handles.entry(L.kernel, L.grid, L.args, L.kwargs) if x.q.is_cuda else None
        steps.append(Step(L.kernel, L.grid, L.kwargs, tuple(base), tuple(slots), handle))
    at = {b.data_ptr(): i for i, b in enumerate(buffers)}
    out = at.get(o.data_ptr())
    state = None if ht is None else at.get(ht.data_ptr())
    if out is None or buffers[out].numel() != o.numel() or (ht is not None and state is None):
        return None
    offsets, size = {}, 0
    for i, b in enumerate(buffers):
        if i not in (out, state):
            offsets[i] = size
            size += -(-b.numel() * b.element_size() // ALIGN) * ALIGN
    return Plan(o.device, tuple(steps), tuple((tuple(b.shape), b.dtype) for b in buffers), out, state, offsets,
                size)


def record(k: tuple | None, x: Flat, run: Callable[[], tuple[torch.Tensor, torch.Tensor | None]]
           ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run the pipeline (`run` returns ``(o as [B, T, HV, V], final state or None)``) and, when `k` is a key,
    record its launches as the plan for `k` (None is remembered where no plan can be built, so the call is not
    recorded again)."""
    if k is None or k in _PLANS:
        return run()
    with interp.recorded_launches(run=True) as launches:
        o, ht = run()
        made = interp.made_tensors()
    if len(_PLANS) >= LIMIT:
        _PLANS.popitem(last=False)
    _PLANS[k] = _build(launches, x, o, ht, made)
    return o, ht


def _stream_key(device: torch.device) -> tuple:
    if device.type != "cuda":
        return device.type, 0, threading.get_ident()
    index = torch._C._cuda_getDevice() if device.index is None else device.index
    return index, torch._C._cuda_getCurrentRawStream(index), threading.get_ident()


def _intermediates(plan: Plan, sk: tuple) -> dict[int, torch.Tensor]:
    """Index -> tensor for the plan's intermediates: views into the workspace of `sk` (:func:`_stream_key`), or
    fresh buffers for a large plan or a call being captured into a CUDA graph."""
    dev = plan.device
    if plan.workspace_bytes > WORKSPACE_BYTES or (dev.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        return {i: torch.empty(plan.buffers[i][0], dtype=plan.buffers[i][1], device=dev) for i in plan.offsets}
    pool = _POOLS.get(sk)
    if pool is None or pool.numel() < plan.workspace_bytes:
        pool = torch.empty(max(plan.workspace_bytes, ALIGN), dtype=torch.uint8, device=dev)
        _POOLS[sk] = pool
        for p in _PLANS.values():  # views into the old pool would keep it alive
            if p is not None:
                p.views.pop(sk, None)
    cached = plan.views.get(sk)
    if cached is None or cached[0] is not pool:
        views = {}
        for i, off in plan.offsets.items():
            shape, dtype = plan.buffers[i]
            n = 1
            for s in shape:
                n *= s
            views[i] = pool[off:off + n * dtype.itemsize].view(dtype).view(shape)
        cached = plan.views[sk] = (pool, views)
    return cached[1]


def replay(plan: Plan, x: Flat) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The call `x` by `plan`: its outputs allocated, its intermediates from the workspace, its launches made
    through their compiled handles (Triton's path where there is none, or while a launch hook is installed).
    Returns ``(o as [B, T, HV, V], final state or None)``."""
    dev = plan.device
    sk = _stream_key(dev)
    bufs = dict(_intermediates(plan, sk))
    shape, dtype = plan.buffers[plan.output]
    o = bufs[plan.output] = torch.empty(shape, dtype=dtype, device=dev)
    ht = None
    if plan.state is not None:
        shape, dtype = plan.buffers[plan.state]
        ht = bufs[plan.state] = torch.empty(shape, dtype=dtype, device=dev)
    sources = (_inputs(x), bufs)
    direct = dev.type == "cuda" and not handles.hooks_installed()
    stream = sk[1]
    for s in plan.steps:
        args = list(s.base)
        for pos, src, i in s.slots:
            args[pos] = sources[src][i]
        if direct and s.handle is not None:
            call, head, tail = s.handle
            g = s.grid
            call(g[0], g[1] if len(g) > 1 else 1, g[2] if len(g) > 2 else 1, stream, *head, *args, *tail)
        else:
            interp.launch(s.kernel, s.grid, *args, device=dev, **s.kwargs)
    return shaped_output(x.problem, o), ht


def clear() -> None:
    """Forget every plan and workspace."""
    _PLANS.clear()
    _POOLS.clear()


def cached_plans() -> int:
    """How many call signatures have a plan (or are known to have none)."""
    return len(_PLANS)
