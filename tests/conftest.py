"""Shared fixtures for the foundation tests: small seeded float64 problems."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from gdnlab.inputs import GDNInputs, make_inputs


def small_inputs(**kw: Any) -> GDNInputs:
    """make_inputs with small shapes (H=2, HV=4, K=V=32) in float64, slow gate; any argument can be overridden."""
    args: dict[str, Any] = dict(T=20, H=2, HV=4, K=32, V=32, dtype=torch.float64, state_dtype=torch.float64,
                                regime="decay", decay=0.05, h0_scale=0.5)
    args.update(kw)
    return make_inputs(**args)


@pytest.fixture
def small() -> Callable[..., GDNInputs]:
    """Factory fixture: ``small(T=..., seqlens=..., ...)`` -> GDNInputs (see :func:`small_inputs`)."""
    return small_inputs


def clone_all(kw: dict[str, Any]) -> dict[str, Any]:
    """Deep copies of every tensor in a kwargs dict (to check later that a call left its inputs unchanged)."""
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}


def assert_unchanged(before: dict[str, Any], after: dict[str, Any]) -> None:
    """Every tensor in ``after`` equals (bitwise, same dtype and shape) its copy in ``before``."""
    for k, v in before.items():
        if isinstance(v, torch.Tensor):
            w = after[k]
            assert w.dtype == v.dtype and w.shape == v.shape and torch.equal(w, v), f"{k} was modified"
