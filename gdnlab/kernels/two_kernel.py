"""The two-kernel path: a state kernel that walks the chunks and stores each chunk's state and V_new in bf16,
then an output kernel that runs every chunk in parallel from those bf16 copies (docs/design.md §3-§4)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from gdnlab.interp import launch
from gdnlab.kernel_params import BT, cdiv, pow2
from gdnlab.kernels.prologue import ChunkPlan, Prologue, alloc, wide_index
from gdnlab.kernels.tiles import (absorb_all, absorb_tiles, as_index, gated_delta, chunk_output, inter_and_scores,
                                  l2_norm_of_rows, load_rows, load_state, load_tile, rows_times_h, sequence_rows,
                                  store_rows, store_state, store_tile, tma_ok, use_descriptors)


@triton.jit
def fwd_h_kernel(k_ptr, u_ptr, w_ptr, gcum_ptr, h_ptr, vnew_ptr, h0_ptr, ht_ptr, cu_ptr, choff_ptr, gk_ptr,
                 t_ptr, v_ptr, beta_ptr, lk_ptr, q_ptr, o_ptr, gq_ptr, scale, H: tl.constexpr, HV: tl.constexpr,
                 K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, HAS_H0: tl.constexpr, STORE_HT: tl.constexpr,
                 STATE_V_FIRST: tl.constexpr, BT: tl.constexpr, I64: tl.constexpr = True, FOLD: tl.constexpr = False,
                 T_FORM: tl.constexpr = False, H_EVERY: tl.constexpr = 1, OUTPUT: tl.constexpr = False,
                 K_ONCE: tl.constexpr = False, WS: tl.constexpr = False, SPLIT_SCORES: tl.constexpr = False):
    """One program per (V tile, sequence, value head): carry the fp32 state, store bf16 V_new per chunk and bf16 h
    at every H_EVERY-th chunk of a sequence (the first of each block the output kernel takes; fwd_o_kernel's OUT_M).
    With FOLD, k is raw and the absorbed term's gates are gk = G + log|k| (gk_ptr, fp32 [tokens, HV]), so its rows
    carry k's inverse norms.

    T_FORM (the prologue stored T, not W and U): V_new = T diag(beta) (V - diag(exp(G_w)) K S), from the bf16 T rows
    (t_ptr, [tokens, HV, BT]), the input v and beta rows and K S in fp32, the bracket rounded to bf16 once; G_w is
    W's gate, G (or with FOLD G - log|k|, lk_ptr: fp32 [tokens, H]). The same product as U - W S, rounded in other
    places: neither W nor U is rounded, and the subtraction comes before T's product.

    OUTPUT: the walk writes each chunk's output itself (o_ptr, from q_ptr and, with FOLD, the rows' gates gq_ptr)
    and stores neither h nor V_new: the output kernel's numbers (Q times the state rounded to bf16, the causal
    scores times V_new rounded to bf16) without their round trip through memory; Q.K^T is formed once per V tile.

    K_ONCE (with T_FORM): the K tiles loaded for K S are the ones the state update takes, not loaded again, so the
    loop's software pipeline buffers one copy of them (docs/speed-notes.md item 59).

    WS (the W and U walk only): the W, U and K tiles come through tensor descriptors over the sequence's rows
    (load_tile: the same tiles, so the same numbers) and the chunk loop asks Triton for warp specialisation, whose
    producer takes only descriptor loads (docs/speed-notes.md items 69 and 73).

    SPLIT_SCORES (with OUTPUT; fwd_o_kernel's too): the gated scores enter their product with V_new as two bf16
    terms, not rounded to bf16 (tiles.chunk_output's SPLIT)."""
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    bos = as_index(tl.load(cu_ptr + i_n), I64)
    eos = as_index(tl.load(cu_ptr + i_n + 1), I64)
    c0 = as_index(tl.load(choff_ptr + i_n), I64)
    v0 = i_v * BV
    kh, wh, uh, vh = k_ptr + i_h * K, w_ptr + i_hv * K, u_ptr + i_hv * V, vnew_ptr + i_hv * V
    qh = q_ptr + i_h * K
    s0 = tl.zeros([64, BV], dtype=tl.float32)
    s1 = tl.zeros([64, BV], dtype=tl.float32)
    s2 = tl.zeros([64, BV], dtype=tl.float32)
    s3 = tl.zeros([64, BV], dtype=tl.float32)
    if HAS_H0:
        sb = h0_ptr + (as_index(i_n, I64) * HV + i_hv) * K * V
        s0 = load_state(sb, 0, v0, K, V, BV, STATE_V_FIRST)
        if K > 64:
            s1 = load_state(sb, 64, v0, K, V, BV, STATE_V_FIRST)
        if K > 128:
            s2 = load_state(sb, 128, v0, K, V, BV, STATE_V_FIRST)
        if K > 192:
            s3 = load_state(sb, 192, v0, K, V, BV, STATE_V_FIRST)
    tl.static_assert(not (WS and (T_FORM or OUTPUT)), "WS: the walk that takes W and U, its output kernel apart")
    wd, kd, ud = None, None, None
    if WS:
        n_rows = (eos - bos).to(tl.int32)
        wd = sequence_rows(wh, bos, n_rows, HV * K, K, BT, 64)
        kd = sequence_rows(kh, bos, n_rows, H * K, K, BT, 64)
        ud = sequence_rows(uh, bos, n_rows, HV * V, V, BT, BV)
    r = tl.arange(0, BT)
    for c in tl.range(0, tl.cdiv(eos - bos, BT), warp_specialize=WS):
        rows = bos + c * BT + r
        mrow = rows < eos
        if FOLD:
            g_cum = tl.load(gk_ptr + rows * HV + i_hv, mask=mrow, other=0.0)
        else:
            g_cum = tl.load(gcum_ptr + rows * HV + i_hv, mask=mrow, other=0.0)
        g_last = tl.load(gcum_ptr + (tl.minimum(bos + c * BT + BT, eos) - 1) * HV + i_hv)
        hb = h_ptr + ((c0 + c) * HV + i_hv) * K * V
        if T_FORM:  # K S: the rows of K where W's would be
            rh, srow = kh, H * K
        else:
            rh, srow = wh, HV * K
        if c % H_EVERY == 0 and not OUTPUT:
            store_state(hb, 0, v0, s0, K, V, BV, False)
        kt0, vw = rows_times_h(rh, rows, mrow, srow, 0, s0.to(tl.bfloat16), K, wd, c * BT, WS)
        kt1, kt2, kt3 = kt0, kt0, kt0
        if OUTPUT:
            o_acc, sc = inter_and_scores(qh, kh, rows, mrow, H * K, 0, s0.to(tl.bfloat16), K)
        if K > 64:
            if c % H_EVERY == 0 and not OUTPUT:
                store_state(hb, 64, v0, s1, K, V, BV, False)
            kt1, vw1 = rows_times_h(rh, rows, mrow, srow, 64, s1.to(tl.bfloat16), K, wd, c * BT, WS)
            vw = vw + vw1
            if OUTPUT:
                oi, si = inter_and_scores(qh, kh, rows, mrow, H * K, 64, s1.to(tl.bfloat16), K)
                o_acc, sc = o_acc + oi, sc + si
        if K > 128:
            if c % H_EVERY == 0 and not OUTPUT:
                store_state(hb, 128, v0, s2, K, V, BV, False)
            kt2, vw2 = rows_times_h(rh, rows, mrow, srow, 128, s2.to(tl.bfloat16), K, wd, c * BT, WS)
            vw = vw + vw2
            if OUTPUT:
                oi, si = inter_and_scores(qh, kh, rows, mrow, H * K, 128, s2.to(tl.bfloat16), K)
                o_acc, sc = o_acc + oi, sc + si
        if K > 192:
            if c % H_EVERY == 0 and not OUTPUT:
                store_state(hb, 192, v0, s3, K, V, BV, False)
            kt3, vw3 = rows_times_h(rh, rows, mrow, srow, 192, s3.to(tl.bfloat16), K, wd, c * BT, WS)
            vw = vw + vw3
            if OUTPUT:
                oi, si = inter_and_scores(qh, kh, rows, mrow, H * K, 192, s3.to(tl.bfloat16), K)
                o_acc, sc = o_acc + oi, sc + si
        if T_FORM:
            g_w = tl.load(gcum_ptr + rows * HV + i_hv, mask=mrow, other=0.0)
            if FOLD:
                g_w = g_w - tl.load(lk_ptr + rows * H + i_h, mask=mrow, other=0.0)
            beta = tl.load(beta_ptr + rows * HV + i_hv, mask=mrow, other=0.0).to(tl.float32)
            vt = load_rows(v_ptr + i_hv * V, rows, mrow, HV * V, v0, BV, V).to(tl.float32)
            y = (beta[:, None] * (vt - tl.exp(g_w)[:, None] * vw)).to(tl.bfloat16)
            v_new = tl.dot(load_rows(t_ptr + i_hv * BT, rows, mrow, HV * BT, 0, BT, BT), y)
        else:
            v_new = load_tile(uh, ud, rows, mrow, HV * V, c * BT, v0, BV, V, WS).to(tl.float32) - vw
        if OUTPUT:
            g_row = g_cum
            if FOLD:
                g_row = tl.load(gq_ptr + rows * HV + i_hv, mask=mrow, other=0.0)
            out = chunk_output(o_acc, sc, g_row, g_cum, rows, mrow, v_new.to(tl.bfloat16), scale, SPLIT_SCORES)
            store_rows(o_ptr + i_hv * V, rows, mrow, HV * V, v0, out, BV, V)
        else:
            store_rows(vh, rows, mrow, HV * V, v0, v_new, BV, V)
        vg = gated_delta(v_new, g_cum, g_last, mrow)
        if K_ONCE:  # (with T_FORM the rows of K S are K's: the tiles loaded for it)
            s0, s1, s2, s3 = absorb_tiles(s0, s1, s2, s3, kt0, kt1, kt2, kt3, vg, tl.exp(g_last), K, False)
        else:
            s0, s1, s2, s3 = absorb_all(s0, s1, s2, s3, kh, rows, mrow, H * K, vg, tl.exp(g_last), K, False, kd,
                                        c * BT, WS)
    if STORE_HT:
        sb = ht_ptr + (as_index(i_n, I64) * HV + i_hv) * K * V
        store_state(sb, 0, v0, s0, K, V, BV, STATE_V_FIRST)
        if K > 64:
            store_state(sb, 64, v0, s1, K, V, BV, STATE_V_FIRST)
        if K > 128:
            store_state(sb, 128, v0, s2, K, V, BV, STATE_V_FIRST)
        if K > 192:
            store_state(sb, 192, v0, s3, K, V, BV, STATE_V_FIRST)


@triton.jit
def fwd_o_kernel(q_ptr, k_ptr, vnew_ptr, gcum_ptr, h_ptr, o_ptr, cu_ptr, chunks_ptr, scale, gq_ptr, gk_ptr, seg_ptr,
                 offsets_ptr, n_chunks, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                 BV: tl.constexpr, BT: tl.constexpr, NORM_Q: tl.constexpr = False, KP: tl.constexpr = 64,
                 I64: tl.constexpr = True, FOLD: tl.constexpr = False, LOOP: tl.constexpr = False,
                 LOOP_STAGES: tl.constexpr = 2, TMA: tl.constexpr = False, OUT_M: tl.constexpr = 1,
                 SPLIT_SCORES: tl.constexpr = False):
    """The output of OUT_M consecutive chunks of a sequence (a block of OUT_M * BT rows) from the bf16 h of its
    first chunk and the block's bf16 V_new, per (V tile, block, value head): one program each, or with LOOP one per
    (V tile, run of a sequence's blocks, value head) (seg_ptr: ChunkPlan.segments; offsets_ptr: the sequences'
    first global chunks), looping LOOP_STAGES deep. With OUT_M > 1 (blocks always from seg_ptr) the rows past the
    block's first chunk take the state's later chunks through V_new in the block's causal scores, not through
    their own rounded h: every state product stays exact up to the first chunk's h, and the state kernel stores
    only the h that are read (its H_EVERY). With TMA q, k, h and V_new are read and o written
    through tensor descriptors built once per program (as the prologue's TMA). With NORM_Q it l2-normalises its q
    rows itself (KP: K padded to a power of two); with FOLD q and k are raw and the gates of Q.h's rows and Q.K^T's
    rows and columns are gq = G - log|q| and gk = G + log|k| (gq_ptr, gk_ptr: fp32 [tokens, HV]), which divide the
    products by the norms in fp32. With SPLIT_SCORES the gated scores enter their product with V_new as two bf16
    terms (tiles.chunk_output's SPLIT)."""
    i_v, i_hv = tl.program_id(0), tl.program_id(2)
    if LOOP or (OUT_M > 1):
        i_n = tl.load(seg_ptr + 3 * tl.program_id(1))
        t0 = tl.load(seg_ptr + 3 * tl.program_id(1) + 1)
        t1 = tl.load(seg_ptr + 3 * tl.program_id(1) + 2)
        c0 = tl.load(offsets_ptr + i_n)
    else:
        i_n = tl.load(chunks_ptr + 2 * tl.program_id(1))
        t0 = tl.load(chunks_ptr + 2 * tl.program_id(1) + 1)
        t1 = t0 + 1
        c0 = tl.program_id(1) - t0
    bos = as_index(tl.load(cu_ptr + i_n), I64)
    eos = as_index(tl.load(cu_ptr + i_n + 1), I64)
    i_h = i_hv // (HV // H)
    qd, kd, hd, vd, od = None, None, None, None, None
    if TMA:
        n_rows = (eos - bos).to(tl.int32)
        qd = sequence_rows(q_ptr + i_h * K, bos, n_rows, H * K, K, BT * OUT_M, 64)
        kd = sequence_rows(k_ptr + i_h * K, bos, n_rows, H * K, K, BT * OUT_M, 64)
        hd = tl.make_tensor_descriptor(h_ptr, shape=[n_chunks * HV, K, V], strides=[K * V, V, 1],
                                       block_shape=[1, 64, BV])  # rows past K read as zeros
        vd = sequence_rows(vnew_ptr + i_hv * V, bos, n_rows, HV * V, V, BT * OUT_M, BV)
        od = sequence_rows(o_ptr + i_hv * V, bos, n_rows, HV * V, V, BT * OUT_M, BV)
    if LOOP:
        for i_t in tl.range(t0, t1, OUT_M, num_stages=LOOP_STAGES):
            _output_chunk(bos, eos, i_t, c0 + i_t, i_v, i_hv, qd, kd, hd, vd, od, q_ptr, k_ptr, vnew_ptr, gcum_ptr,
                          h_ptr, o_ptr, scale, gq_ptr, gk_ptr, H, HV, K, V, BV, BT, NORM_Q, KP, I64, FOLD, TMA, OUT_M,
                          SPLIT_SCORES)
    else:
        _output_chunk(bos, eos, t0, c0 + t0, i_v, i_hv, qd, kd, hd, vd, od, q_ptr, k_ptr, vnew_ptr, gcum_ptr, h_ptr,
                      o_ptr, scale, gq_ptr, gk_ptr, H, HV, K, V, BV, BT, NORM_Q, KP, I64, FOLD, TMA, OUT_M, SPLIT_SCORES)


@triton.jit
def _h_tile(hb, hd, state, k0, v0, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, TMA: tl.constexpr):
    """A chunk's bf16 [64, BV] state tile (K-first) at K row k0, with TMA through the descriptor `hd` over every
    state (`state`: chunk x HV + value head)."""
    if TMA:
        return tl.reshape(hd.load([state, k0, v0]), [64, BV])
    else:
        return load_state(hb, k0, v0, K, V, BV, False).to(tl.bfloat16)


@triton.jit
def _output_chunk(bos, eos, i_t, i_c, i_v, i_hv, qd, kd, hd, vd, od, q_ptr, k_ptr, vnew_ptr, gcum_ptr, h_ptr, o_ptr,
                  scale, gq_ptr, gk_ptr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                  BV: tl.constexpr, BT: tl.constexpr, NORM_Q: tl.constexpr, KP: tl.constexpr, I64: tl.constexpr,
                  FOLD: tl.constexpr, TMA: tl.constexpr, OUT_M: tl.constexpr = 1, SPLIT_SCORES: tl.constexpr = False):
    """fwd_o_kernel's work for the OUT_M chunks from chunk i_t of the sequence in rows bos..eos (global chunk i_c),
    V tile i_v, value head i_hv."""
    i_h = i_hv // (HV // H)
    v0 = i_v * BV
    r0 = i_t * BT
    r = tl.arange(0, BT * OUT_M)
    rows = bos + r0 + r
    mrow = rows < eos
    qh, kh = q_ptr + i_h * K, k_ptr + i_h * K
    state = i_c * HV + i_hv
    hb = h_ptr + (as_index(i_c, I64) * HV + i_hv) * K * V
    if FOLD:
        g_row = tl.load(gq_ptr + rows * HV + i_hv, mask=mrow, other=0.0)
        g_col = tl.load(gk_ptr + rows * HV + i_hv, mask=mrow, other=0.0)
    else:
        g_row = tl.load(gcum_ptr + rows * HV + i_hv, mask=mrow, other=0.0)
        g_col = g_row
    if OUT_M > 1:  # the prologue's gates restart at every chunk: chain them over the block
        g_row, g_col = _block_gates(g_row, g_col, gcum_ptr, r, bos + r0, eos, HV, i_hv, BT, OUT_M)
    qn = tl.full([BT * OUT_M], 1.0, tl.float32)
    if NORM_Q:
        qn = l2_norm_of_rows(load_rows(qh, rows, mrow, H * K, 0, KP, K).to(tl.float32))
    o_acc, sc = inter_and_scores(qh, kh, rows, mrow, H * K, 0, _h_tile(hb, hd, state, 0, v0, K, V, BV, TMA), K, qn,
                                 NORM_Q, qd, kd, r0, TMA)
    if K > 64:
        oi, si = inter_and_scores(qh, kh, rows, mrow, H * K, 64, _h_tile(hb, hd, state, 64, v0, K, V, BV, TMA), K,
                                  qn, NORM_Q, qd, kd, r0, TMA)
        o_acc, sc = o_acc + oi, sc + si
    if K > 128:
        oi, si = inter_and_scores(qh, kh, rows, mrow, H * K, 128, _h_tile(hb, hd, state, 128, v0, K, V, BV, TMA), K,
                                  qn, NORM_Q, qd, kd, r0, TMA)
        o_acc, sc = o_acc + oi, sc + si
    if K > 192:
        oi, si = inter_and_scores(qh, kh, rows, mrow, H * K, 192, _h_tile(hb, hd, state, 192, v0, K, V, BV, TMA), K,
                                  qn, NORM_Q, qd, kd, r0, TMA)
        o_acc, sc = o_acc + oi, sc + si
    v_new = load_tile(vnew_ptr + i_hv * V, vd, rows, mrow, HV * V, r0, v0, BV, V, TMA)
    out = chunk_output(o_acc, sc, g_row, g_col, rows, mrow, v_new, scale, SPLIT_SCORES)
    store_tile(o_ptr + i_hv * V, od, rows, mrow, HV * V, r0, v0, out, BV, V, TMA)


@triton.jit
def _block_gates(g_row, g_col, gcum_ptr, r, first, eos, HV: tl.constexpr, i_hv, BT: tl.constexpr,
                 OUT_M: tl.constexpr):
    """g_row and g_col of a block of OUT_M chunks from row `first`, each chunk's rows raised by the sum of the
    gates of the block's earlier chunks (their cumulative gates' last values), so that exp(g_i - g_j) spans chunks."""
    off = tl.zeros([BT * OUT_M], tl.float32)
    for m in tl.static_range(1, OUT_M):
        end = tl.minimum(first + m * BT, eos) - 1  # the last row of chunk m - 1 (clamped: then no row of m is live)
        off = off + tl.where(r >= m * BT, tl.load(gcum_ptr + end * HV + i_hv), 0.0)
    return g_row + off, g_col + off


def two_kernel(pro: Prologue, v: torch.Tensor, o: torch.Tensor, plan: ChunkPlan, initial_state, ht, scale: float,
               state_v_first: bool, BV: int = 64, poison: bool = False, num_warps: int = 4,
               num_stages: int | None = None, out_BV: int | None = None, out_warps: int | None = None,
               out_stages: int | None = None, index64: bool | None = None, out_programs: int = 0,
               out_tma: bool = False, out_chunks: int = 1, fused_output: bool = False,
               walk_k_once: bool = False, walk_ws: bool = False, split_scores: bool = False) -> None:
    """State kernel then output kernel on flattened tensors; writes o and (if given) ht. `BV`, `num_warps` and
    `num_stages` configure the state kernel, and the output kernel too unless its `out_*` options are given
    (None: Triton's default stages). The output kernel l2-normalises q when the prologue left that to it
    (pro.norm_q). `index64`: int64 indices (None: where a buffer needs them). `out_programs`: 0 runs one output
    program per chunk; more, about that many per V tile and value head, each looping over a run of one sequence's
    chunks `out_stages` deep (or 2); `out_tma`: its tiles through tensor descriptors where the buffers allow it
    (tma_ok). The same numbers in every case but `out_chunks`: each output program takes that many consecutive
    chunks (one block of rows; kernel_params.OUT_CHUNKS, checked where the backend validates its options) from the
    first one's h, and the state kernel stores only those h (fwd_o_kernel's OUT_M). `fused_output`: the state
    kernel writes the output itself (fwd_h_kernel's OUTPUT): the same roundings, no h or V_new in memory, and no
    output kernel, so the `out_*` options do not apply (the backend refuses them). `walk_k_once` (with the
    prologue's T only): the state kernel keeps each chunk's K tiles, loaded for K S, for the state update rather
    than loading them again (fwd_h_kernel's K_ONCE): the same numbers, fewer tiles in its pipeline's buffers.
    `walk_ws` (the walk that takes W and U, its output kernel apart): the state kernel reads its W, U and K tiles
    through tensor descriptors and is warp-specialised (fwd_h_kernel's WS): the same numbers. `split_scores`: the
    output's gated scores enter their product with V_new as two bf16 terms instead of rounded to bf16 (whichever
    kernel writes the output; their SPLIT_SCORES): other numbers, closer to float64 (docs/speed-notes.md item 74)."""
    tokens, H, K = pro.k.shape
    HV, V = v.shape[1], v.shape[2]
    N = plan.cu_seqlens.numel() - 1
    dev = v.device
    out_BV, out_warps = out_BV or BV, out_warps or num_warps
    out_stages = out_stages or num_stages
    dummy = pro.g_cum
    if fused_output:
        if pro.norm_q:
            raise ValueError("fused_output: the state kernel reads q normalised or with its norm folded; "
                             "run without norm_q_in_output")
        h = v_new = dummy
    else:
        h = alloc((max(plan.n_chunks, 1), HV, K, V), torch.bfloat16, dev, poison)
        v_new = alloc((tokens, HV, V), torch.bfloat16, dev, poison)
    states = [x for x in (initial_state, ht) if x is not None]
    t_form = pro.t is not None
    if walk_k_once and not t_form:
        raise ValueError("walk_k_once: the state kernel reuses the K tiles of K S, which only the walk that applies "
                         "T forms; run with walk_t=True")
    if walk_ws:
        if t_form or fused_output:
            raise ValueError("walk_ws: the warp-specialised walk is the one that takes W and U and leaves the output "
                             "to its own kernel; run without walk_t and fused_output")
        if not tma_ok(pro.k, pro.w, pro.u):
            raise ValueError("walk_ws: the keys, W and U must be contiguous with 16-byte aligned rows (tensor "
                             "descriptors), and this Triton must build descriptors on the device")
        use_descriptors()
    i64 = wide_index(h, v_new, o, pro.t if t_form else pro.w, pro.q, *states) if index64 is None else index64
    fold = pro.g_k is not None
    gq, gk = (pro.g_q, pro.g_k) if fold else (dummy, dummy)
    walk_t = (pro.t, v, pro.beta, pro.log_k if pro.log_k is not None else dummy) if t_form else (dummy,) * 4
    launch(fwd_h_kernel, (cdiv(V, BV), N * HV), pro.k, pro.u if not t_form else dummy,
           pro.w if not t_form else dummy, pro.g_cum, h, v_new,
           initial_state if initial_state is not None else dummy, ht if ht is not None else dummy,
           plan.cu_seqlens, plan.chunk_offsets, gk, *walk_t, pro.q, o, gq, scale, H=H, HV=HV, K=K, V=V, BV=BV,
           HAS_H0=initial_state is not None, STORE_HT=ht is not None, STATE_V_FIRST=state_v_first, BT=BT, I64=i64,
           FOLD=fold, T_FORM=t_form, H_EVERY=out_chunks, OUTPUT=fused_output, K_ONCE=walk_k_once, WS=walk_ws,
           SPLIT_SCORES=split_scores and fused_output, num_warps=num_warps,
           device=dev,
           **({} if num_stages is None else dict(num_stages=num_stages)))
    if plan.n_chunks and not fused_output:
        segs = plan.runs(out_programs, out_chunks)
        loop = 0 < out_programs < plan.n_chunks
        out_tma = out_tma and tma_ok(pro.q, pro.k, v_new, o)
        if out_tma:
            use_descriptors()
        launch(fwd_o_kernel, (cdiv(V, out_BV), plan.n_chunks if segs is None else segs.shape[0], HV), pro.q, pro.k,
               v_new, pro.g_cum, h, o, plan.cu_seqlens, plan.chunks, scale, gq, gk,
               plan.chunks if segs is None else segs, plan.chunk_offsets, plan.n_chunks, H=H, HV=HV, K=K, V=V,
               BV=out_BV, BT=BT, NORM_Q=pro.norm_q, I64=i64, KP=pow2(K), FOLD=fold, LOOP=loop,
               LOOP_STAGES=out_stages or 2, TMA=out_tma, OUT_M=out_chunks, SPLIT_SCORES=split_scores,
               num_warps=out_warps, device=dev,
               **({} if out_stages is None else dict(num_stages=out_stages)))
