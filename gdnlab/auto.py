"""The "auto" backend: a written rule that picks the fastest correct backend for a call from its shape and context,
without timing anything per call.

The rule (written before the run that measured it; docs/speed-notes.md item 24): among the lab's fast and the peer
backends that can run here (gdnlab.peers), a call goes to the backend with the lowest median time in
:data:`RULE_RUN` (the one bench run that timed every peer beside fast, at the Qwen3-Next layer shape on an H200) at
the bench shape nearest to it: the same kind of call (one sequence, a dense batch, a ragged batch), the nearest
token count on a log scale; graph-replay time when the call is being captured in a CUDA graph, eager time
otherwise. Every peer passed the lab's conformance suite in the peers' accuracy run (docs/speed-notes.md item 21).
A peer is a candidate only inside the regime that was timed (CUDA, bf16, K = V = 128) and where it can be called
that way (FLA copies cu_seqlens to the host, so a captured ragged call cannot go to it); everything else runs the
lab's fast, which takes every call.

fast itself runs eager calls below :data:`EAGER_FUSE_NORM` tokens with the q/k l2-norm inside its prologue (one
launch fewer; docs/speed-notes.md items 15 and 19), the configuration the rule timed: an explicit norm placement
turns fast's default fold_norm off (item 29), so these calls round the normalised q and k as fast did before.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Collection

import torch

from gdnlab.peers import PEERS
from gdnlab.registry import BACKENDS, chunk_gated_delta_rule

#: The lab's backend the rule falls back on.
LAB = "fast"
#: An eager CUDA call of fewer tokens runs LAB with the l2-norm inside the prologue (one launch fewer).
EAGER_FUSE_NORM = 2048
#: The device run whose bench.csv the rule reads (data/h200/RUNS.csv).
RULE_RUN = "2026-12-03T1958-peers-bench"
#: The kinds of call the rule tells apart, as bench shapes name them: one sequence, a dense batch, a ragged batch.
KINDS = ("sequence", "batch", "ragged")
#: Head sizes and dtype of the timed regime: a peer is a candidate only for such calls.
PEER_HEAD_DIMS = (128,)
PEER_DTYPES = (torch.bfloat16,)


#: The keyword arguments every backend takes (the rest are a backend's own options).
_CALL_ARGS = frozenset({"scale", "initial_state", "output_final_state", "use_qk_l2norm_in_kernel", "cu_seqlens",
                        "state_v_first"})


def kind_of(B: int, varlen: bool) -> str:
    """The kind of a call: "ragged" with cu_seqlens, "batch" for B > 1, else "sequence"."""
    return "ragged" if varlen else ("batch" if B > 1 else "sequence")


@functools.lru_cache(maxsize=None)
def rankings(timing: str) -> dict[str, tuple[tuple[int, tuple[str, ...]], ...]]:
    """Per kind of call, every bench shape of RULE_RUN as (tokens, backends fastest first by median `timing`, "ms"
    eager or "graph_ms"), among LAB and the peers; a backend with no time at a shape (it could not run there) is
    left out of that shape's ranking."""
    from gdnlab import runs
    bench = runs.load(RULE_RUN, "bench.csv")
    bench = bench[bench.backend.isin([LAB, *PEERS]) & bench[timing].notna()]
    out: dict[str, list] = {k: [] for k in KINDS}
    for (B, tokens), rows in bench.groupby(["B", "tokens"], sort=True):
        order = rows.groupby("backend")[timing].median().sort_values(kind="stable")
        kind = "ragged" if str(B) == "varlen" else kind_of(int(B), False)
        out[kind].append((int(tokens), tuple(order.index)))
    return {k: tuple(sorted(v)) for k, v in out.items()}


def choose(tokens: int, kind: str, on_cuda: bool, capturing: bool, available: Collection[str],
           peer_regime: bool) -> str:
    """The backend name for a call of `tokens` tokens (B*T) of `kind` (KINDS); `available`: the peer backends
    registered here; `peer_regime`: the call is bf16 with K = V = 128. See the module docstring."""
    if kind not in KINDS:
        raise ValueError(f"kind: must be one of {', '.join(KINDS)}, got {kind!r}")
    peers = {p for p in available if p != LAB}
    if not (on_cuda and peer_regime and peers):
        return LAB
    shapes = rankings("graph_ms" if capturing else "ms")[kind]
    if not shapes:
        return LAB
    _, order = min(shapes, key=lambda s: abs(math.log(s[0]) - math.log(max(tokens, 1))))
    for name in order:
        if name == LAB:
            return LAB
        if name in peers and not (name == "fla" and capturing and kind == "ragged"):
            return name
    return LAB


def options(tokens: int, on_cuda: bool, capturing: bool) -> dict[str, Any]:
    """The options auto passes to LAB for such a call (see the module docstring)."""
    return {"fuse_norm": True} if on_cuda and not capturing and tokens < EAGER_FUSE_NORM else {}


def auto_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                 **kw: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run the backend `choose` names for this call (same signature as every backend), through the public entry
    point, which validates the inputs unless that backend does. Options of the lab's kernels other than `poison`
    (which every backend takes) keep the call on LAB."""
    on_cuda = q.is_cuda
    capturing = on_cuda and torch.cuda.is_current_stream_capturing()
    B, T = q.shape[0], q.shape[1]
    tokens = int(B * T)
    regime = q.dtype in PEER_DTYPES and q.shape[-1] in PEER_HEAD_DIMS and v.shape[-1] in PEER_HEAD_DIMS
    lab_options = set(kw) - _CALL_ARGS - {"poison"}
    name = LAB if lab_options else choose(tokens, kind_of(int(B), kw.get("cu_seqlens") is not None), on_cuda,
                                          capturing, [b for b in BACKENDS if b in PEERS], regime)
    if name == LAB:
        kw = {**options(tokens, on_cuda, capturing), **kw}
    return chunk_gated_delta_rule(q, k, v, g, beta, backend=name, **kw)


auto_backend.validates_itself = True  # the entry point validates for the backend it picks
