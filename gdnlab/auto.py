"""The "auto" backend: a written rule that picks the fastest correct backend for a call from its shape and context,
without timing anything per call. The rule and the measurements it rests on (H200, Qwen3-Next layer shape) are in
docs/speed-notes.md (items 12-15 and 19-20, and "auto's rule" under "How the code came to be as it is").

- Replayed in a CUDA graph only device time counts, and there the lab's fast is at or below FLA's time at every
  measured size, so no captured size goes to FLA (``GRAPH_FLA`` is None). FLA's time depends on what its autotuner
  picks on its first call; the window stays a parameter for a machine where FLA tunes better.
- Called eagerly, FLA pays about a millisecond of host work per call, so eager calls go to the lab. Below 2048
  tokens an eager call's time is mostly the host's span of its launches plus the device work left after the last
  one; there fast with the q/k l2-norm inside its prologue (``fuse_norm``: one launch fewer, bit-equal) wins, while
  from 2048 tokens the fused prologue's extra device time costs more than the launch it saves
  (``EAGER_FUSE_NORM``).
- A captured varlen call cannot go to FLA (it copies cu_seqlens to the host); without CUDA or without FLA, the
  lab's fast is the only candidate.
"""
from __future__ import annotations

from typing import Any

import torch

from gdnlab.registry import BACKENDS, chunk_gated_delta_rule

#: A call captured in a CUDA graph with tokens in [GRAPH_FLA[0], GRAPH_FLA[1]) goes to fla; None: no such sizes.
GRAPH_FLA: tuple[int, int] | None = None
#: The lab's backend the rule falls back on.
LAB = "fast"
#: An eager CUDA call of fewer tokens runs LAB with the l2-norm inside the prologue (one launch fewer).
EAGER_FUSE_NORM = 2048


def choose(tokens: int, varlen: bool, on_cuda: bool, capturing: bool, fla_ok: bool) -> str:
    """The backend name for a call of `tokens` tokens (B*T); see the module docstring for where the rule comes
    from."""
    if not (on_cuda and fla_ok) or varlen:
        return LAB
    return "fla" if capturing and GRAPH_FLA is not None and GRAPH_FLA[0] <= tokens < GRAPH_FLA[1] else LAB


def options(tokens: int, on_cuda: bool, capturing: bool) -> dict[str, Any]:
    """The options auto passes to LAB for such a call (see the module docstring)."""
    return {"fuse_norm": True} if on_cuda and not capturing and tokens < EAGER_FUSE_NORM else {}


def auto_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                 **kw: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run the backend `choose` names for this call (same signature as every backend), through the public entry
    point, which validates the inputs unless that backend does."""
    on_cuda = q.is_cuda
    capturing = on_cuda and torch.cuda.is_current_stream_capturing()
    tokens = int(q.shape[0] * q.shape[1])
    name = choose(tokens, kw.get("cu_seqlens") is not None, on_cuda, capturing, "fla" in BACKENDS)
    if name == "fla":
        kw.pop("poison", None)  # an option of the lab's kernels only
    else:
        kw = {**options(tokens, on_cuda, capturing), **kw}
    return chunk_gated_delta_rule(q, k, v, g, beta, backend=name, **kw)


auto_backend.validates_itself = True  # the entry point validates for the backend it picks
