"""The "auto" backend: a written rule, learned from reports/h200/bench.csv, that picks the fastest correct backend
for a call from its shape and context, without timing anything per call.

How the rule was learned (H200, Qwen3-Next layer shape, 2026-12-02; benchmarks/NOTES.md items 12-14):
- Replayed in a CUDA graph, device time is all that counts. Against the previous fast (int64 indices) FLA was
  ahead at 1024-2048 tokens in two of three machine starts, so the rule then sent captured calls of 1024-4095
  tokens to FLA. The committed benchmark (reports/h200/bench.csv) ran that rule: at 1024 and 2048 tokens auto (FLA)
  took 1.076x and 1.055x the time of the current fast, which was faster than FLA at every size of that run
  (0.80-0.95x FLA's time). So no captured size goes to FLA now (``GRAPH_FLA`` is None). FLA's time depends on its
  autotuner's picks: re-tuned later in the same process it ran 15% (2048 tokens) and 19% (32768) faster than after
  its first tune, faster than fast there (reports/h200/fla_retune.csv). The window stays a parameter for that case.
- Called eagerly, FLA pays ~0.4-1 ms of host work per call, so every eager call goes to the lab. Below ~4096
  tokens every lab path is host-bound (0.2-0.5 ms, run-to-run noise of the same size).
- A captured varlen call cannot go to FLA (it copies cu_seqlens to the host); without CUDA or without FLA, the
  lab's fast is the only candidate.
"""
from __future__ import annotations

from typing import Any

import torch

#: A call captured in a CUDA graph with tokens in [GRAPH_FLA[0], GRAPH_FLA[1]) goes to fla; None: no such sizes.
GRAPH_FLA: tuple[int, int] | None = None
#: The lab's backend the rule falls back on.
LAB = "fast"


def choose(tokens: int, varlen: bool, on_cuda: bool, capturing: bool, fla_ok: bool) -> str:
    """The backend name for a call of `tokens` tokens (B*T); see the module docstring for where the rule comes
    from."""
    if not (on_cuda and fla_ok) or varlen:
        return LAB
    return "fla" if capturing and GRAPH_FLA is not None and GRAPH_FLA[0] <= tokens < GRAPH_FLA[1] else LAB


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
