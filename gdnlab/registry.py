"""The registry of backends and the public entry point that dispatches to them.

`chunk_gated_delta_rule(..., backend=NAME)` validates its inputs once (unless the backend validates them itself) and
hands them to the callable registered under NAME. This module holds no backend: gdnlab.backends registers the
built-in ones (importing `gdnlab` or `gdnlab.backends` does that), and a user registers their own kernel with
`register_backend(name, fn)`; everything in the lab (cases, sweeps, notebooks, `gdnlab reproduce --backend`) then
runs on it.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from gdnlab.validate import check_inputs

Backend = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]

_REGISTRY: dict[str, Backend] = {}
#: Names of every backend that can be asked for now (built-in and registered).
BACKENDS: list[str] = []
#: Backends the lab knows but cannot run here, with the reason (e.g. a peer whose package is not installed).
UNAVAILABLE: dict[str, str] = {}


def register_backend(name: str, fn: Backend, *, overwrite: bool = False) -> None:
    """Make `fn` (same signature as `chunk_gated_delta_rule`, minus `backend`) available under `name`."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"name: must be a non-empty str, got {name!r}")
    if not callable(fn):
        raise TypeError(f"fn: must be callable, got {type(fn).__name__}")
    if name in _REGISTRY and not overwrite:
        raise ValueError(f"name: backend {name!r} is already registered (pass overwrite=True to replace it)")
    _REGISTRY[name] = fn
    UNAVAILABLE.pop(name, None)
    if name not in BACKENDS:
        BACKENDS.append(name)


def get_backend(name: str) -> Backend:
    """The callable behind a backend name; ValueError naming the known ones otherwise."""
    if not isinstance(name, str):
        raise TypeError(f"backend: must be a str, got {type(name).__name__}")
    if name not in _REGISTRY:
        import gdnlab.backends  # noqa: F401  (registers the built-in backends and the peers on first use)
    if name not in _REGISTRY:
        if name in UNAVAILABLE:
            raise ValueError(f"backend: {name!r} is not available here: {UNAVAILABLE[name]}")
        raise ValueError(f"backend: unknown backend {name!r}; known: {', '.join(BACKENDS)}")
    return _REGISTRY[name]


def chunk_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                           scale: float | None = None, initial_state: torch.Tensor | None = None,
                           output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
                           cu_seqlens: torch.Tensor | None = None, state_v_first: bool = False,
                           backend: str = "two_kernel", **options: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated DeltaNet prefill (the recurrence of docs/design.md §1, the contract of §5) on the named backend.
    Returns (o, final state or None).

    Dtypes: the lab's Triton backends take bf16 q, k, v (fp16/fp32 are refused with a TypeError naming q); the
    "reference" backend takes any floating dtype. Unusual but legal values are computed, not refused: g > 0 (the
    state grows), beta outside [0, 1], non-finite inputs (see gdnlab.validate.check_inputs)."""
    fn = get_backend(backend)
    if not getattr(fn, "validates_itself", False):
        check_inputs(q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                     state_v_first=state_v_first, output_final_state=output_final_state,
                     use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
    return fn(q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
              use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens, state_v_first=state_v_first,
              **options)
