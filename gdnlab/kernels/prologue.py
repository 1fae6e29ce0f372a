"""The prologue every chunked path shares: optional q/k l2-norm, then per chunk the cumulative gate, the gated
beta.K.K^T, its unit-lower-triangular inverse T = (I + A)^-1, and the WY factors W = T(beta exp(G) K), U = T(beta V).

Rounding (docs/design.md §4): G and A are fp32; T is solved in fp32 and rounded to bf16; W and U are stored
bf16.
BT is gdnlab.kernel_params.BT.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl

from gdnlab.interp import launch, note_made
from gdnlab.kernel_params import BT, cdiv, pow2
from gdnlab.kernels.tiles import (as_index, l2_norm_of_rows, load_rows, load_tile, sequence_rows, split_dot,
                                  store_rows, store_tile, tma_ok, use_descriptors)

#: How the prologue finishes T = (I + A)^-1 after its 16x16 diagonal blocks (see _solve).
SOLVE = "blocks"
#: Every way of forming T that the prologue knows: _solve's five, which split a whole-chunk A into blocks ("blocks"
#: by masked sums, "moves" by reshapes, splits and joins: the same numbers; "doubling" with its diagonal blocks
#: inverted by products), and "by_blocks" (_wy_by_blocks), which forms A, T, W and U block by block.
SOLVES = ("blocks", "moves", "doubling", "tf32x3", "ieee", "by_blocks")
#: Forms for timing studies only, whose T is wrong: "identity" (T = I, no solve: what the rest of the prologue
#: costs). The backends refuse them; benchmarks/prologue_variants.py times them.
STUDY_SOLVES = ("identity",)
#: The warps wu_kernel may run at.
WU_WARPS = (2, 4, 8)


@triton.jit
def _l2_normalised(x):
    """x / sqrt(sum(x^2) + 1e-6) per row, in fp32 (the one l2-norm formula of every kernel)."""
    xf = x.to(tl.float32)
    return xf / l2_norm_of_rows(xf)[:, None]


@triton.jit
def l2norm_kernel(x_ptr, y_ptr, n_rows, D: tl.constexpr, BD: tl.constexpr, BR: tl.constexpr):
    """Row-wise l2 normalisation, computed in fp32, stored in y's dtype."""
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    mrow = rows < n_rows
    x = load_rows(x_ptr, rows, mrow, D, 0, BD, D)
    store_rows(y_ptr, rows, mrow, D, 0, _l2_normalised(x), BD, D)


@triton.jit
def log_norm_kernel(q_ptr, k_ptr, lq_ptr, lk_ptr, n_rows, D: tl.constexpr, BD: tl.constexpr, BR: tl.constexpr):
    """log of the l2 norm of every row of q (the first half of the programs, into lq) and of k (the second, into
    lk), fp32: what fold_norm folds into the gates, for both tensors in one launch. (Computed inside the prologue
    instead, the q tile and the reductions cost it 2.2x: docs/speed-notes.md item 29.)"""
    blocks = tl.cdiv(n_rows, BR)
    rows = (tl.program_id(0) % blocks) * BR + tl.arange(0, BR)
    mrow = rows < n_rows
    if tl.program_id(0) < blocks:
        tl.store(lq_ptr + rows, tl.log(l2_norm_of_rows(load_rows(q_ptr, rows, mrow, D, 0, BD, D).to(tl.float32))),
                 mask=mrow)
    else:
        tl.store(lk_ptr + rows, tl.log(l2_norm_of_rows(load_rows(k_ptr, rows, mrow, D, 0, BD, D).to(tl.float32))),
                 mask=mrow)


@triton.jit
def _keys(src_ptr, dst_ptr, rows, mrow, first, stride, D: tl.constexpr, DP: tl.constexpr, NORM: tl.constexpr,
          STORE: tl.constexpr, desc=None, r0=0, TMA: tl.constexpr = False):
    """A [BT, DP] tile of q or k (through `desc` with TMA: load_tile). With NORM it is l2-normalised in fp32 and
    rounded to the input dtype, exactly as l2norm_kernel does, and (STORE) stored for the later kernels by the value
    head with first == 0."""
    x = load_tile(src_ptr, desc, rows, mrow, stride, r0, 0, DP, D, TMA)
    if NORM:
        x = _l2_normalised(x).to(x.dtype)
        if STORE:
            store_rows(dst_ptr, rows, mrow & (tl.zeros_like(rows) == first), stride, 0, x, DP, D)
    return x


@triton.jit
def _block(a4, i: tl.constexpr, j: tl.constexpr):
    """Block (i, j) of a [4, 16, 4, 16] view of a 64x64 matrix, exactly (a one-hot masked sum)."""
    b = tl.arange(0, 4)
    pick = (b == i)[:, None, None, None] & (b == j)[None, None, :, None]
    return tl.sum(tl.sum(tl.where(pick, a4, 0.0), 2), 0)


@triton.jit
def _stack(x3, b: tl.constexpr):
    """Block b of a [4, 16, 16] stack, exactly."""
    return tl.sum(tl.where((tl.arange(0, 4) == b)[:, None, None], x3, 0.0), 0)


@triton.jit
def _inv_diag_blocks(a4, DOUBLING: tl.constexpr = False):
    """(I + D)^-1 for the four strictly lower-triangular 16x16 diagonal blocks D of a [4, 16, 4, 16] view, by
    forward substitution (_inv_stack) or with DOUBLING by products (_inv_stack_doubling)."""
    b = tl.arange(0, 4)
    d = tl.sum(tl.where((b[:, None] == b[None, :])[:, None, :, None], a4, 0.0), 2)
    if DOUBLING:
        t = _inv_stack_doubling(d)
        return _stack(t, 0), _stack(t, 1), _stack(t, 2), _stack(t, 3)
    else:
        return _inv_stack(d)


@triton.jit
def _inv_stack_doubling(d):
    """(I + D)^-1 for a [4, 16, 16] stack of strictly lower-triangular D as (I - D)(I + D^2)(I + D^4)(I + D^8),
    which is sum_{n < 16} (-D)^n, exact since D^16 = 0: six batched 16x16 fp32 products instead of fifteen
    dependent row steps. Not forward substitution's rounding: its terms can exceed T's entries and cancel (for
    16 equal keys and beta = 1, D^8's entries reach C(15, 8) = 6435 while T's are 0 or +-1)."""
    r = tl.arange(0, 16)
    eye = tl.where(r[:, None] == r[None, :], 1.0, 0.0)[None, :, :] + tl.zeros([4, 16, 16], tl.float32)
    d2 = tl.dot(d, d, input_precision="ieee")
    d4 = tl.dot(d2, d2, input_precision="ieee")
    d8 = tl.dot(d4, d4, input_precision="ieee")
    x = eye - d
    x = x + tl.dot(x, d2, input_precision="ieee")
    x = x + tl.dot(x, d4, input_precision="ieee")
    return x + tl.dot(x, d8, input_precision="ieee")


