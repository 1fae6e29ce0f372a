"""The one seeded input generator every experiment uses.

:func:`make_inputs` draws all random numbers from a CPU ``torch.Generator`` seeded with ``seed`` and moves the result
to the requested device afterwards, so the same call gives bit-identical inputs on any machine and device. The
distribution of the inputs is a named *regime* (see :data:`REGIMES`); ``decay=`` overrides any regime's gate with
the controllable gate of the ``"decay"`` regime, leaving every other tensor unchanged.

Padding rows of a ragged buffer hold random values like every other row (never zeros), so a kernel that reads or
writes them is caught.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["GDNInputs", "REGIMES", "DEFAULT_DECAY", "make_inputs", "decay_gate"]

#: Mean of -g in the "decay" regime when no ``decay`` is given: a slow gate (state half-life ~7 tokens).
DEFAULT_DECAY = 0.1
#: Mean of -g in the "correlated" regime: slow, so that the strictly-lower A = beta K K^T exp(dG) stays large.
CORRELATED_DECAY = 0.01


@dataclass
class GDNInputs:
    """One problem's tensors (FLA layout) and how they were made.

    q, k ``[B,T,H,K]``; v ``[B,T,HV,V]``; g (fp32, log space) and beta ``[B,T,HV]``; initial_state ``[N,HV,K,V]`` or
    None; cu_seqlens int32 ``[N+1]`` for a ragged batch (B == 1) or None; scale None means ``K**-0.5``.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    initial_state: torch.Tensor | None
    cu_seqlens: torch.Tensor | None
    scale: float | None = None
    use_qk_l2norm_in_kernel: bool = True
    regime: str = "cutedsl"
    seed: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def n_seqs(self) -> int:
        """Number of sequences N (B dense, len(cu_seqlens) - 1 ragged)."""
        return int(self.q.shape[0]) if self.cu_seqlens is None else int(self.cu_seqlens.numel()) - 1

    @property
    def seqlens(self) -> list[int]:
        """Length of every sequence."""
        if self.cu_seqlens is None:
            return [int(self.q.shape[1])] * int(self.q.shape[0])
        c = self.cu_seqlens.tolist()
        return [c[i + 1] - c[i] for i in range(len(c) - 1)]

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``gdnlab.chunk_gated_delta_rule`` and the references; output_final_state=True."""
        return dict(q=self.q, k=self.k, v=self.v, g=self.g, beta=self.beta, initial_state=self.initial_state,
                    cu_seqlens=self.cu_seqlens, scale=self.scale,
                    use_qk_l2norm_in_kernel=self.use_qk_l2norm_in_kernel, output_final_state=True)

    def prefix(self, n: int) -> GDNInputs:
        """The first `n` tokens of a dense problem (no cu_seqlens): a causal kernel's first n output rows are its
        output for them, so a long draw's prefix is the draw a sweep measures at n tokens."""
        if self.cu_seqlens is not None or not 0 < n <= self.q.shape[1]:
            raise ValueError(f"prefix: takes a dense problem and 0 < n <= {self.q.shape[1]}, got n={n}"
                             + (" with cu_seqlens" if self.cu_seqlens is not None else ""))
        cut = {name: getattr(self, name)[:, :n].contiguous() for name in ("q", "k", "v", "g", "beta")}
        return replace(self, **cut)

    def to(self, device: str | torch.device) -> GDNInputs:
        """A copy with every tensor on ``device`` (values unchanged)."""
        def mv(x: torch.Tensor | None) -> torch.Tensor | None:
            return None if x is None else x.to(device)
        return replace(self, q=mv(self.q), k=mv(self.k), v=mv(self.v), g=mv(self.g), beta=mv(self.beta),
                       initial_state=mv(self.initial_state), cu_seqlens=mv(self.cu_seqlens), meta=dict(self.meta))


# --------------------------------------------------------------------------------------------------------- regimes
# Each regime takes (gen, B, T, H, HV, K, V) and returns fp32 q, k, v, beta, g and its default for
# use_qk_l2norm_in_kernel. make_inputs casts q, k, v, beta to the input dtype; g stays fp32.

Regime = Callable[[torch.Generator, int, int, int, int, int, int], dict[str, Any]]


def _randn(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=torch.float32)


def decay_gate(gen: torch.Generator, B: int, T: int, HV: int, decay: float) -> torch.Tensor:
    """Gate with mean(-g) = ``decay``: ``g = -decay * 2 * sigmoid(z)``, z ~ N(0,1), so -g lies in (0, 2*decay).

    ``sigmoid(z) + sigmoid(-z) = 1`` makes the mean exactly ``decay`` for any spread, and -g is never 0.
    """
    if not (isinstance(decay, (int, float)) and not isinstance(decay, bool) and math.isfinite(decay) and decay > 0):
        raise ValueError(f"decay: must be a positive finite float (mean of -g), got {decay!r}")
    return -float(decay) * 2.0 * torch.sigmoid(_randn(gen, B, T, HV))


