"""Float64 ground truth for the gated delta rule (docs/design.md §1-§2).

Two forms of the same math, both in float64 on the inputs' device:

* :func:`recurrent_gated_delta_rule_ref` — the per-token recurrence, the definition every path is measured against::

      S   = exp(g_t) * S
      u_t = beta_t * (v_t - S^T k_t)
      S   = S + k_t (outer) u_t
      o_t = scale * S^T q_t

* :func:`chunk_gated_delta_rule_ref` — the chunked (WY) form the kernels use, for long sequences where the
  per-token loop is slow. It agrees with the recurrence to ~1e-15 relative (the tests ask for 1e-12).

Both loop over tokens (or chunks) only; heads, and all sequences of a batch, are processed together. Sequences are
sorted by length and packed so that each step is one contiguous block of the sequences still running; positions past
a sequence's end carry ``g = 0, beta = 0, k = 0``, which leaves the state exactly unchanged. The chunked form does
everything that does not depend on the state (gates, ``A``, the triangular solve, the output's intra-chunk scores) in
large batched products and keeps only ``V_new = U - W S`` and the state update in its sequential loop.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from gdnlab.kernel_params import BT
from gdnlab.validate import Problem, check_inputs

__all__ = ["L2NORM_EPS", "l2norm", "recurrent_gated_delta_rule_ref", "chunk_gated_delta_rule_ref"]

#: eps in FLA's in-kernel l2-norm: x / sqrt(sum(x^2) + eps).
L2NORM_EPS = 1e-6

F64 = torch.float64


def l2norm(x: torch.Tensor, eps: float = L2NORM_EPS) -> torch.Tensor:
    """Normalise the last dim as FLA's ``use_qk_l2norm_in_kernel`` does: ``x / sqrt(sum(x^2) + eps)``."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


