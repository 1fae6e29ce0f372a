"""The one assembly of the lab's chunked pipeline: flatten the inputs, run the prologue, walk the state and write the
outputs (docs/design.md §2-§3). Every caller that runs the lab's kernels (gdnlab.backends, gdnlab.arch_study, the
device benchmarks) goes through these stage calls; each returns tensors, so a caller can run one stage once and the
next many times (arch_study shares one prologue between the fused variants).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from gdnlab.kernels.fused import fused
from gdnlab.kernels.prologue import ChunkPlan, Prologue, alloc, run_prologue
from gdnlab.kernels.two_kernel import two_kernel
from gdnlab.validate import Problem, check_inputs

#: The q/k/v dtypes the lab's Triton kernels take (others are refused at the entry point, naming q).
KERNEL_DTYPES = (torch.bfloat16,)
#: The state-and-output stages the pipeline can end with.
PATHS = ("two_kernel", "fused")


@dataclass
class Flat:
    """A call's inputs flattened to ``[tokens, heads, D]`` rows (g in fp32), with its chunk plan and initial state."""

    problem: Problem
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    plan: ChunkPlan
    h0: torch.Tensor | None
    key: tuple | None = None  # the call's signature (None where it has none); gdnlab.plans keys on it


def flatten(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, *,
            scale: float | None = None, initial_state: torch.Tensor | None = None,
            cu_seqlens: torch.Tensor | None = None, state_v_first: bool = False, output_final_state: bool = False,
            use_qk_l2norm_in_kernel: bool = False) -> Flat:
    """Validate a call (gdnlab.validate.check_inputs; q, k, v in KERNEL_DTYPES) and give the kernels' view of it:
    batch and time merged into one token axis (docs/design.md §5), the chunk plan built.

    The check depends only on the arguments' types, shapes, dtypes and devices, the options, and cu_seqlens's
    values, so its verdict and plan are remembered by exactly that (:func:`signature`): a repeated call is checked
    in full in the time it takes to build the key."""
    key = signature(q, k, v, g, beta, initial_state, cu_seqlens, scale, state_v_first, output_final_state,
                    use_qk_l2norm_in_kernel)
    checked = _CHECKED.get(key) if key is not None else None
    if checked is None:
        p = check_inputs(q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                         state_v_first=state_v_first, output_final_state=output_final_state,
                         use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, dtypes=KERNEL_DTYPES)
        checked = p, ChunkPlan.build(p.seq_bounds, q.device)
        if key is not None:
            if len(_CHECKED) >= _CHECKED_LIMIT:
                _CHECKED.pop(next(iter(_CHECKED)))
            _CHECKED[key] = checked
    p, plan = checked
    tokens = p.B * p.T

    def rows(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if x.dtype == dtype and x.is_contiguous():
            return x.view(tokens, *x.shape[2:])
        return x.reshape(tokens, *x.shape[2:]).to(dtype).contiguous()

    return Flat(p, rows(q, q.dtype), rows(k, k.dtype), rows(v, v.dtype), rows(g, torch.float32),
                rows(beta, beta.dtype), plan, initial_state.contiguous() if initial_state is not None else None,
                key)


#: Validated calls by signature: (Problem, ChunkPlan).
_CHECKED: dict[tuple, tuple[Problem, ChunkPlan]] = {}
_CHECKED_LIMIT = 256


def signature(q: Any, k: Any, v: Any, g: Any, beta: Any, initial_state: Any, cu_seqlens: Any, scale: Any,
              *flags: Any) -> tuple | None:
    """Everything check_inputs's verdict depends on, hashable; None when some argument is not what it takes (the
    check then runs, and refuses it). cu_seqlens enters by its values (a device copy is read, as the check does)."""
    def meta(x: Any) -> tuple | None:
        return (x.shape, x.dtype, x.device) if isinstance(x, torch.Tensor) else None

    tensors = (q, k, v, g, beta)
    if not all(isinstance(x, torch.Tensor) for x in tensors) or not all(
            x is None or isinstance(x, torch.Tensor) for x in (initial_state, cu_seqlens)):
        return None
    if (cu_seqlens is not None and cu_seqlens.dim() != 1) or not all(type(f) is bool for f in flags) or not (
            scale is None or (isinstance(scale, (int, float)) and not isinstance(scale, bool))):
        return None
    cu = None if cu_seqlens is None else (meta(cu_seqlens), tuple(cu_seqlens.tolist()))
    return (*map(meta, tensors), meta(initial_state), cu, type(scale), scale, *((type(f), f) for f in flags))


def prologue(x: Flat, use_qk_l2norm: bool, poison: bool = False, **options: Any) -> Prologue:
    """The shared prologue (l2-norm, cumulative gate, A, T, W, U) on flattened inputs; `options` are
    :func:`gdnlab.kernels.prologue.run_prologue`'s."""
    return run_prologue(x.q, x.k, x.v, x.g, x.beta, x.plan, use_qk_l2norm, poison, **options)


def allocate_outputs(x: Flat, output_final_state: bool, state_v_first: bool,
                     poison: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The flat output ``[tokens, HV, V]`` in q's dtype and the fp32 final state (or None), NaN-filled with
    `poison` so that an element no kernel writes stays visible."""
    p = x.problem
    o = alloc((p.B * p.T, p.HV, p.V), p.dtype, p.device, poison)
    ht = None
    if output_final_state:
        shape = (p.N, p.HV, p.V, p.K) if state_v_first else (p.N, p.HV, p.K, p.V)
        ht = alloc(shape, torch.float32, p.device, poison)
    return o, ht


def walk(x: Flat, pro: Prologue, path: str, o: torch.Tensor, ht: torch.Tensor | None, *, state_v_first: bool,
         BV: int, poison: bool = False, **options: Any) -> None:
    """Carry the state across the chunks and write the outputs into `o` (and the final state into `ht`) with `path`
    ("two_kernel": a state kernel then an output kernel; "fused": one kernel); `options` are that path's."""
    p = x.problem
    if path == "fused":
        fused(pro, x.v, o, x.plan, x.h0, ht, p.scale, state_v_first, BV=BV, **options)
    elif path == "two_kernel":
        two_kernel(pro, x.v, o, x.plan, x.h0, ht, p.scale, state_v_first, BV=BV, poison=poison, **options)
    else:
        raise ValueError(f"path: must be one of {', '.join(PATHS)}, got {path!r}")


def state_and_outputs(x: Flat, pro: Prologue, path: str, *, output_final_state: bool, state_v_first: bool,
                      BV: int, poison: bool = False, **options: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """allocate_outputs, walk, and the padding rows of a ragged buffer zeroed. Returns ``o`` as ``[B, T, HV, V]``
    and the fp32 final state or None."""
    p = x.problem
    o, ht = allocate_outputs(x, output_final_state, state_v_first, poison)
    walk(x, pro, path, o, ht, state_v_first=state_v_first, BV=BV, poison=poison, **options)
    return shaped_output(p, o), ht


def shaped_output(p: Problem, o: torch.Tensor) -> torch.Tensor:
    """The flat output `o` with a ragged buffer's padding rows (past the last sequence) zeroed, as
    ``[B, T, HV, V]``."""
    end = p.seq_bounds[-1][1] if p.seq_bounds else 0
    if end < p.B * p.T:
        o[end:] = 0
    return o.view(p.B, p.T, p.HV, p.V)
