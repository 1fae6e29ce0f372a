"""The fused kernel: one program per (V tile, sequence, value head) walks its chunks in order, keeping the state in
fp32 registers as V-first [BV, 64] tiles (K <= 256) and writing each chunk's output as it goes (docs/design.md §3).

The kernel under study shipped in ROCm's ATOM serving stack as atom/model_ops/fla_ops/chunk_fused.py (ROCm/ATOM
commit f95c85c505041c4e76978747580da2dfa60f5774, PR #906; the report cites a vLLM copy of it, docs/design.md §8).
This is the lab's own kernel with the same structure; the two choices that decide its accuracy are compile-time
switches (the named settings are gdnlab.kernel_params.FUSED_VARIANTS; docs/design.md §4):
- DOWNCAST: round the register state to bf16 before the inter-chunk dot Q.h (as the shipped kernel does, to mirror
  the two-kernel path's bf16 store of h), or feed the fp32 state to that dot.
- INTRA_VNEW: the intra-chunk term multiplies the masked scores by V_new = U - W.h (as the two-kernel path does), or
  by the WY output U (as the shipped kernel does: its defect).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from gdnlab.interp import launch
from gdnlab.kernel_params import BT, cdiv, pow2
from gdnlab.kernels.prologue import ChunkPlan, Prologue
from gdnlab.kernels.tiles import (absorb_all, chunk_output, gated_delta, inter_and_scores, load_rows, load_state,
                                  store_rows, store_state, w_times_h)

@triton.jit
def _tile_terms(qh, kh, wh, rows, mrow, sqk, sw, k0, s, K: tl.constexpr, DOWNCAST: tl.constexpr):
    """One K tile's share of a chunk from the V-first state tile s: Q.h, Q.K^T and W.h. h is the bf16, K-first
    copy of the state that the two-kernel path stores; Q.h takes the fp32 state instead when DOWNCAST is off."""
    hb = tl.trans(s).to(tl.bfloat16)
    if DOWNCAST:
        o, sc = inter_and_scores(qh, kh, rows, mrow, sqk, k0, hb, K)
    else:
        o, sc = inter_and_scores(qh, kh, rows, mrow, sqk, k0, tl.trans(s), K)
    return o, sc, w_times_h(wh, rows, mrow, sw, k0, hb, K)


@triton.jit
def fused_kernel(q_ptr, k_ptr, u_ptr, w_ptr, gcum_ptr, o_ptr, h0_ptr, ht_ptr, cu_ptr, scale,
                 H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
                 HAS_H0: tl.constexpr, STORE_HT: tl.constexpr, STATE_V_FIRST: tl.constexpr,
                 DOWNCAST: tl.constexpr, INTRA_VNEW: tl.constexpr, BT: tl.constexpr):
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    bos = tl.load(cu_ptr + i_n).to(tl.int64)
    eos = tl.load(cu_ptr + i_n + 1).to(tl.int64)
    v0 = i_v * BV
    qh, kh, wh, uh = q_ptr + i_h * K, k_ptr + i_h * K, w_ptr + i_hv * K, u_ptr + i_hv * V
    # State tiles, V-first: s_j[v, k] = S[64 j + k, v0 + v].
    s0 = tl.zeros([BV, 64], dtype=tl.float32)
    s1 = tl.zeros([BV, 64], dtype=tl.float32)
    s2 = tl.zeros([BV, 64], dtype=tl.float32)
    s3 = tl.zeros([BV, 64], dtype=tl.float32)
    if HAS_H0:
        sb = h0_ptr + (i_n * HV + i_hv) * K * V
        s0 = tl.trans(load_state(sb, 0, v0, K, V, BV, STATE_V_FIRST))
        if K > 64:
            s1 = tl.trans(load_state(sb, 64, v0, K, V, BV, STATE_V_FIRST))
        if K > 128:
            s2 = tl.trans(load_state(sb, 128, v0, K, V, BV, STATE_V_FIRST))
        if K > 192:
            s3 = tl.trans(load_state(sb, 192, v0, K, V, BV, STATE_V_FIRST))
    r = tl.arange(0, BT)
    for c in range(0, tl.cdiv(eos - bos, BT)):
        rows = bos + c * BT + r
        mrow = rows < eos
        g_cum = tl.load(gcum_ptr + rows * HV + i_hv, mask=mrow, other=0.0)
        g_last = tl.load(gcum_ptr + (tl.minimum(bos + c * BT + BT, eos) - 1) * HV + i_hv)
        o_acc, sc, vw = _tile_terms(qh, kh, wh, rows, mrow, H * K, HV * K, 0, s0, K, DOWNCAST)
        if K > 64:
            oi, si, wi = _tile_terms(qh, kh, wh, rows, mrow, H * K, HV * K, 64, s1, K, DOWNCAST)
            o_acc, sc, vw = o_acc + oi, sc + si, vw + wi
        if K > 128:
            oi, si, wi = _tile_terms(qh, kh, wh, rows, mrow, H * K, HV * K, 128, s2, K, DOWNCAST)
            o_acc, sc, vw = o_acc + oi, sc + si, vw + wi
        if K > 192:
            oi, si, wi = _tile_terms(qh, kh, wh, rows, mrow, H * K, HV * K, 192, s3, K, DOWNCAST)
            o_acc, sc, vw = o_acc + oi, sc + si, vw + wi
        u_t = load_rows(uh, rows, mrow, HV * V, v0, BV, V)
        v_new = u_t.to(tl.float32) - vw
        if INTRA_VNEW:
            out = chunk_output(o_acc, sc, g_cum, g_cum, rows, mrow, v_new.to(tl.bfloat16), scale)
        else:
            out = chunk_output(o_acc, sc, g_cum, g_cum, rows, mrow, u_t, scale)
        store_rows(o_ptr + i_hv * V, rows, mrow, HV * V, v0, out, BV, V)
        vg = gated_delta(v_new, g_cum, g_last, mrow)
        s0, s1, s2, s3 = absorb_all(s0, s1, s2, s3, kh, rows, mrow, H * K, vg, tl.exp(g_last), K, True)
    if STORE_HT:
        sb = ht_ptr + (i_n * HV + i_hv) * K * V
        store_state(sb, 0, v0, tl.trans(s0), K, V, BV, STATE_V_FIRST)
        if K > 64:
            store_state(sb, 64, v0, tl.trans(s1), K, V, BV, STATE_V_FIRST)
        if K > 128:
            store_state(sb, 128, v0, tl.trans(s2), K, V, BV, STATE_V_FIRST)
        if K > 192:
            store_state(sb, 192, v0, tl.trans(s3), K, V, BV, STATE_V_FIRST)


def fused(pro: Prologue, v: torch.Tensor, o: torch.Tensor, plan: ChunkPlan, initial_state, ht, scale: float,
          state_v_first: bool, BV: int = 64, downcast: bool = True, intra_vnew: bool = True, num_warps: int = 4,
          num_stages: int = 2) -> None:
    """The fused state+output kernel on flattened tensors; writes o and (if given) ht."""
    if pro.norm_q:
        raise ValueError("fused: the fused kernel reads q normalised; run the prologue without norm_q_in_output")
    tokens, H, K = pro.k.shape
    HV, V = v.shape[1], v.shape[2]
    N = plan.cu_seqlens.numel() - 1
    dummy = pro.g_cum
    launch(fused_kernel, (cdiv(V, BV), N * HV), pro.q, pro.k, pro.u, pro.w, pro.g_cum, o,
           initial_state if initial_state is not None else dummy, ht if ht is not None else dummy,
           plan.cu_seqlens, scale, H=H, HV=HV, K=K, V=V, BV=BV, HAS_H0=initial_state is not None,
           STORE_HT=ht is not None, STATE_V_FIRST=state_v_first, DOWNCAST=downcast, INTRA_VNEW=intra_vnew, BT=BT,
           num_warps=num_warps, num_stages=num_stages, device=v.device)
