"""The "auto" backend: a written rule, learned from reports/h200/bench.csv, that picks the fastest correct backend
for a call from its shape and context, without timing anything per call.

What the H200 benchmark (Qwen3-Next layer shape, 2026-12-02, with "fast" at its stage-study configuration) showed,
and the rule it gives:
- Replayed in a CUDA graph, device time is all that counts: "fast" is faster than flash-linear-attention ("fla")
  from 2048 tokens up and on a batch of 8 x 2048; below that they tie or fla is a few percent faster (512 tokens:
  0.065 vs 0.070 ms), so a captured call of fewer than ``GRAPH_FLA_BELOW`` tokens goes to fla. fla cannot be
  captured with cu_seqlens (it copies them to the host), so a captured varlen call goes to the lab.
- Called eagerly, fla pays ~0.4-1 ms of host work per call and "fast" has the lower device time from 2048 tokens
  up, so every eager call goes to the lab. Below ~4096 tokens every lab path is host-bound (0.2-0.5 ms, run-to-run
  noise of the same size).
- Without CUDA or without fla, the lab's "fast" configuration is the only candidate.
"""
from __future__ import annotations

from typing import Any

import torch

#: A call captured in a CUDA graph with fewer tokens than this goes to fla (measured: fla ahead at 512 and 1024).
GRAPH_FLA_BELOW = 2048
#: The lab's backend the rule falls back on.
LAB = "fast"


def choose(tokens: int, varlen: bool, on_cuda: bool, capturing: bool, fla_ok: bool) -> str:
    """The backend name for a call of `tokens` tokens (B*T); see the module docstring for where the rule comes
    from."""
    if not (on_cuda and fla_ok) or varlen:
        return LAB
    return "fla" if capturing and tokens < GRAPH_FLA_BELOW else LAB


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
