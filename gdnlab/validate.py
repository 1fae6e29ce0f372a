"""One input check shared by every public entry point.

Every backend (the float64 reference, the Triton kernels, the FLA wrapper) calls :func:`check_inputs` first, so a
bad argument is refused the same way everywhere, with a message that names the argument and says what was expected.
The check reads its inputs and never modifies them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["MAX_HEAD_DIM", "HEAD_DIM_MULTIPLE", "Problem", "check_inputs"]

#: Largest K or V the kernels take: the fused kernel keeps the K x V state in registers as 64-wide tiles.
MAX_HEAD_DIM = 256
#: K and V must be multiples of this: the smallest tile a matrix-unit ``tl.dot`` accepts on every target.
HEAD_DIM_MULTIPLE = 16


@dataclass(frozen=True)
class Problem:
    """The sizes and options of one validated call.

    ``N`` is the number of sequences (``B`` dense, ``len(cu_seqlens) - 1`` ragged); ``seq_bounds[n]`` is the
    half-open token range ``(bos, eos)`` of sequence ``n`` — in the flattened ``[B*T]`` token axis for a dense
    batch (``(n*T, (n+1)*T)``), in the one token buffer for a ragged batch. ``scale`` is resolved (default
    ``K**-0.5``); ``dtype`` is q's dtype; ``varlen`` says whether cu_seqlens was given.
    """

    B: int
    T: int
    H: int
    HV: int
    K: int
    V: int
    N: int
    scale: float
    seq_bounds: list[tuple[int, int]]
    has_initial_state: bool
    state_v_first: bool
    device: torch.device
    dtype: torch.dtype
    varlen: bool = False

    @property
    def seqlens(self) -> list[int]:
        """Length of every sequence, in order."""
        return [e - b for b, e in self.seq_bounds]


def _need_tensor(name: str, x: object, optional: bool = False) -> None:
    if optional and x is None:
        return
    if not isinstance(x, torch.Tensor):
        what = "a torch.Tensor or None" if optional else "a torch.Tensor"
        raise TypeError(f"{name}: must be {what}, got {type(x).__name__}")


def _need_bool(name: str, x: object) -> None:
    if not isinstance(x, bool):
        raise TypeError(f"{name}: must be a bool, got {type(x).__name__}")


def _need_rank(name: str, x: torch.Tensor, rank: int, layout: str) -> None:
    if x.dim() != rank:
        raise ValueError(f"{name}: must be {rank}-d {layout}, got shape {tuple(x.shape)}")


def check_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    state_v_first: bool = False,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    dtypes: tuple[torch.dtype, ...] | None = None,
) -> Problem:
    """Validate one gated-delta-rule call and return its :class:`Problem`.

    Shapes follow FLA: q, k ``[B,T,H,K]``; v ``[B,T,HV,V]`` with HV a multiple of H; g, beta ``[B,T,HV]``;
    initial_state ``[N,HV,K,V]`` (``[N,HV,V,K]`` with ``state_v_first``); cu_seqlens 1-d integer ``[N+1]`` with B == 1,
    on q's device or on the cpu (a host copy makes a call capturable in a CUDA graph).
    With cu_seqlens the buffer may be longer than ``cu_seqlens[-1]``: the trailing rows are padding.

    ``dtypes``: the q/k/v dtypes the calling backend computes in (None: any floating dtype, as the float64 reference
    takes). The lab's Triton kernels pass ``(torch.bfloat16,)``: their dots mix q/k/v with bf16 operands, so an fp16
    or fp32 call is refused here, naming the argument, instead of failing inside Triton.

    Legal but unusual values are accepted and computed as the recurrence defines them, not refused: a positive ``g``
    (log-space gate, so the state *grows* by exp(g) per token and the result may overflow), ``beta`` outside [0, 1]
    (the delta rule's step size: above 1 it overshoots, below 0 it moves away from the target), and non-finite
    values in any tensor (they propagate to the outputs). The inputs the lab draws keep g <= 0 and beta in (0, 1).

    Raises TypeError for wrong argument types or mixed float dtypes, ValueError for wrong shapes, devices or values.
    """
    # ---- types
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        _need_tensor(name, x)
    _need_tensor("initial_state", initial_state, optional=True)
    _need_tensor("cu_seqlens", cu_seqlens, optional=True)
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise TypeError(f"scale: must be a float, an int or None, got {type(scale).__name__}")
    for name, flag in (("state_v_first", state_v_first), ("output_final_state", output_final_state),
                       ("use_qk_l2norm_in_kernel", use_qk_l2norm_in_kernel)):
        _need_bool(name, flag)

    # ---- dtypes
    if not q.dtype.is_floating_point:
        raise TypeError(f"q: must have a floating dtype, got {q.dtype}")
    if dtypes is not None and q.dtype not in dtypes:
        supported = ", ".join(str(d) for d in dtypes)
        raise TypeError(f"q: this backend computes q, k, v in {supported} only, got {q.dtype}; cast them first "
                        f"(e.g. q.to({dtypes[0]})) or use backend='reference' (any floating dtype)")
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise TypeError(f"{name}: must have q's dtype {q.dtype}, got {x.dtype}")
    for name, x in (("g", g), ("beta", beta), ("initial_state", initial_state)):
        if x is not None and not x.dtype.is_floating_point:
            raise TypeError(f"{name}: must have a floating dtype, got {x.dtype}")

    # ---- ranks and shapes
    _need_rank("q", q, 4, "[B,T,H,K]")
    _need_rank("k", k, 4, "[B,T,H,K]")
    _need_rank("v", v, 4, "[B,T,HV,V]")
    _need_rank("g", g, 3, "[B,T,HV]")
    _need_rank("beta", beta, 3, "[B,T,HV]")
    B, T, H, K = (int(s) for s in q.shape)
    if B < 1 or T < 1 or H < 1:
        raise ValueError(f"q: B, T and H must be at least 1, got shape {tuple(q.shape)}")
    if tuple(k.shape) != tuple(q.shape):
        raise ValueError(f"k: must have q's shape {tuple(q.shape)} [B,T,H,K], got {tuple(k.shape)}")
    if tuple(v.shape[:2]) != (B, T):
        raise ValueError(f"v: batch and time dims must match q's (B,T)=({B},{T}), got shape {tuple(v.shape)}")
    HV, V = int(v.shape[2]), int(v.shape[3])
    if HV < 1 or HV % H != 0:
        raise ValueError(f"v: value heads HV must be a positive multiple of the H={H} key heads, got HV={HV}")
    for name, x in (("g", g), ("beta", beta)):
        if tuple(x.shape) != (B, T, HV):
            raise ValueError(f"{name}: must have shape [B,T,HV]=({B}, {T}, {HV}), got {tuple(x.shape)}")
    for name, d in (("K (q/k head dim)", K), ("V (v head dim)", V)):
        if d < HEAD_DIM_MULTIPLE or d > MAX_HEAD_DIM or d % HEAD_DIM_MULTIPLE:
            raise ValueError(
                f"{name}: must be a multiple of {HEAD_DIM_MULTIPLE} no larger than {MAX_HEAD_DIM} "
                f"(kernel limits: 64-wide register state tiles, 16-wide matrix-unit dots), got {d}")

    # ---- devices
    device = q.device
    for name, x in (("k", k), ("v", v), ("g", g), ("beta", beta), ("initial_state", initial_state)):
        if x is not None and x.device != device:
            raise ValueError(f"{name}: must be on q's device {device}, got {x.device}")
    # cu_seqlens may also stay on the host: reading it then costs no device sync, so a call can be graph-captured.
    if cu_seqlens is not None and cu_seqlens.device not in (device, torch.device("cpu")):
        raise ValueError(f"cu_seqlens: must be on q's device {device} or on the cpu, got {cu_seqlens.device}")

    # ---- scale
    if scale is None:
        scale_f = K ** -0.5
    else:
        scale_f = float(scale)
        if not math.isfinite(scale_f):
            raise ValueError(f"scale: must be finite, got {scale_f}")

    # ---- sequences
    if cu_seqlens is None:
        N = B
        seq_bounds = [(n * T, (n + 1) * T) for n in range(B)]
    else:
        if cu_seqlens.dtype.is_floating_point or cu_seqlens.dtype.is_complex or cu_seqlens.dtype == torch.bool:
            raise ValueError(f"cu_seqlens: must be an integer tensor, got {cu_seqlens.dtype}")
        if cu_seqlens.dim() != 1:
            raise ValueError(f"cu_seqlens: must be 1-d [N+1], got shape {tuple(cu_seqlens.shape)}")
        if cu_seqlens.numel() < 2:
            raise ValueError(f"cu_seqlens: must hold at least 2 offsets [N+1], got {cu_seqlens.numel()}")
        if B != 1:
            raise ValueError(f"cu_seqlens: needs B == 1 (one token buffer), got q with B={B}")
        offs = [int(x) for x in cu_seqlens.tolist()]
        if offs[0] != 0:
            raise ValueError(f"cu_seqlens: must start at 0, got {offs[0]}")
        for i in range(1, len(offs)):
            if offs[i] < offs[i - 1]:
                raise ValueError(f"cu_seqlens: must be non-decreasing, got {offs[i - 1]} then {offs[i]} at index {i}")
        if offs[-1] > T:
            raise ValueError(f"cu_seqlens: last offset must not pass the end of the T={T} token buffer, got {offs[-1]}")
        N = len(offs) - 1
        seq_bounds = [(offs[i], offs[i + 1]) for i in range(N)]

    # ---- initial state
    if initial_state is not None:
        want = (N, HV, V, K) if state_v_first else (N, HV, K, V)
        layout = "[N,HV,V,K] (state_v_first)" if state_v_first else "[N,HV,K,V]"
        if initial_state.dim() != 4:
            raise ValueError(f"initial_state: must be 4-d {layout}, got shape {tuple(initial_state.shape)}")
        if tuple(initial_state.shape[1:]) != want[1:]:
            raise ValueError(f"initial_state: must have shape {layout}={want}, got {tuple(initial_state.shape)}")
        if int(initial_state.shape[0]) != N:
            raise ValueError(f"initial_state: must hold one state per sequence (N={N}), "
                             f"got {int(initial_state.shape[0])}")

    return Problem(B=B, T=T, H=H, HV=HV, K=K, V=V, N=N, scale=scale_f, seq_bounds=seq_bounds,
                   has_initial_state=initial_state is not None, state_v_first=state_v_first,
                   device=device, dtype=q.dtype, varlen=cu_seqlens is not None)