class _Slots:
    """Float64 inputs of one call, cut into steps of ``C`` tokens and packed so each step is one contiguous block.

    Sequences are sorted longest first; step ``c`` of every sequence that still runs is a "slot", and slots are
    ordered by ``(c, rank)``, so the ``m[c]`` slots of step ``c`` are the contiguous range ``off[c] : off[c] + m[c]``
    and belong to the first ``m[c]`` sequences. Tensors are ``[slots, HV, C, D]`` (``[slots, HV, C]`` for g and
    beta); positions past a sequence's end are zero (``g = 0, beta = 0, k = 0``: the state passes through them
    unchanged). ``C = 1`` gives the per-token layout.
    """

    def __init__(self, p: Problem, q, k, v, g, beta, initial_state, use_l2: bool, C: int) -> None:
        self.p, self.C = p, C
        dev = p.device
        qd, kd = q.to(F64), k.to(F64)
        if use_l2:
            qd, kd = l2norm(qd), l2norm(kd)
        group = p.HV // p.H  # value head hv reads key head hv // group
        if group > 1:
            qd, kd = qd.repeat_interleave(group, dim=2), kd.repeat_interleave(group, dim=2)
        ntok = p.B * p.T

        lens = p.seqlens
        self.order = sorted(range(p.N), key=lambda n: -lens[n])  # stable: equal lengths keep their order
        sorted_lens = [lens[n] for n in self.order]
        self.nsteps = [-(-n // C) for n in sorted_lens]
        steps = self.nsteps[0] if p.N else 0
        self.m = []                                  # sequences still running at each step (non-increasing)
        running = p.N
        for c in range(steps):
            while self.nsteps[running - 1] <= c:
                running -= 1
            self.m.append(running)
        self.off = [0]
        for mc in self.m:
            self.off.append(self.off[-1] + mc)

        # token index of every (slot, position); ntok points at an appended zero row
        m_t = torch.tensor(self.m, dtype=torch.long, device=dev)
        step_of = torch.repeat_interleave(torch.arange(steps, device=dev), m_t)
        rank_of = torch.arange(self.off[-1], device=dev) - torch.tensor(self.off[:-1], dtype=torch.long,
                                                                         device=dev)[step_of]
        bos = torch.tensor([p.seq_bounds[n][0] for n in self.order], dtype=torch.long, device=dev)
        length = torch.tensor(sorted_lens, dtype=torch.long, device=dev)
        pos = step_of[:, None] * C + torch.arange(C, device=dev)
        valid = pos < length[rank_of][:, None]
        self.idx = torch.where(valid, bos[rank_of][:, None] + pos, ntok)   # [slots, C]
        self.valid = valid

        def gather(x: torch.Tensor) -> torch.Tensor:
            flat = x.to(F64).reshape(ntok, *x.shape[2:])
            flat = torch.cat([flat, flat.new_zeros(1, *flat.shape[1:])])
            return flat[self.idx].movedim(1, 2).contiguous()            # [slots, HV, C, ...]

        self.q, self.k, self.v, self.g, self.beta = (gather(x) for x in (qd, kd, v, g, beta))

        if initial_state is None:
            self.S = torch.zeros(p.N, p.HV, p.K, p.V, dtype=F64, device=dev)
        else:
            s0 = initial_state.to(F64)
            if p.state_v_first:
                s0 = s0.transpose(-1, -2)
            self.S = s0[self.order].contiguous()  # indexing copies: the caller's tensor is never written

    def unpack(self, o: torch.Tensor, S: torch.Tensor,
               output_final_state: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Scatter the slot output ``[slots, HV, C, V]`` back to ``[B, T, HV, V]`` (padding rows zero)."""
        p = self.p
        out = o.new_zeros(p.B * p.T, p.HV, p.V)
        out[self.idx[self.valid]] = o.movedim(2, 1)[self.valid]
        out = out.view(p.B, p.T, p.HV, p.V)
        if not output_final_state:
            return out, None
        ht = torch.empty_like(S)
        ht[self.order] = S
        if p.state_v_first:
            ht = ht.transpose(-1, -2).contiguous()
        return out, ht


def _recurrent_core(sl: _Slots, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    q, k, v = sl.q[:, :, 0], sl.k[:, :, 0], sl.v[:, :, 0]      # [slots, HV, D]
    decay, beta = sl.g[:, :, 0].exp(), sl.beta[:, :, 0]
    _, HV, K = q.shape
    V = v.shape[-1]
    S = sl.S  # owned by the slots: updated in place
    o = q.new_empty(q.shape[0], HV, V)
    for t, m in enumerate(sl.m):
        r = slice(sl.off[t], sl.off[t] + m)
        St = S[:m]
        St.mul_(decay[r, :, None, None])
        kt = k[r]
        pred = (kt.unsqueeze(-2) @ St).squeeze(-2)               # S^T k   [m, HV, V]
        u = beta[r, :, None] * (v[r] - pred)
        St.view(m * HV, K, V).baddbmm_(kt.reshape(m * HV, K, 1), u.reshape(m * HV, 1, V))
        o[r] = (q[r].unsqueeze(-2) @ St).squeeze(-2) * scale
    return o.unsqueeze(2), S


#: Bytes of float64 per-slot states the chunked form keeps at once (bounds its memory for long sequences).
_STATE_BLOCK_BYTES = 32 << 20


def _chunk_core(sl: _Slots, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    C, S = sl.C, sl.S
    slots, HV, _, K = sl.q.shape
    V = sl.v.shape[-1]
    causal = torch.ones(C, C, dtype=torch.bool, device=S.device).tril()
    o = sl.q.new_empty(slots, HV, C, V)
    per_block = max(1, _STATE_BLOCK_BYTES // (HV * K * V * 8))
    S_in: torch.Tensor | None = None   # state entering each slot of the current block
    c0 = 0
    while c0 < len(sl.m):
        c1 = c0 + 1
        while c1 < len(sl.m) and sl.off[c1 + 1] - sl.off[c0] <= per_block:
            c1 += 1
        s0, s1 = sl.off[c0], sl.off[c1]
        # Everything that does not depend on the state, for all slots of steps c0..c1 at once.
        q, k, v, beta = sl.q[s0:s1], sl.k[s0:s1], sl.v[s0:s1], sl.beta[s0:s1].unsqueeze(-1)
        G = sl.g[s0:s1].cumsum(-1)                                         # cumulative gate [n, HV, C]
        # exp(G_i - G_j) on and below the diagonal, 0 above (masked before exp so it cannot overflow)
        decay = (G.unsqueeze(-1) - G.unsqueeze(-2)).masked_fill(~causal, float("-inf")).exp()
        A = (beta * (k @ k.transpose(-1, -2)) * decay).tril(-1)
        eG = G.exp().unsqueeze(-1)
        # (I + A) [W | U] = [beta exp(G) K | beta V]; unitriangular: the unit diagonal is implied
        WU = torch.linalg.solve_triangular(A, torch.cat([beta * eG * k, beta * v], dim=-1), upper=False,
                                           unitriangular=True)
        W, U = WU[..., :K].contiguous(), WU[..., K:].contiguous()
        G_last = G[..., -1:]                  # padding positions have g = 0, so this is the real last token's
        k_dec_t = (k * (G_last - G).exp().unsqueeze(-1)).transpose(-1, -2).contiguous()
        last_decay = G_last.exp().unsqueeze(-1)
        # The sequential part: the state through the chunks, in place (no allocation per step).
        n = s1 - s0
        if S_in is None or S_in.shape[0] < n:
            S_in = S.new_empty(n, HV, K, V)
        v_new = torch.empty_like(U)
        for c in range(c0, c1):
            m = sl.m[c]
            a, b = sl.off[c] - s0, sl.off[c] - s0 + m
            Sm, Sm3 = S[:m], S[:m].view(m * HV, K, V)
            S_in[a:b].copy_(Sm)
            vn3 = v_new[a:b].view(m * HV, C, V)
            torch.baddbmm(U[a:b].view(m * HV, C, V), W[a:b].view(m * HV, C, K), Sm3, alpha=-1, out=vn3)
            Sm.mul_(last_decay[a:b])
            Sm3.baddbmm_(k_dec_t[a:b].view(m * HV, K, C), vn3)
        o_blk = o[s0:s1]
        torch.matmul(q * eG, S_in[:n], out=o_blk)
        o_blk.view(n * HV, C, V).baddbmm_(((q @ k.transpose(-1, -2)) * decay).view(n * HV, C, C),
                                          v_new.view(n * HV, C, V))
        o_blk.mul_(scale)
        c0 = c1
    return o, S


def _run(core: Callable[[_Slots], tuple[torch.Tensor, torch.Tensor]], C: int, q, k, v, g, beta, scale,
         initial_state, output_final_state, use_qk_l2norm_in_kernel, cu_seqlens, state_v_first):
    p = check_inputs(q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                     state_v_first=state_v_first, output_final_state=output_final_state,
                     use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
    with torch.no_grad():
        sl = _Slots(p, q, k, v, g, beta, initial_state, use_qk_l2norm_in_kernel, C)
        o, S = core(sl)
        return sl.unpack(o, S, output_final_state)


def recurrent_gated_delta_rule_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    state_v_first: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated delta rule by the per-token recurrence, in float64: the ground truth every backend is measured against.

    Arguments and shapes as :func:`gdnlab.chunk_gated_delta_rule` (docs/design.md §5). Returns ``o`` float64
    ``[B,T,HV,V]`` (padding rows of a ragged buffer are zero) and the float64 final state (``[N,HV,K,V]``, or
    ``[N,HV,V,K]`` with ``state_v_first``) or None. Inputs are validated by :func:`check_inputs` and never modified.
    """
    return _run(lambda sl: _recurrent_core(sl, sl.p.scale), 1, q, k, v, g, beta, scale, initial_state,
                output_final_state, use_qk_l2norm_in_kernel, cu_seqlens, state_v_first)


def chunk_gated_delta_rule_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    state_v_first: bool = False,
    chunk_size: int = BT,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated delta rule by the chunked (WY) form, in float64: same result as the recurrence, far faster for long T.

    Per chunk of ``chunk_size`` tokens (cumulative gate ``G``): ``A = tril(beta K K^T exp(G_i - G_j), -1)``,
    ``[W | U] = (I + A)^-1 [beta exp(G) K | beta V]``, ``V_new = U - W S``,
    ``O = scale [(Q exp(G)) S + tril(Q K^T exp(G_i - G_j)) V_new]``,
    ``S = exp(G_last) S + (K exp(G_last - G))^T V_new``. Same arguments and results as
    :func:`recurrent_gated_delta_rule_ref`.
    """
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size: must be a positive int, got {chunk_size!r}")
    return _run(lambda sl: _chunk_core(sl, sl.p.scale), chunk_size, q, k, v, g, beta, scale,
                initial_state, output_final_state, use_qk_l2norm_in_kernel, cu_seqlens, state_v_first)