def regime_cutedsl(gen: torch.Generator, B: int, T: int, H: int, HV: int, K: int, V: int) -> dict[str, Any]:
    """vLLM CuteDSL-test style: q, k, v ~ N(0,1); beta = sigmoid(N(0,1)); l2-norm of q, k in the kernel.

    Gate as a GDN layer computes it: ``g = -exp(A_log) * softplus(a + dt_bias)`` in fp32, with per value head
    ``A_log = log(U(1, 16))`` and ``dt_bias ~ N(0,1)``, and per token and head ``a ~ N(0,1)``. This is a fast gate:
    mean(-g) is about 7.7 per token in expectation, and one draw varies with its per-head values (docs/design.md
    §6), so a token's contribution to the state mostly fades within a few tokens. Use ``decay=`` for a slow gate.
    """
    q, k, v = _randn(gen, B, T, H, K), _randn(gen, B, T, H, K), _randn(gen, B, T, HV, V)
    beta = torch.sigmoid(_randn(gen, B, T, HV))
    A_log = torch.empty(HV, dtype=torch.float32).uniform_(1.0, 16.0, generator=gen).log()
    dt_bias = _randn(gen, HV)
    a = _randn(gen, B, T, HV)
    g = -A_log.exp() * F.softplus(a + dt_bias)
    return dict(q=q, k=k, v=v, beta=beta, g=g, use_qk_l2norm=True)


def regime_fla(gen: torch.Generator, B: int, T: int, H: int, HV: int, K: int, V: int) -> dict[str, Any]:
    """FLA-test style: q, v ~ N(0,1); k ~ N(0,1) l2-normalised beforehand (no in-kernel l2-norm);
    ``g = logsigmoid(N(0,1))`` (mean(-g) about 0.8); ``beta = sigmoid(N(0,1))``.
    """
    q, k, v = _randn(gen, B, T, H, K), _randn(gen, B, T, H, K), _randn(gen, B, T, HV, V)
    k = F.normalize(k, p=2.0, dim=-1)
    g = F.logsigmoid(_randn(gen, B, T, HV))
    beta = torch.sigmoid(_randn(gen, B, T, HV))
    return dict(q=q, k=k, v=v, beta=beta, g=g, use_qk_l2norm=False)


def regime_correlated(gen: torch.Generator, B: int, T: int, H: int, HV: int, K: int, V: int) -> dict[str, Any]:
    """Keys nearly parallel, to stress the triangular solve: ``k = c + 0.1 * n`` with one shared ``c ~ N(0,1)`` per
    (batch row, key head) and per-token noise ``n ~ N(0,1)``; after l2-norm the cosine between two keys is about
    0.99. The gate is slow (:func:`decay_gate` with mean(-g) = CORRELATED_DECAY) so that ``A`` stays large across
    the whole chunk. q, v ~ N(0,1); beta = sigmoid(N(0,1)); in-kernel l2-norm on.
    """
    q, v = _randn(gen, B, T, H, K), _randn(gen, B, T, HV, V)
    shared = _randn(gen, B, 1, H, K)
    k = shared + 0.1 * _randn(gen, B, T, H, K)
    beta = torch.sigmoid(_randn(gen, B, T, HV))
    g = decay_gate(gen, B, T, HV, CORRELATED_DECAY)
    return dict(q=q, k=k, v=v, beta=beta, g=g, use_qk_l2norm=True)


def regime_decay(gen: torch.Generator, B: int, T: int, H: int, HV: int, K: int, V: int) -> dict[str, Any]:
    """cutedsl's q, k, v and beta with the controllable gate of :func:`decay_gate` (mean(-g) = DEFAULT_DECAY unless
    ``make_inputs(decay=...)`` says otherwise): used to sweep the gate from slow (1e-3) to fast (1.0).
    """
    q, k, v = _randn(gen, B, T, H, K), _randn(gen, B, T, H, K), _randn(gen, B, T, HV, V)
    beta = torch.sigmoid(_randn(gen, B, T, HV))
    g = decay_gate(gen, B, T, HV, DEFAULT_DECAY)
    return dict(q=q, k=k, v=v, beta=beta, g=g, use_qk_l2norm=True)


