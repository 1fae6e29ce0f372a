"""gdnlab: accuracy and speed of chunked Gated DeltaNet prefill kernels, on GPU and on CPU."""
from __future__ import annotations

import importlib
from typing import Any

__all__ = ["BACKENDS", "chunk_gated_delta_rule", "register_backend", "reference"]


def __getattr__(name: str) -> Any:
    # Loaded on first use so that `import gdnlab.reference` does not pull in Triton.
    if name in ("BACKENDS", "chunk_gated_delta_rule", "register_backend"):
        return getattr(importlib.import_module("gdnlab.backends"), name)
    try:
        return importlib.import_module(f"gdnlab.{name}")
    except ModuleNotFoundError:
        raise AttributeError(f"module 'gdnlab' has no attribute {name!r}") from None