@triton.jit
def _inv_stack_raw(d):
    """(I + D)^-1 for a [4, 16, 16] stack of strictly lower-triangular blocks D, by forward substitution in fp32,
    row by row, all four blocks at once; as a stack."""
    r = tl.arange(0, 16)
    row_ids = r[None, :, None]
    t = tl.where(row_ids == r[None, None, :], 1.0, 0.0) + tl.zeros([4, 16, 16], tl.float32)
    for i in tl.static_range(1, 16):
        d_i = tl.sum(tl.where(row_ids == i, d, 0.0), 1)
        row = tl.where(r == i, 1.0, 0.0)[None, :] - tl.sum(d_i[:, :, None] * t, 1)
        t = tl.where(row_ids == i, row[:, None, :], t)
    return t


@triton.jit
def _inv_stack(d):
    """_inv_stack_raw's four inverses, each taken out of the stack by a masked sum."""
    t = _inv_stack_raw(d)
    return _stack(t, 0), _stack(t, 1), _stack(t, 2), _stack(t, 3)


@triton.jit
def _split4(x):
    """The four tensors x[..., a1, a0] (a = 2 a1 + a0 = 0..3) of x's last two dims, by register moves."""
    e, o = tl.split(x)
    x0, x2 = tl.split(e)
    x1, x3 = tl.split(o)
    return x0, x1, x2, x3


@triton.jit
def _join4(x0, x1, x2, x3):
    """x_a stacked into two new last dims [..., a0, a1] (a = 2 a1 + a0), by register moves (_split4's inverse up
    to the order of those dims)."""
    return tl.join(tl.join(x0, x1), tl.join(x2, x3))


@triton.jit
def _blocks_moved(a):
    """The ten 16x16 blocks on and below the diagonal of a 64x64 matrix, column by column (a00, a10, a20, a30,
    a11, ..., a33), by reshapes, a permute and splits (no arithmetic)."""
    a6 = tl.reshape(tl.permute(tl.reshape(a, [4, 16, 4, 16]), (1, 3, 0, 2)), [16, 16, 2, 2, 2, 2])
    c0, c1, c2, c3 = _split4(a6)  # column blocks j, each [16, 16, 2, 2] over (i1, i0)
    a00, a10, a20, a30 = _split4(c0)
    _, a11, a21, a31 = _split4(c1)
    _, _, a22, a32 = _split4(c2)
    _, _, _, a33 = _split4(c3)
    return a00, a10, a20, a30, a11, a21, a31, a22, a32, a33


@triton.jit
def _unstack4(x3):
    """The four 16x16 tiles of a [4, 16, 16] stack, by register moves (_stack4's inverse)."""
    return _split4(tl.reshape(tl.permute(x3, (1, 2, 0)), [16, 16, 2, 2]))


@triton.jit
def _assemble(t00, t10, t20, t30, t11, t21, t31, t22, t32, t33, BT: tl.constexpr):
    """The 64x64 lower block-triangular matrix with these blocks (t_ij at block row i, column j), by joins."""
    z = tl.zeros([16, 16], tl.float32)
    c0 = _join4(t00, t10, t20, t30)  # [16, 16, i0, i1]
    c1 = _join4(z, t11, t21, t31)
    c2 = _join4(z, z, t22, t32)
    c3 = _join4(z, z, z, t33)
    full = _join4(c0, c1, c2, c3)  # [r, c, i0, i1, j0, j1]
    return tl.reshape(tl.permute(full, (3, 2, 0, 5, 4, 1)), [BT, BT])


@triton.jit
def _mm(a, b):
    """A 16x16 fp32 product in full fp32 (the solve's precision)."""
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _off_diagonal(t00, t11, t22, t33, a10, a20, a21, a30, a31, a32):
    """The off-diagonal 16x16 blocks of T = (I + A)^-1 from its inverted diagonal blocks and A's blocks, by block
    substitution T_ij = -T_ii sum_{j<=m<i} A_im T_mj in 16x16 fp32 products."""
    t10 = -_mm(t11, _mm(a10, t00))
    t21 = -_mm(t22, _mm(a21, t11))
    t20 = -_mm(t22, _mm(a20, t00) + _mm(a21, t10))
    t32 = -_mm(t33, _mm(a32, t22))
    t31 = -_mm(t33, _mm(a31, t11) + _mm(a32, t21))
    t30 = -_mm(t33, _mm(a30, t00) + _mm(a31, t10) + _mm(a32, t20))
    return t10, t20, t21, t30, t31, t32


@triton.jit
def _place(acc, x, i: tl.constexpr, j: tl.constexpr):
    """acc ([4, 16, 4, 16]) with the 16x16 block x added at block (i, j)."""
    b = tl.arange(0, 4)
    at = (b == i)[:, None, None, None] & (b == j)[None, None, :, None]
    return acc + tl.where(at, x[None, :, None, :], 0.0)


@triton.jit
def _solve(a, BT: tl.constexpr, SOLVE: tl.constexpr):
    """T = (I + a)^-1 for a strictly lower-triangular 64x64 fp32 a. The 16x16 diagonal blocks D_i are inverted by
    forward substitution; then, by SOLVE:
    "blocks": block substitution T_ij = -T_ii sum_{j<=m<i} A_im T_mj in 16x16 fp32 products, A's blocks taken out
    and T's put together by masked sums over the whole [4, 16, 4, 16] view;
    "moves": the same products, with the blocks taken out and put together by reshapes, permutes, splits and joins
    (register moves, no arithmetic: the same numbers as "blocks");
    "doubling": "blocks" with the diagonal blocks inverted by six batched products (_inv_stack_doubling);
    "tf32x3" / "ieee": T = (I - N)(I + N^2) D^-1 with N = D^-1 (A - D), nilpotent (N^4 = 0), in four 64x64 dots
    of that input precision."""
    if SOLVE == "identity":  # a timing study's form (STUDY_SOLVES): no solve, T = I
        r = tl.arange(0, BT)
        t = tl.where(r[:, None] == r[None, :], 1.0, 0.0) + 0.0 * a
    elif SOLVE == "moves":
        t = _solve_moved(a, BT)
    else:
        t = _solve_masked(a, BT, SOLVE)
    return t


