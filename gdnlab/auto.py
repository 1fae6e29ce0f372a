"""The "auto" backend: a written rule, learned from reports/h200/bench.csv, that picks the fastest correct backend
for a call from its shape and context, without timing anything per call.

What the H200 benchmark (Qwen3-Next layer shape) showed, and the rule it gives:
- Replayed in a CUDA graph, device time is all that counts: flash-linear-attention ("fla") is fastest from 1024
  tokens up (for 8 x 2048 "fast" is 3% faster); at 512 tokens the two-kernel path ties with it. fla cannot be
  captured with cu_seqlens (it copies them to the host), so a captured varlen call goes to the lab.
- Called eagerly, fla pays ~0.8-1 ms of host work per call, so the lab's kernels win up to 16384 tokens and fla
  from 32768 on; the switch sits between the two measured sizes (``EAGER_FLA_FROM``). Below ~4096 tokens every
  lab path is host-bound (0.28-0.40 ms, run-to-run noise of the same size). A ragged batch runs faster on the lab's
  kernels eagerly too.
- Without CUDA or without fla, the lab's "fast" configuration is the only candidate.
"""
from __future__ import annotations

from typing import Any

import torch

#: Fewest tokens (B*T) from which an eager call goes to fla: between the measured 16384 (lab faster) and 32768.
EAGER_FLA_FROM = 24576
#: Fewest tokens from which a call captured in a CUDA graph goes to fla (the setting reports/h200/bench.csv measured).
GRAPH_FLA_FROM = 1024
#: The lab's backend the rule falls back on.
LAB = "fast"


def choose(tokens: int, varlen: bool, on_cuda: bool, capturing: bool, fla_ok: bool) -> str:
    """The backend name for a call of `tokens` tokens (B*T); see the module docstring for where the rule comes
    from."""
    if not (on_cuda and fla_ok) or varlen:
        return LAB
    return "fla" if tokens >= (GRAPH_FLA_FROM if capturing else EAGER_FLA_FROM) else LAB


def auto_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                 **kw: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run the backend `choose` names for this call (same signature as every backend), through the public entry
    point, which validates the inputs unless that backend does."""
    from gdnlab.backends import BACKENDS, chunk_gated_delta_rule

    on_cuda = q.is_cuda
    capturing = on_cuda and torch.cuda.is_current_stream_capturing()
    name = choose(int(q.shape[0] * q.shape[1]), kw.get("cu_seqlens") is not None, on_cuda, capturing,
                  "fla" in BACKENDS)
    if name == "fla":
        kw.pop("poison", None)  # an option of the lab's kernels only
    return chunk_gated_delta_rule(q, k, v, g, beta, backend=name, **kw)


auto_backend.validates_itself = True  # the entry point validates for the backend it picks
