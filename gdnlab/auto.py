"""The "auto" backend: a written rule, learned from reports/h200/bench.csv, that picks the fastest correct backend
for a call from its shape and context, without timing anything per call.

How the rule was learned (H200, Qwen3-Next layer shape, 2026-12-02/03; benchmarks/NOTES.md items 12-15 and 19):
- Replayed in a CUDA graph, device time is all that counts. Against the previous fast (int64 indices) FLA was
  ahead at 1024-2048 tokens in two of three machine starts, so the rule then sent captured calls of 1024-4095
  tokens to FLA. The fifth run (reports/h200/bench_run5.csv) ran that rule: at 1024 and 2048 tokens auto (FLA)
  took 1.076x and 1.055x the time of the current fast, which was faster than FLA at every size of that run
  (0.80-0.95x FLA's time). So no captured size goes to FLA now (``GRAPH_FLA`` is None). FLA's time depends on its
  autotuner's picks: re-tuned later in the same process it ran 15% (2048 tokens) and 19% (32768) faster than after
  its first tune, faster than fast there (reports/h200/fla_retune.csv). The window stays a parameter for that case.
- Called eagerly, FLA pays ~0.8-1.2 ms of host work per call, so every eager call goes to the lab. Below 4096
  tokens every lab path is host-bound: an eager call's time is the host's span of its launches, so fewer launches
  win. fast with the q/k l2-norm inside its prologue (``fuse_norm``: three launches instead of four or five,
  bit-equal) had the lowest median eager time at 512-2048 tokens in the first machine start of the sixth session
  (0.187 / 0.181 / 0.233 ms; reports/h200/bench_rounds.csv), while its heavier prologue costs device time from
  4096 tokens on (graph 0.463 against fast's 0.295 ms). That was timed in do_bench windows or sampled between other
  backends' calls, where the GPU was still busy and a call's device time hid behind the host's. Sampled as a lone
  call from an idle GPU (benchmarks/NOTES.md item 19) an eager call's time is the host's span of its launches plus
  the device work left after the last one, and at 2048 tokens the fused prologue's extra device time outweighs the
  launch it saves. Predicted from the eighth session's run, measured in the ninth's (reports/h200/bench_run8.csv,
  2026-12-03 13:52 UTC, 200 samples a backend): at 2048 tokens fast 0.338 ms eagerly, fast with ``fuse_norm``
  0.353 (graph 0.162 against 0.228), while at 512 and 1024 tokens ``fuse_norm`` was ahead (0.261 / 0.302 against
  0.281 / 0.324 ms); a second start (reports/h200/bench.csv, 14:19 UTC) agreed. So eager CUDA calls below
  ``EAGER_FUSE_NORM`` = 2048 tokens run fast with ``fuse_norm``.
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