@triton.jit
def _solve_moved(a, BT: tl.constexpr):
    """_solve's "moves"."""
    a00, a10, a20, a30, a11, a21, a31, a22, a32, a33 = _blocks_moved(a)
    t00, t11, t22, t33 = _unstack4(_inv_stack_raw(_stack4(a00, a11, a22, a33)))
    t10, t20, t21, t30, t31, t32 = _off_diagonal(t00, t11, t22, t33, a10, a20, a21, a30, a31, a32)
    return _assemble(t00, t10, t20, t30, t11, t21, t31, t22, t32, t33, BT)


@triton.jit
def _solve_masked(a, BT: tl.constexpr, SOLVE: tl.constexpr):
    """_solve's "blocks", "doubling", "tf32x3" and "ieee"."""
    a4 = tl.reshape(a, [4, 16, 4, 16])
    t00, t11, t22, t33 = _inv_diag_blocks(a4, SOLVE == "doubling")
    t = tl.zeros([4, 16, 4, 16], tl.float32)
    # The diagonal blocks are placed in each branch, after the merge: placed before it, the Hopper build spills
    # 1192 instead of 848 B per thread.
    if (SOLVE == "blocks") or (SOLVE == "doubling"):
        t10, t20, t21, t30, t31, t32 = _off_diagonal(t00, t11, t22, t33, _block(a4, 1, 0), _block(a4, 2, 0),
                                                     _block(a4, 2, 1), _block(a4, 3, 0), _block(a4, 3, 1),
                                                     _block(a4, 3, 2))
        t = _place(_place(_place(_place(t, t00, 0, 0), t11, 1, 1), t22, 2, 2), t33, 3, 3)
        t = _place(_place(_place(t, t10, 1, 0), t20, 2, 0), t21, 2, 1)
        t = _place(_place(_place(t, t30, 3, 0), t31, 3, 1), t32, 3, 2)
        return tl.reshape(t, [BT, BT])
    else:
        t = _place(_place(_place(_place(t, t00, 0, 0), t11, 1, 1), t22, 2, 2), t33, 3, 3)
        r = tl.arange(0, BT)
        d_inv = tl.reshape(t, [BT, BT])
        eye = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
        n = tl.dot(d_inv, tl.where((r[:, None] // 16) == (r[None, :] // 16), 0.0, a), input_precision=SOLVE)
        x = eye - n
        x = x + tl.dot(x, tl.dot(n, n, input_precision=SOLVE), input_precision=SOLVE)
        return tl.dot(x, d_inv, input_precision=SOLVE)


@triton.jit
def _t_times_scaled(t, x, f):
    """T (bf16) times the rows of x scaled by f in fp32 and rounded to bf16: W = T diag(beta exp(G)) K and
    U = T diag(beta) V without SPLIT."""
    return tl.dot(t, (x.to(tl.float32) * f[:, None]).to(tl.bfloat16))


@triton.jit
def _part(x, i: tl.constexpr):
    """Rows 16i .. 16i + 15 of a 64-vector, exactly (a one-hot masked sum)."""
    return tl.sum(tl.where((tl.arange(0, 4) == i)[:, None], tl.reshape(x, [4, 16]), 0.0), 0)


@triton.jit
def _stack4(x0, x1, x2, x3):
    """The [4, 16, 16] stack of four 16x16 tiles, x_b at index b."""
    s = tl.join(tl.join(x0, x1), tl.join(x2, x3))  # [16, 16, 2, 2]: [..., p, q] is x_(2q + p)
    return tl.reshape(tl.permute(s, (3, 2, 0, 1)), [4, 16, 16])


@triton.jit
def _a_block(kb_i, k_j, g_i, g_j, m_i, m_j, DIAG: tl.constexpr):
    """Block (i, j) of the gated, strictly lower-triangular A from the (beta-scaled) row block i and row block j."""
    keep = m_i[:, None] & m_j[None, :]
    if DIAG:
        r = tl.arange(0, 16)
        keep = keep & (r[:, None] > r[None, :])
    a = tl.dot(kb_i, tl.trans(k_j))
    return tl.where(keep, a * tl.exp(tl.where(keep, g_i[:, None] - g_j[None, :], 0.0)), 0.0)


@triton.jit
def _row_product(t0, t1, t2, t3, x0, x1, x2, x3, I: tl.constexpr):
    """Row block I of T X: sum_{j <= I} t_j x_j in one accumulation chain, j ascending (the order of a whole-chunk
    dot, whose blocks above the diagonal add exact zeros)."""
    acc = tl.dot(t0, x0)
    if I >= 1:
        acc = tl.dot(t1, x1, acc)
    if I >= 2:
        acc = tl.dot(t2, x2, acc)
    if I >= 3:
        acc = tl.dot(t3, x3, acc)
    return acc


@triton.jit
def _wy_row(t0, t1, t2, t3, x0, x1, x2, x3, f0, f1, f2, f3, I: tl.constexpr, SPLIT: tl.constexpr):
    """Row block I of W (x: k's row blocks, f: beta exp(G)) or of U (x: v's, f: beta). Without SPLIT the rows of x
    are scaled by f and rounded to bf16 and T is bf16; with it T's columns take f in fp32 and T is split into two
    bf16 terms (tiles.split_dot), chained separately."""
    if SPLIT:
        s0, s1, s2, s3 = t0 * f0[None, :], t1 * f1[None, :], t2 * f2[None, :], t3 * f3[None, :]
        h0, h1, h2, h3 = s0.to(tl.bfloat16), s1.to(tl.bfloat16), s2.to(tl.bfloat16), s3.to(tl.bfloat16)
        hi = _row_product(h0, h1, h2, h3, x0, x1, x2, x3, I)
        lo = _row_product((s0 - h0.to(tl.float32)).to(tl.bfloat16), (s1 - h1.to(tl.float32)).to(tl.bfloat16),
                          (s2 - h2.to(tl.float32)).to(tl.bfloat16), (s3 - h3.to(tl.float32)).to(tl.bfloat16),
                          x0, x1, x2, x3, I)
        return hi + lo
    else:
        return _row_product(t0.to(tl.bfloat16), t1.to(tl.bfloat16), t2.to(tl.bfloat16), t3.to(tl.bfloat16),
                            (x0.to(tl.float32) * f0[:, None]).to(tl.bfloat16),
                            (x1.to(tl.float32) * f1[:, None]).to(tl.bfloat16),
                            (x2.to(tl.float32) * f2[:, None]).to(tl.bfloat16),
                            (x3.to(tl.float32) * f3[:, None]).to(tl.bfloat16), I)


@triton.jit
def _wy_by_blocks(k_ptr, kn_ptr, v_ptr, w_ptr, u_ptr, beta_ptr, lk_ptr, g_cum, row0, eos, i_h, i_hv, first,
                  H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, KP: tl.constexpr,
                  VP: tl.constexpr, NORM: tl.constexpr, FOLD: tl.constexpr, SPLIT: tl.constexpr):
    """A, T and W/U of one chunk (rows from row0) in 16-row blocks: each block of A is its own [16, K] x [K, 16]
    dot of two row blocks of k, T's blocks come from the same substitution as _solve's, and each row block of W
    and U is a chain of [16, 16] x [16, D] dots, so no 64x64 tile is split into blocks or assembled from them.
    Same products and order as the whole-chunk form."""
    r16 = tl.arange(0, 16)
    rw0, rw1, rw2, rw3 = row0 + r16, row0 + 16 + r16, row0 + 32 + r16, row0 + 48 + r16
    m0, m1, m2, m3 = rw0 < eos, rw1 < eos, rw2 < eos, rw3 < eos
    kp, knp = k_ptr + i_h * K, kn_ptr + i_h * K
    k0 = _keys(kp, knp, rw0, m0, first, H * K, K, KP, NORM, True)
    k1 = _keys(kp, knp, rw1, m1, first, H * K, K, KP, NORM, True)
    k2 = _keys(kp, knp, rw2, m2, first, H * K, K, KP, NORM, True)
    k3 = _keys(kp, knp, rw3, m3, first, H * K, K, KP, NORM, True)
    b0 = tl.load(beta_ptr + rw0 * HV + i_hv, mask=m0, other=0.0).to(tl.float32)
    b1 = tl.load(beta_ptr + rw1 * HV + i_hv, mask=m1, other=0.0).to(tl.float32)
    b2 = tl.load(beta_ptr + rw2 * HV + i_hv, mask=m2, other=0.0).to(tl.float32)
    b3 = tl.load(beta_ptr + rw3 * HV + i_hv, mask=m3, other=0.0).to(tl.float32)
    g0, g1, g2, g3 = _part(g_cum, 0), _part(g_cum, 1), _part(g_cum, 2), _part(g_cum, 3)
    gr0, gr1, gr2, gr3 = g0, g1, g2, g3  # the gates of A's rows (and W's operand) and of its columns
    gc0, gc1, gc2, gc3 = g0, g1, g2, g3
    if FOLD:
        l0 = tl.load(lk_ptr + rw0 * H + i_h, mask=m0, other=0.0)
        l1 = tl.load(lk_ptr + rw1 * H + i_h, mask=m1, other=0.0)
        l2 = tl.load(lk_ptr + rw2 * H + i_h, mask=m2, other=0.0)
        l3 = tl.load(lk_ptr + rw3 * H + i_h, mask=m3, other=0.0)
        gr0, gr1, gr2, gr3 = g0 - l0, g1 - l1, g2 - l2, g3 - l3
        gc0, gc1, gc2, gc3 = g0 + l0, g1 + l1, g2 + l2, g3 + l3
    kb0 = (k0.to(tl.float32) * b0[:, None]).to(k0.dtype)
    kb1 = (k1.to(tl.float32) * b1[:, None]).to(k1.dtype)
    kb2 = (k2.to(tl.float32) * b2[:, None]).to(k2.dtype)
    kb3 = (k3.to(tl.float32) * b3[:, None]).to(k3.dtype)
    a00 = _a_block(kb0, k0, gr0, gc0, m0, m0, True)
    a11 = _a_block(kb1, k1, gr1, gc1, m1, m1, True)
    a22 = _a_block(kb2, k2, gr2, gc2, m2, m2, True)
    a33 = _a_block(kb3, k3, gr3, gc3, m3, m3, True)
    a10, a20 = _a_block(kb1, k0, gr1, gc0, m1, m0, False), _a_block(kb2, k0, gr2, gc0, m2, m0, False)
    a21, a30 = _a_block(kb2, k1, gr2, gc1, m2, m1, False), _a_block(kb3, k0, gr3, gc0, m3, m0, False)
    a31, a32 = _a_block(kb3, k1, gr3, gc1, m3, m1, False), _a_block(kb3, k2, gr3, gc2, m3, m2, False)
    t00, t11, t22, t33 = _inv_stack(_stack4(a00, a11, a22, a33))
    t10, t20, t21, t30, t31, t32 = _off_diagonal(t00, t11, t22, t33, a10, a20, a21, a30, a31, a32)
    # k's row blocks are loaded again rather than kept live across the solve (fewer spills)
    k0 = _keys(kp, knp, rw0, m0, first, H * K, K, KP, NORM, False)
    k1 = _keys(kp, knp, rw1, m1, first, H * K, K, KP, NORM, False)
    k2 = _keys(kp, knp, rw2, m2, first, H * K, K, KP, NORM, False)
    k3 = _keys(kp, knp, rw3, m3, first, H * K, K, KP, NORM, False)
    f0, f1, f2, f3 = b0 * tl.exp(gr0), b1 * tl.exp(gr1), b2 * tl.exp(gr2), b3 * tl.exp(gr3)
    wp = w_ptr + i_hv * K
    store_rows(wp, rw0, m0, HV * K, 0, _wy_row(t00, t00, t00, t00, k0, k0, k0, k0, f0, f0, f0, f0, 0, SPLIT), KP, K)
    store_rows(wp, rw1, m1, HV * K, 0, _wy_row(t10, t11, t11, t11, k0, k1, k1, k1, f0, f1, f1, f1, 1, SPLIT), KP, K)
    store_rows(wp, rw2, m2, HV * K, 0, _wy_row(t20, t21, t22, t22, k0, k1, k2, k2, f0, f1, f2, f2, 2, SPLIT), KP, K)
    store_rows(wp, rw3, m3, HV * K, 0, _wy_row(t30, t31, t32, t33, k0, k1, k2, k3, f0, f1, f2, f3, 3, SPLIT), KP, K)
    vp, up = v_ptr + i_hv * V, u_ptr + i_hv * V
    v0 = load_rows(vp, rw0, m0, HV * V, 0, VP, V)
    v1 = load_rows(vp, rw1, m1, HV * V, 0, VP, V)
    v2 = load_rows(vp, rw2, m2, HV * V, 0, VP, V)
    v3 = load_rows(vp, rw3, m3, HV * V, 0, VP, V)
    store_rows(up, rw0, m0, HV * V, 0, _wy_row(t00, t00, t00, t00, v0, v0, v0, v0, b0, b0, b0, b0, 0, SPLIT), VP, V)
    store_rows(up, rw1, m1, HV * V, 0, _wy_row(t10, t11, t11, t11, v0, v1, v1, v1, b0, b1, b1, b1, 1, SPLIT), VP, V)
    store_rows(up, rw2, m2, HV * V, 0, _wy_row(t20, t21, t22, t22, v0, v1, v2, v2, b0, b1, b2, b2, 2, SPLIT), VP, V)
    store_rows(up, rw3, m3, HV * V, 0, _wy_row(t30, t31, t32, t33, v0, v1, v2, v3, b0, b1, b2, b3, 3, SPLIT), VP, V)


@triton.jit
def prologue_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, qn_ptr, kn_ptr, gcum_ptr, w_ptr, u_ptr, t_ptr, cu_ptr,
                    chunks_ptr, gq_ptr, gk_ptr, lq_ptr, lk_ptr, seg_ptr, H: tl.constexpr, HV: tl.constexpr,
                    K: tl.constexpr, V: tl.constexpr, KP: tl.constexpr, VP: tl.constexpr, BT: tl.constexpr,
                    NORM: tl.constexpr, SOLVE: tl.constexpr, I64: tl.constexpr = True, FOLD: tl.constexpr = False,
                    SPLIT: tl.constexpr = False, LOOP: tl.constexpr = False, LOOP_STAGES: tl.constexpr = 2,
                    TMA: tl.constexpr = False, STORE_T: tl.constexpr = False):
    """One program per (chunk, value head): [q/k l2-norm,] cumsum, A, T = (I + A)^-1 and W/U for that chunk.

    A, W and U are whole-chunk tensor-core dots; the solve works on 16x16 blocks (see _solve), so no 64x64 fp32
    product runs on the FMA units.

    FOLD (the l2-norm folded into the gates): q and k stay raw and no normalised row is ever rounded. Every
    product of the chunked form meets a row's norm through an exp of the cumulative gate, so the norms go there:
    from the rows' log-norms (lq_ptr / lk_ptr, fp32 [tokens, H], log_norm_kernel) the kernel stores
    gq = G - log|q| and gk = G + log|k| (fp32 [tokens, HV], gq_ptr / gk_ptr) for the later kernels, and uses
    G - log|k| for A's rows and W's operand and gk for A's columns.

    SPLIT (W and U without rounded operands): W = T diag(beta exp(G)) K and U = T diag(beta) V are formed as the
    fp32 T with the per-row factors scaled into its columns, split into two bf16 terms (tiles.split_dot) and multiplied
    into the k and v rows as loaded, so neither T nor beta exp(G) K nor beta V is rounded to bf16.

    STORE_T (the walk applies T): T itself is stored, bf16 [tokens, HV, BT] rows (t_ptr), and W and U are neither
    formed nor stored; the state kernel's T_FORM computes V_new = T diag(beta) (V - diag(exp(G)) K S) instead.
    """
    i_hv = tl.program_id(1)
    i_h = i_hv // (HV // H)
    if LOOP:
        i_n = tl.load(seg_ptr + 3 * tl.program_id(0))
        t0 = tl.load(seg_ptr + 3 * tl.program_id(0) + 1)
        t1 = tl.load(seg_ptr + 3 * tl.program_id(0) + 2)
    else:
        i_n = tl.load(chunks_ptr + 2 * tl.program_id(0))
        t0 = tl.load(chunks_ptr + 2 * tl.program_id(0) + 1)
        t1 = t0 + 1
    bos = as_index(tl.load(cu_ptr + i_n), I64)
    eos = as_index(tl.load(cu_ptr + i_n + 1), I64)
    kd, vd, wd, ud = None, None, None, None
    if TMA:
        n_rows = (eos - bos).to(tl.int32)
        kd = sequence_rows(k_ptr + i_h * K, bos, n_rows, H * K, K, BT, KP)
        vd = sequence_rows(v_ptr + i_hv * V, bos, n_rows, HV * V, V, BT, VP)
        wd = sequence_rows(w_ptr + i_hv * K, bos, n_rows, HV * K, K, BT, KP)
        ud = sequence_rows(u_ptr + i_hv * V, bos, n_rows, HV * V, V, BT, VP)
    if LOOP:
        for i_t in tl.range(t0, t1, num_stages=LOOP_STAGES):
            _prologue_chunk(bos, eos, i_t, i_hv, kd, vd, wd, ud, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, qn_ptr, kn_ptr,
                            gcum_ptr, w_ptr, u_ptr, t_ptr, gq_ptr, gk_ptr, lq_ptr, lk_ptr, H, HV, K, V, KP, VP, BT,
                            NORM, SOLVE, FOLD, SPLIT, TMA, STORE_T)
    else:
        _prologue_chunk(bos, eos, t0, i_hv, kd, vd, wd, ud, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, qn_ptr, kn_ptr,
                        gcum_ptr, w_ptr, u_ptr, t_ptr, gq_ptr, gk_ptr, lq_ptr, lk_ptr, H, HV, K, V, KP, VP, BT, NORM,
                        SOLVE, FOLD, SPLIT, TMA, STORE_T)

@triton.jit
def _prologue_chunk(bos, eos, i_t, i_hv, kd, vd, wd, ud, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, qn_ptr, kn_ptr, gcum_ptr,
                    w_ptr, u_ptr, t_ptr, gq_ptr, gk_ptr, lq_ptr, lk_ptr, H: tl.constexpr, HV: tl.constexpr,
                    K: tl.constexpr, V: tl.constexpr, KP: tl.constexpr, VP: tl.constexpr, BT: tl.constexpr,
                    NORM: tl.constexpr, SOLVE: tl.constexpr, FOLD: tl.constexpr, SPLIT: tl.constexpr,
                    TMA: tl.constexpr, STORE_T: tl.constexpr):
    """prologue_kernel's work for chunk i_t of the sequence in rows bos..eos, value head i_hv."""
    i_h = i_hv // (HV // H)
    first = i_hv % (HV // H)  # 0 on the value head that stores the normalised q and k
    r = tl.arange(0, BT)
    rows = bos + i_t * BT + r
    mrow = rows < eos

    g_cum = tl.cumsum(tl.load(g_ptr + rows * HV + i_hv, mask=mrow, other=0.0).to(tl.float32), 0)
    tl.store(gcum_ptr + rows * HV + i_hv, g_cum, mask=mrow)
    beta = tl.load(beta_ptr + rows * HV + i_hv, mask=mrow, other=0.0).to(tl.float32)
    if NORM:
        _keys(q_ptr + i_h * K, qn_ptr + i_h * K, rows, mrow, first, H * K, K, KP, NORM, True)
    if SOLVE == "by_blocks":
        if FOLD:
            l_k = tl.load(lk_ptr + rows * H + i_h, mask=mrow, other=0.0)
            tl.store(gq_ptr + rows * HV + i_hv, g_cum - tl.load(lq_ptr + rows * H + i_h, mask=mrow, other=0.0),
                     mask=mrow)
            tl.store(gk_ptr + rows * HV + i_hv, g_cum + l_k, mask=mrow)
        _wy_by_blocks(k_ptr, kn_ptr, v_ptr, w_ptr, u_ptr, beta_ptr, lk_ptr, g_cum, bos + i_t * BT, eos, i_h, i_hv,
                      first, H, HV, K, V, KP, VP, NORM, FOLD, SPLIT)
    else:
        r0 = i_t * BT
        kt = _keys(k_ptr + i_h * K, kn_ptr + i_h * K, rows, mrow, first, H * K, K, KP, NORM, True, kd, r0, TMA)
        g_row, g_col = g_cum, g_cum  # the gates of A's rows (and W's operand) and of its columns
        if FOLD:
            log_k = tl.load(lk_ptr + rows * H + i_h, mask=mrow, other=0.0)
            g_row, g_col = g_cum - log_k, g_cum + log_k
            tl.store(gq_ptr + rows * HV + i_hv, g_cum - tl.load(lq_ptr + rows * H + i_h, mask=mrow, other=0.0), mask=mrow)
            tl.store(gk_ptr + rows * HV + i_hv, g_col, mask=mrow)

        a = tl.dot((kt.to(tl.float32) * beta[:, None]).to(kt.dtype), tl.trans(kt))
        strict = (r[:, None] > r[None, :]) & mrow[:, None] & mrow[None, :]
        a = tl.where(strict, a * tl.exp(tl.where(strict, g_row[:, None] - g_col[None, :], 0.0)), 0.0)
        t32 = _solve(a, BT, SOLVE)
        t = t32.to(tl.bfloat16)  # (without SPLIT t32 dies here: the order the H200 runs measured)
        if STORE_T:
            store_rows(t_ptr + i_hv * BT, rows, mrow, HV * BT, 0, t, BT, BT)
        else:
            # k is loaded (and normalised) again rather than kept live across the solve: the form the H200 runs
            # measured; the Hopper build spills the same 848 B either way (docs/speed-notes.md).
            kt = _keys(k_ptr + i_h * K, kn_ptr + i_h * K, rows, mrow, first, H * K, K, KP, NORM, False, kd, r0, TMA)
            if SPLIT:
                w = split_dot(t32 * (beta * tl.exp(g_row))[None, :], kt)
            else:
                w = _t_times_scaled(t, kt, beta * tl.exp(g_row))
            store_tile(w_ptr + i_hv * K, wd, rows, mrow, HV * K, r0, 0, w, KP, K, TMA)
            vt = load_tile(v_ptr + i_hv * V, vd, rows, mrow, HV * V, r0, 0, VP, V, TMA)
            if SPLIT:
                u = split_dot(t32 * beta[None, :], vt)
            else:
                u = _t_times_scaled(t, vt, beta)
            store_tile(u_ptr + i_hv * V, ud, rows, mrow, HV * V, r0, 0, u, VP, V, TMA)


@triton.jit
def wu_kernel(t_ptr, k_ptr, v_ptr, beta_ptr, gcum_ptr, lk_ptr, w_ptr, u_ptr, cu_ptr, chunks_ptr, H: tl.constexpr,
              HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, KP: tl.constexpr, VP: tl.constexpr,
              BT: tl.constexpr, I64: tl.constexpr = True, FOLD: tl.constexpr = False):
    """One program per (chunk, value head): W = T diag(beta exp(G)) K and U = T diag(beta) V from the T that a
    STORE_T prologue stored (bf16 rows), the keys it read (normalised, or raw with FOLD and G - log|k| as W's gate)
    and the cumulative gate it stored; prologue_kernel's products of W and U without SPLIT, on the same operands
    rounded the same way, in a kernel of its own that holds no solve (the prologue's registers stay the T-only
    prologue's). Bit-equal to them on the CPU interpreter; on a GPU another warp count may build other MMA
    instructions."""
    i_hv = tl.program_id(1)
    i_h = i_hv // (HV // H)
    i_n = tl.load(chunks_ptr + 2 * tl.program_id(0))
    i_t = tl.load(chunks_ptr + 2 * tl.program_id(0) + 1)
    bos = as_index(tl.load(cu_ptr + i_n), I64)
    eos = as_index(tl.load(cu_ptr + i_n + 1), I64)
    rows = bos + i_t * BT + tl.arange(0, BT)
    mrow = rows < eos
    t = load_rows(t_ptr + i_hv * BT, rows, mrow, HV * BT, 0, BT, BT)
    beta = tl.load(beta_ptr + rows * HV + i_hv, mask=mrow, other=0.0).to(tl.float32)
    g_row = tl.load(gcum_ptr + rows * HV + i_hv, mask=mrow, other=0.0)
    if FOLD:
        g_row = g_row - tl.load(lk_ptr + rows * H + i_h, mask=mrow, other=0.0)
    kt = load_rows(k_ptr + i_h * K, rows, mrow, H * K, 0, KP, K)
    store_rows(w_ptr + i_hv * K, rows, mrow, HV * K, 0, _t_times_scaled(t, kt, beta * tl.exp(g_row)), KP, K)
    vt = load_rows(v_ptr + i_hv * V, rows, mrow, HV * V, 0, VP, V)
    store_rows(u_ptr + i_hv * V, rows, mrow, HV * V, 0, _t_times_scaled(t, vt, beta), VP, V)

_PLANS: dict = {}


@dataclass
class ChunkPlan:
    """Where every sequence and chunk of a (flattened) batch lies: sequences as cu_seqlens, chunks as (seq, idx)."""

    cu_seqlens: torch.Tensor  # int32 [N+1]
    chunks: torch.Tensor  # int32 [NC, 2]
    chunk_offsets: torch.Tensor  # int32 [N+1]: first global chunk of each sequence
    n_chunks: int
    seq_chunks: tuple[int, ...] = ()  # chunks of each sequence, on the host
    _segments: dict = field(default_factory=dict, repr=False)

    def segments(self, per: int) -> torch.Tensor:
        """Every sequence's chunks cut into runs of at most `per`, as int32 rows (sequence, first chunk, end chunk),
        made once per `per` (a looping prologue's programs) from host data (no copy back from the device)."""
        if per not in self._segments:
            rows = [(n, t, min(t + per, nt)) for n, nt in enumerate(self.seq_chunks) for t in range(0, nt, per)]
            self._segments[per] = torch.tensor(rows or [(0, 0, 0)], dtype=torch.int32,
                                               device=self.chunks.device).reshape(-1, 3)
        return self._segments[per]

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """Every device tensor of this plan (the segments made so far included): what a call's signature fixes,
        so that gdnlab.plans passes them to a replayed launch as they are."""
        return (self.cu_seqlens, self.chunks, self.chunk_offsets, *self._segments.values())

    def runs(self, programs: int, every: int = 1) -> torch.Tensor | None:
        """The segments for about `programs` looping programs (per value head), each run a multiple of `every`
        chunks long, or None where one program per chunk is what that asks for (`every` 1 and `programs` 0 or at
        least as many as the chunks); with `every` > 1 and no loop, runs of `every` chunks."""
        if 0 < programs < self.n_chunks:
            return self.segments(-(-self.n_chunks // (programs * every)) * every)
        return self.segments(every) if every > 1 else None

    @classmethod
    def build(cls, bounds: list[tuple[int, int]], device: torch.device) -> "ChunkPlan":
        """The plan for these sequence bounds, cached so that a repeated call (or a CUDA graph capture) makes no
        host-to-device copy."""
        key = (tuple(bounds), str(torch.device(device)))
        if key not in _PLANS:
            if len(_PLANS) >= 256:
                _PLANS.pop(next(iter(_PLANS)))
            _PLANS[key] = cls._build(bounds, device)
        return _PLANS[key]

    @classmethod
    def _build(cls, bounds: list[tuple[int, int]], device: torch.device) -> "ChunkPlan":
        pairs, offsets, counts = [], [0], []
        for n, (bos, eos) in enumerate(bounds):
            nt = -(-(eos - bos) // BT)
            pairs += [(n, i) for i in range(nt)]
            offsets.append(offsets[-1] + nt)
            counts.append(nt)
        cu = [b for b, _ in bounds] + [bounds[-1][1]] if bounds else [0]
        chunks = torch.tensor(pairs or [(0, 0)], dtype=torch.int32, device=device).reshape(-1, 2)
        return cls(torch.tensor(cu, dtype=torch.int32, device=device), chunks,
                   torch.tensor(offsets, dtype=torch.int32, device=device), len(pairs), tuple(counts))


@dataclass
class Prologue:
    """What the prologue hands to the state/output stage. q, k are l2-normalised when asked (or raw, with the
    norms folded into the gates g_q and g_k, when fold_norm asked for that)."""

    q: torch.Tensor
    k: torch.Tensor
    g_cum: torch.Tensor  # fp32 [tokens, HV]
    w: torch.Tensor | None  # bf16 [tokens, HV, K] (None with store_t)
    u: torch.Tensor | None  # bf16 [tokens, HV, V] (None with store_t)
    norm_q: bool = False  # q is still to be l2-normalised, by the output kernel
    g_q: torch.Tensor | None = None  # fold_norm: q and k are raw; G - log|q| and G + log|k| per row and value
    g_k: torch.Tensor | None = None  # head (fp32 [tokens, HV]), the gates of the output's and the state's products
    t: torch.Tensor | None = None  # store_t: T, bf16 [tokens, HV, BT] (row i: its chunk's row of T)
    log_k: torch.Tensor | None = None  # store_t with fold_norm: log|k| (fp32 [tokens, H]), for W's gate G - log|k|
    beta: torch.Tensor | None = None  # store_t: the input beta rows ([tokens, HV]), for the walk's diag(beta)


def wide_index(*tensors: torch.Tensor) -> bool:
    """True when some tensor has 2^31 elements or more, so that the kernels must index in int64 (their I64)."""
    return max(t.numel() for t in tensors) >= 2 ** 31


def forms_w_and_u(*, split_wu: bool, tma: bool, solve: str) -> bool:
    """Whether these prologue options need W and U formed, which store_t (the walk applies T) does not do."""
    return split_wu or tma or solve == "by_blocks"


def alloc(shape, dtype, device, poison: bool) -> torch.Tensor:
    """Every buffer the kernels' wrappers make (NaN-filled when poisoned), noted for gdnlab.plans (note_made)."""
    return note_made(torch.full(shape, float("nan"), dtype=dtype, device=device) if poison else torch.empty(
        shape, dtype=dtype, device=device))


def l2norm(x: torch.Tensor, poison: bool = False) -> torch.Tensor:
    """Row-wise l2 normalisation of the last dim, in fp32, rounded to x's dtype."""
    d = x.shape[-1]
    y = alloc(x.shape, x.dtype, x.device, poison)
    n = x.numel() // d
    br = 16
    launch(l2norm_kernel, (cdiv(n, br),), x, y, n, D=d, BD=pow2(d), BR=br, device=x.device)
    return y


def log_norm(q: torch.Tensor, k: torch.Tensor, poison: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """log of the l2 norm of every row of q and of k (``[tokens, H, K]`` each), fp32 ``[tokens, H]`` each, in one
    launch of log_norm_kernel."""
    d, n = k.shape[-1], k.numel() // k.shape[-1]
    lq, lk = (alloc(k.shape[:-1], torch.float32, k.device, poison) for _ in range(2))
    br = 16
    launch(log_norm_kernel, (2 * cdiv(n, br),), q, k, lq, lk, n, D=d, BD=pow2(d), BR=br, device=k.device)
    return lq, lk


def run_prologue(q, k, v, g, beta, plan: ChunkPlan, use_qk_l2norm: bool, poison: bool = False,
                 fuse_norm: bool = False, num_warps: int = 4, solve: str = SOLVE,
                 norm_q_in_output: bool = False, index64: bool | None = None, fold_norm: bool = False,
                 split_wu: bool = False, programs: int = 0, stages: int = 2, tma: bool = False,
                 store_t: bool = False, maxnreg: int = 0, wu_apart: bool = False, wu_warps: int = 8) -> Prologue:
    """Launch the shared prologue on flattened `[tokens, heads, D]` tensors. The q/k l2-norm runs as two launches
    of l2norm_kernel (as the two-kernel pipeline does) or, with `fuse_norm`, inside the prologue kernel; with
    `norm_q_in_output` only k's runs here and q's is left to the output kernel (Prologue.norm_q). With `fold_norm`
    (two-kernel path only) q and k stay raw and the prologue folds their rows' log-norms (one launch of
    log_norm_kernel) into the gates (its FOLD). `split_wu`: W and U from unrounded operands (its SPLIT). `index64`:
    int64 indices (None: where a buffer needs them). `programs`: 0 launches one program per chunk and value head;
    more, about that many per value head, each looping over a run of one sequence's chunks `stages` deep (the
    kernel's LOOP). `tma`: k, v, W and U through tensor descriptors where the buffers allow it (tma_ok; its TMA;
    not with the "by_blocks" solve). The same numbers in every case. `store_t`: T is stored instead of W and U (its
    STORE_T; Prologue.t), for a state kernel that applies T itself (two_kernel's walk_t); not with split_wu, tma or
    the "by_blocks" solve. `maxnreg`: the registers a thread may use (0: the compiler's
    choice, up to 255; an NVIDIA launch option); fewer let more programs share a multiprocessor at the cost of
    spills (item 50). `wu_apart`: the prologue stores T only (its STORE_T) and wu_kernel then forms W and U from it
    at `wu_warps` warps (WU_WARPS; 8 by default, where its sm_90 build holds 64 registers a thread and no spills),
    prologue_kernel's products apart from the solve (not with store_t, nor where store_t is refused; item 72)."""
    if maxnreg and not 32 <= maxnreg <= 255:
        raise ValueError(f"maxnreg: must be 0 or from 32 to 255, got {maxnreg!r}")
    if programs < 0 or stages < 1:
        raise ValueError(f"programs, stages: need programs >= 0 and stages >= 1, got {programs!r}, {stages!r}")
    if tma and solve == "by_blocks":
        raise ValueError("tma: takes a whole-chunk solve, not by_blocks")
    if store_t and forms_w_and_u(split_wu=split_wu, tma=tma, solve=solve):
        raise ValueError("store_t: takes neither split_wu nor tma nor the by_blocks solve (no W or U is formed)")
    if wu_apart and (store_t or forms_w_and_u(split_wu=split_wu, tma=tma, solve=solve)):
        raise ValueError("wu_apart: W and U are formed from a stored T; takes neither store_t nor split_wu nor tma "
                         "nor the by_blocks solve")
    if wu_warps not in WU_WARPS:
        raise ValueError(f"wu_warps: must be one of {', '.join(map(str, WU_WARPS))}, got {wu_warps!r}")
    tokens, H, K = k.shape
    HV, V = v.shape[1], v.shape[2]
    dev = k.device
    fold = use_qk_l2norm and fold_norm
    if fold and (fuse_norm or norm_q_in_output):
        raise ValueError("fold_norm: takes neither fuse_norm nor norm_q_in_output (the norm is folded, not applied)")
    g_q = alloc((tokens, HV), torch.float32, dev, poison) if fold else None
    g_k = alloc((tokens, HV), torch.float32, dev, poison) if fold else None
    log_norms = log_norm(q, k, poison) if fold else None
    norm_inside = use_qk_l2norm and fuse_norm
    norm_q = use_qk_l2norm and norm_q_in_output and not fuse_norm
    if use_qk_l2norm and not fuse_norm and not fold:
        q, k = (q if norm_q else l2norm(q, poison)), l2norm(k, poison)
    qn = alloc(q.shape, q.dtype, dev, poison) if norm_inside else q
    kn = alloc(k.shape, k.dtype, dev, poison) if norm_inside else k
    g_cum = alloc((tokens, HV), torch.float32, dev, poison)
    t = alloc((tokens, HV, BT), torch.bfloat16, dev, poison) if store_t or wu_apart else None
    w = None if store_t else alloc((tokens, HV, K), torch.bfloat16, dev, poison)
    u = None if store_t else alloc((tokens, HV, V), torch.bfloat16, dev, poison)
    tma = tma and tma_ok(k, v, w, u)
    if tma:
        use_descriptors()
    if plan.n_chunks:
        segs = plan.runs(programs)
        launch(prologue_kernel, (plan.n_chunks if segs is None else segs.shape[0], HV), q, k, v, g, beta, qn, kn,
               g_cum, *((t, t, t) if store_t or wu_apart else (w, u, g_cum)), plan.cu_seqlens, plan.chunks,
               g_q if fold else g_cum, g_k if fold else g_cum,
               log_norms[0] if fold else g_cum, log_norms[1] if fold else g_cum,
               plan.chunks if segs is None else segs, H=H, HV=HV, K=K, V=V, KP=pow2(K), LOOP=segs is not None,
               LOOP_STAGES=stages, TMA=tma,
               VP=pow2(V), BT=BT, NORM=norm_inside, SOLVE=solve, num_warps=num_warps, device=dev,
               I64=wide_index(q, v, *(x for x in (t, w) if x is not None)) if index64 is None else index64,
               FOLD=fold,
               SPLIT=split_wu, STORE_T=store_t or wu_apart, **({"maxnreg": maxnreg} if maxnreg else {}))
        if wu_apart:
            launch(wu_kernel, (plan.n_chunks, HV), t, kn, v, beta, g_cum, log_norms[1] if fold else g_cum, w, u,
                   plan.cu_seqlens, plan.chunks, H=H, HV=HV, K=K, V=V, KP=pow2(K), VP=pow2(V), BT=BT,
                   I64=wide_index(q, v, w, t) if index64 is None else index64, FOLD=fold,
                   num_warps=wu_warps, device=dev)
    if wu_apart:
        t = None  # the walk takes W and U
    return Prologue(qn, kn, g_cum, w, u, norm_q, g_q, g_k, t, log_norms[1] if fold and store_t else None,
                    beta if store_t else None)