#: Named input distributions; make_inputs(regime=name).
REGIMES: dict[str, Regime] = {
    "cutedsl": regime_cutedsl,
    "fla": regime_fla,
    "correlated": regime_correlated,
    "decay": regime_decay,
}

# Seed offset of the generator that draws an overriding ``decay=`` gate (keeps every other tensor unchanged).
_DECAY_STREAM = 0x5DEECE66D


def _need_int(name: str, x: object, lo: int) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or x < lo:
        raise ValueError(f"{name}: must be an int >= {lo}, got {x!r}")
    return x


def make_inputs(
    *,
    B: int = 1,
    T: int = 128,
    H: int = 4,
    HV: int = 8,
    K: int = 128,
    V: int = 128,
    seqlens: list[int] | tuple[int, ...] | None = None,
    pad: int = 0,
    regime: str = "cutedsl",
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
    initial_state: bool = True,
    state_dtype: torch.dtype = torch.float32,
    h0_scale: float = 0.05,
    decay: float | None = None,
    use_qk_l2norm: bool | None = None,
    device: str | torch.device = "cpu",
) -> GDNInputs:
    """Seeded inputs for one gated-delta-rule problem.

    Dense: ``B`` sequences of ``T`` tokens. Ragged (``seqlens`` given): one buffer (B must be 1, T is ignored) of
    ``sum(seqlens) + pad`` tokens, the last ``pad`` rows padding, ``cu_seqlens = [0, cumsum(seqlens)]`` int32.
    q, k, v, beta in ``dtype``; g fp32; initial state ``N(0,1) * h0_scale`` in ``state_dtype`` (or None).
    ``decay`` replaces the regime's gate by :func:`decay_gate`. ``use_qk_l2norm`` None takes the regime's default
    (True, except "fla", whose keys are normalised beforehand).
    """
    if regime not in REGIMES:
        raise ValueError(f"regime: must be one of {sorted(REGIMES)}, got {regime!r}")
    for name, x, lo in (("B", B, 1), ("T", T, 1), ("H", H, 1), ("HV", HV, 1), ("K", K, 1), ("V", V, 1),
                        ("pad", pad, 0), ("seed", seed, 0)):
        _need_int(name, x, lo)
    if HV % H:
        raise ValueError(f"HV: must be a multiple of H={H}, got {HV}")
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype: must be a floating torch.dtype, got {dtype!r}")
    if not (isinstance(state_dtype, torch.dtype) and state_dtype.is_floating_point):
        raise ValueError(f"state_dtype: must be a floating torch.dtype, got {state_dtype!r}")

    if seqlens is None:
        if pad:
            raise ValueError(f"pad: trailing padding rows need a ragged batch (seqlens), got pad={pad}")
        N, cu_seqlens = B, None
    else:
        seqlens = [_need_int("seqlens[]", n, 0) for n in seqlens]
        if not seqlens:
            raise ValueError("seqlens: must hold at least one sequence length, got []")
        if B != 1:
            raise ValueError(f"B: a ragged batch (seqlens) is one token buffer, B must be 1, got {B}")
        T = sum(seqlens) + pad
        if T < 1:
            raise ValueError(f"seqlens: the buffer must hold at least one token, got seqlens={seqlens}, pad={pad}")
        N = len(seqlens)
        cu_seqlens = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()], dtype=torch.int32)

    gen = torch.Generator(device="cpu").manual_seed(seed)
    d = REGIMES[regime](gen, B, T, H, HV, K, V)
    h0 = _randn(gen, N, HV, K, V) * h0_scale if initial_state else None
    g = d["g"]
    if decay is not None:
        g = decay_gate(torch.Generator(device="cpu").manual_seed(seed + _DECAY_STREAM), B, T, HV, decay)
    l2 = d["use_qk_l2norm"] if use_qk_l2norm is None else use_qk_l2norm
    if not isinstance(l2, bool):
        raise ValueError(f"use_qk_l2norm: must be a bool or None, got {use_qk_l2norm!r}")

    def out(x: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
        return x.to(dt).contiguous().to(device)

    return GDNInputs(
        q=out(d["q"], dtype), k=out(d["k"], dtype), v=out(d["v"], dtype), g=out(g, torch.float32),
        beta=out(d["beta"], dtype), initial_state=None if h0 is None else out(h0, state_dtype),
        cu_seqlens=None if cu_seqlens is None else cu_seqlens.to(device), scale=None,
        use_qk_l2norm_in_kernel=l2, regime=regime, seed=seed,
        meta=dict(B=B, T=T, H=H, HV=HV, K=K, V=V, seqlens=None if seqlens is None else list(seqlens), pad=pad,
                  dtype=dtype, state_dtype=state_dtype, h0_scale=h0_scale, decay=decay))
