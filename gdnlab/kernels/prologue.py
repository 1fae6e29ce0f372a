"""The prologue every chunked path shares: optional q/k l2-norm, then per chunk the cumulative gate, the gated
beta.K.K^T, its unit-lower-triangular inverse T = (I + A)^-1, and the WY factors W = T(beta exp(G) K), U = T(beta V).

Rounding (DESIGN.md section 3): G and A are fp32; T is solved in fp32 and rounded to bf16; W and U are stored bf16.
BT is fixed at 64 (the solve works on four 16-row blocks).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from gdnlab.interp import launch
from gdnlab.kernels.tiles import load_rows, store_rows

BT = 64
#: How the prologue finishes T = (I + A)^-1 after its 16x16 diagonal blocks (see _solve).
SOLVE = "blocks"


@triton.jit
def _l2_normalised(x):
    """x / sqrt(sum(x^2) + 1e-6) per row, in fp32 (the one l2-norm formula of every kernel)."""
    xf = x.to(tl.float32)
    return xf / tl.sqrt(tl.sum(xf * xf, 1) + 1e-6)[:, None]


@triton.jit
def l2norm_kernel(x_ptr, y_ptr, n_rows, D: tl.constexpr, BD: tl.constexpr, BR: tl.constexpr):
    """Row-wise l2 normalisation, computed in fp32, stored in y's dtype."""
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    mrow = rows < n_rows
    store_rows(y_ptr, rows, mrow, D, 0, _l2_normalised(load_rows(x_ptr, rows, mrow, D, 0, BD, D)), BD, D)


@triton.jit
def _keys(src_ptr, dst_ptr, rows, mrow, first, stride, D: tl.constexpr, DP: tl.constexpr, NORM: tl.constexpr,
          STORE: tl.constexpr):
    """A [BT, DP] tile of q or k. With NORM it is l2-normalised in fp32 and rounded to the input dtype, exactly as
    l2norm_kernel does, and (STORE) stored for the later kernels by the value head with first == 0."""
    x = load_rows(src_ptr, rows, mrow, stride, 0, DP, D)
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
def _inv_diag_blocks(a4):
    """(I + D)^-1 for the four strictly lower-triangular 16x16 diagonal blocks D of a [4, 16, 4, 16] view, by
    forward substitution in fp32, row by row, all four blocks at once as one [4, 16, 16] stack."""
    b = tl.arange(0, 4)
    d = tl.sum(tl.where((b[:, None] == b[None, :])[:, None, :, None], a4, 0.0), 2)
    r = tl.arange(0, 16)
    row_ids = r[None, :, None]
    t = tl.where(row_ids == r[None, None, :], 1.0, 0.0) + tl.zeros([4, 16, 16], tl.float32)
    for i in tl.static_range(1, 16):
        d_i = tl.sum(tl.where(row_ids == i, d, 0.0), 1)
        row = tl.where(r == i, 1.0, 0.0)[None, :] - tl.sum(d_i[:, :, None] * t, 1)
        t = tl.where(row_ids == i, row[:, None, :], t)
    return _stack(t, 0), _stack(t, 1), _stack(t, 2), _stack(t, 3)


@triton.jit
def _mm(a, b):
    """A 16x16 fp32 product in full fp32 (the solve's precision)."""
    return tl.dot(a, b, input_precision="ieee")


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
    "blocks": block substitution T_ij = -T_ii sum_{j<=m<i} A_im T_mj in 16x16 fp32 products;
    "tf32x3" / "ieee": T = (I - N)(I + N^2) D^-1 with N = D^-1 (A - D), nilpotent (N^4 = 0), in four 64x64 dots
    of that input precision."""
    a4 = tl.reshape(a, [4, 16, 4, 16])
    t00, t11, t22, t33 = _inv_diag_blocks(a4)
    t = tl.zeros([4, 16, 4, 16], tl.float32)
    # The diagonal blocks are placed in each branch, after the merge: placed before it, the Hopper build spills
    # 1192 instead of 848 B per thread.
    if SOLVE == "blocks":
        a10, a20, a21 = _block(a4, 1, 0), _block(a4, 2, 0), _block(a4, 2, 1)
        a30, a31, a32 = _block(a4, 3, 0), _block(a4, 3, 1), _block(a4, 3, 2)
        t10 = -_mm(t11, _mm(a10, t00))
        t21 = -_mm(t22, _mm(a21, t11))
        t20 = -_mm(t22, _mm(a20, t00) + _mm(a21, t10))
        t32 = -_mm(t33, _mm(a32, t22))
        t31 = -_mm(t33, _mm(a31, t11) + _mm(a32, t21))
        t30 = -_mm(t33, _mm(a30, t00) + _mm(a31, t10) + _mm(a32, t20))
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
def prologue_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, qn_ptr, kn_ptr, gcum_ptr, w_ptr, u_ptr, cu_ptr, chunks_ptr,
                    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, KP: tl.constexpr,
                    VP: tl.constexpr, BT: tl.constexpr, NORM: tl.constexpr, SOLVE: tl.constexpr):
    """One program per (chunk, value head): [q/k l2-norm,] cumsum, A, T = (I + A)^-1 and W/U for that chunk.

    A, W and U are whole-chunk tensor-core dots; the solve works on 16x16 blocks (see _solve), so no 64x64 fp32
    product runs on the FMA units.
    """
    i_c, i_hv = tl.program_id(0), tl.program_id(1)
    i_n = tl.load(chunks_ptr + 2 * i_c)
    i_t = tl.load(chunks_ptr + 2 * i_c + 1)
    bos = tl.load(cu_ptr + i_n).to(tl.int64)
    eos = tl.load(cu_ptr + i_n + 1).to(tl.int64)
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
    kt = _keys(k_ptr + i_h * K, kn_ptr + i_h * K, rows, mrow, first, H * K, K, KP, NORM, True)

    a = tl.dot((kt.to(tl.float32) * beta[:, None]).to(kt.dtype), tl.trans(kt))
    strict = (r[:, None] > r[None, :]) & mrow[:, None] & mrow[None, :]
    a = tl.where(strict, a * tl.exp(tl.where(strict, g_cum[:, None] - g_cum[None, :], 0.0)), 0.0)
    t = _solve(a, BT, SOLVE).to(tl.bfloat16)

    # k is loaded (and normalised) again rather than kept live across the solve: the form the H200 runs measured;
    # the Hopper build spills the same 848 B either way (benchmarks/NOTES.md).
    kt = _keys(k_ptr + i_h * K, kn_ptr + i_h * K, rows, mrow, first, H * K, K, KP, NORM, False)
    kb = (kt.to(tl.float32) * (beta * tl.exp(g_cum))[:, None]).to(tl.bfloat16)
    store_rows(w_ptr + i_hv * K, rows, mrow, HV * K, 0, tl.dot(t, kb), KP, K)
    vt = load_rows(v_ptr + i_hv * V, rows, mrow, HV * V, 0, VP, V)
    vb = (vt.to(tl.float32) * beta[:, None]).to(tl.bfloat16)
    store_rows(u_ptr + i_hv * V, rows, mrow, HV * V, 0, tl.dot(t, vb), VP, V)


@triton.jit
def _stack4(a0, a1, a2, a3):
    """Four [16, 16] tiles as one [4, 16, 16] stack (exact: a permutation of registers)."""
    return tl.reshape(tl.permute(tl.join(tl.join(a0, a2), tl.join(a1, a3)), (2, 3, 0, 1)), [4, 16, 16])


@triton.jit
def _unstack4(s):
    """The inverse of _stack4."""
    x02, x13 = tl.split(tl.permute(tl.reshape(s, [2, 2, 16, 16]), (2, 3, 0, 1)))
    a0, a2 = tl.split(x02)
    a1, a3 = tl.split(x13)
    return a0, a1, a2, a3


@triton.jit
def _forward_substitution(d):
    """(I + D)^-1 for a [4, 16, 16] stack of strictly lower-triangular D, row by row in fp32."""
    r = tl.arange(0, 16)
    row_ids = r[None, :, None]
    t = tl.where(row_ids == r[None, None, :], 1.0, 0.0) + tl.zeros([4, 16, 16], tl.float32)
    for i in tl.static_range(1, 16):
        d_i = tl.sum(tl.where(row_ids == i, d, 0.0), 1)
        row = tl.where(r == i, 1.0, 0.0)[None, :] - tl.sum(d_i[:, :, None] * t, 1)
        t = tl.where(row_ids == i, row[:, None, :], t)
    return t


@triton.jit
def _sub_rows(bos, i_t, eos, b: tl.constexpr, BT: tl.constexpr):
    """Rows and mask of the b-th 16-row block of a chunk."""
    rows = bos + i_t * BT + b * 16 + tl.arange(0, 16)
    return rows, rows < eos


@triton.jit
def _beta_rows(k, beta_ptr, rows, m, HV: tl.constexpr):
    """beta * k for a tile of rows, rounded to k's dtype (the left operand of A)."""
    return (k.to(tl.float32) * tl.load(beta_ptr + rows * HV, mask=m, other=0.0).to(tl.float32)[:, None]).to(k.dtype)


@triton.jit
def _kkt(kb_i, k_j, g_i, g_j, m_i, m_j, DIAG: tl.constexpr):
    """One 16x16 block of A = beta K K^T * exp(G_i - G_j): strictly lower on the diagonal, masked rows zero."""
    a = tl.dot(kb_i, tl.trans(k_j))
    keep = m_i[:, None] & m_j[None, :]
    if DIAG:
        r = tl.arange(0, 16)
        keep = keep & (r[:, None] > r[None, :])
    return tl.where(keep, a * tl.exp(tl.where(keep, g_i[:, None] - g_j[None, :], 0.0)), 0.0)


@triton.jit
def _store_block(t_ptr, rows, m, stride, b: tl.constexpr, x):
    """Store a 16x16 block of T (bf16) at column block b of its rows."""
    store_rows(t_ptr, rows, m, stride, b * 16, x, 16, 64)


@triton.jit
def prologue_rows_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, qn_ptr, kn_ptr, gcum_ptr, w_ptr, u_ptr, t_ptr, cu_ptr,
                         chunks_ptr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                         KP: tl.constexpr, VP: tl.constexpr, BT: tl.constexpr, NORM: tl.constexpr):
    """One program per (chunk, value head), working on 16-row blocks: A's ten lower blocks as 16x16 dots, the four
    diagonal inverses by forward substitution on one [4, 16, 16] stack, the off-diagonal blocks by block
    substitution; T (bf16) goes through a scratch buffer so that W = T (beta exp(G) K) and U = T (beta V) are
    whole-chunk dots."""
    i_c, i_hv = tl.program_id(0), tl.program_id(1)
    i_n = tl.load(chunks_ptr + 2 * i_c)
    i_t = tl.load(chunks_ptr + 2 * i_c + 1)
    bos = tl.load(cu_ptr + i_n).to(tl.int64)
    eos = tl.load(cu_ptr + i_n + 1).to(tl.int64)
    i_h = i_hv // (HV // H)
    first = i_hv % (HV // H)
    rows = bos + i_t * BT + tl.arange(0, BT)
    mrow = rows < eos
    g_cum = tl.cumsum(tl.load(g_ptr + rows * HV + i_hv, mask=mrow, other=0.0).to(tl.float32), 0)
    tl.store(gcum_ptr + rows * HV + i_hv, g_cum, mask=mrow)
    if NORM:
        _keys(q_ptr + i_h * K, qn_ptr + i_h * K, rows, mrow, first, H * K, K, KP, NORM, True)
    kh, knh = k_ptr + i_h * K, kn_ptr + i_h * K
    tl.debug_barrier()  # the 16-row blocks below read back this program's g_cum

    r0, m0 = _sub_rows(bos, i_t, eos, 0, BT)
    r1, m1 = _sub_rows(bos, i_t, eos, 1, BT)
    r2, m2 = _sub_rows(bos, i_t, eos, 2, BT)
    r3, m3 = _sub_rows(bos, i_t, eos, 3, BT)
    g0 = tl.load(gcum_ptr + r0 * HV + i_hv, mask=m0, other=0.0, cache_modifier=".cg")
    g1 = tl.load(gcum_ptr + r1 * HV + i_hv, mask=m1, other=0.0, cache_modifier=".cg")
    g2 = tl.load(gcum_ptr + r2 * HV + i_hv, mask=m2, other=0.0, cache_modifier=".cg")
    g3 = tl.load(gcum_ptr + r3 * HV + i_hv, mask=m3, other=0.0, cache_modifier=".cg")
    # Row block by row block, so that each key tile dies as soon as its blocks of A are formed.
    k0 = _keys(kh, knh, r0, m0, first, H * K, K, KP, NORM, False)
    kb = _beta_rows(k0, beta_ptr + i_hv, r0, m0, HV)
    a00 = _kkt(kb, k0, g0, g0, m0, m0, True)
    k1 = _keys(kh, knh, r1, m1, first, H * K, K, KP, NORM, False)
    kb = _beta_rows(k1, beta_ptr + i_hv, r1, m1, HV)
    a10, a11 = _kkt(kb, k0, g1, g0, m1, m0, False), _kkt(kb, k1, g1, g1, m1, m1, True)
    k2 = _keys(kh, knh, r2, m2, first, H * K, K, KP, NORM, False)
    kb = _beta_rows(k2, beta_ptr + i_hv, r2, m2, HV)
    a20, a21, a22 = _kkt(kb, k0, g2, g0, m2, m0, False), _kkt(kb, k1, g2, g1, m2, m1, False), _kkt(
        kb, k2, g2, g2, m2, m2, True)
    k3 = _keys(kh, knh, r3, m3, first, H * K, K, KP, NORM, False)
    kb = _beta_rows(k3, beta_ptr + i_hv, r3, m3, HV)
    a30, a31, a32, a33 = _kkt(kb, k0, g3, g0, m3, m0, False), _kkt(kb, k1, g3, g1, m3, m1, False), _kkt(
        kb, k2, g3, g2, m3, m2, False), _kkt(kb, k3, g3, g3, m3, m3, True)

    t00, t11, t22, t33 = _unstack4(_forward_substitution(_stack4(a00, a11, a22, a33)))
    t10 = -_mm(t11, _mm(a10, t00))
    t21 = -_mm(t22, _mm(a21, t11))
    t32 = -_mm(t33, _mm(a32, t22))
    t20 = -_mm(t22, _mm(a20, t00) + _mm(a21, t10))
    t31 = -_mm(t33, _mm(a31, t11) + _mm(a32, t21))
    t30 = -_mm(t33, _mm(a30, t00) + _mm(a31, t10) + _mm(a32, t20))
    th, st = t_ptr + i_hv * BT, HV * BT
    _store_block(th, r0, m0, st, 0, t00)
    _store_block(th, r1, m1, st, 0, t10)
    _store_block(th, r1, m1, st, 1, t11)
    _store_block(th, r2, m2, st, 0, t20)
    _store_block(th, r2, m2, st, 1, t21)
    _store_block(th, r2, m2, st, 2, t22)
    _store_block(th, r3, m3, st, 0, t30)
    _store_block(th, r3, m3, st, 1, t31)
    _store_block(th, r3, m3, st, 2, t32)
    _store_block(th, r3, m3, st, 3, t33)
    tl.debug_barrier()  # T is read back whole by every thread

    c = tl.arange(0, BT)
    lower = mrow[:, None] & ((c[None, :] // 16) <= ((rows[:, None] - bos - i_t * BT) // 16))
    tb = tl.load(th + rows[:, None] * st + c[None, :], mask=lower, other=0.0, cache_modifier=".cg")
    beta = tl.load(beta_ptr + rows * HV + i_hv, mask=mrow, other=0.0).to(tl.float32)
    kt = _keys(kh, knh, rows, mrow, first, H * K, K, KP, NORM, True)
    kb = (kt.to(tl.float32) * (beta * tl.exp(g_cum))[:, None]).to(tl.bfloat16)
    store_rows(w_ptr + i_hv * K, rows, mrow, HV * K, 0, tl.dot(tb, kb), KP, K)
    vt = load_rows(v_ptr + i_hv * V, rows, mrow, HV * V, 0, VP, V)
    vb = (vt.to(tl.float32) * beta[:, None]).to(tl.bfloat16)
    store_rows(u_ptr + i_hv * V, rows, mrow, HV * V, 0, tl.dot(tb, vb), VP, V)


_PLANS: dict = {}


@dataclass
class ChunkPlan:
    """Where every sequence and chunk of a (flattened) batch lies: sequences as cu_seqlens, chunks as (seq, idx)."""

    cu_seqlens: torch.Tensor  # int32 [N+1]
    chunks: torch.Tensor  # int32 [NC, 2]
    chunk_offsets: torch.Tensor  # int32 [N+1]: first global chunk of each sequence
    n_chunks: int

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
        pairs, offsets = [], [0]
        for n, (bos, eos) in enumerate(bounds):
            nt = -(-(eos - bos) // BT)
            pairs += [(n, i) for i in range(nt)]
            offsets.append(offsets[-1] + nt)
        cu = [b for b, _ in bounds] + [bounds[-1][1]] if bounds else [0]
        chunks = torch.tensor(pairs or [(0, 0)], dtype=torch.int32, device=device).reshape(-1, 2)
        return cls(torch.tensor(cu, dtype=torch.int32, device=device), chunks,
                   torch.tensor(offsets, dtype=torch.int32, device=device), len(pairs))


@dataclass
class Prologue:
    """What the prologue hands to the state/output stage. q, k are l2-normalised when asked."""

    q: torch.Tensor
    k: torch.Tensor
    g_cum: torch.Tensor  # fp32 [tokens, HV]
    w: torch.Tensor  # bf16 [tokens, HV, K]
    u: torch.Tensor  # bf16 [tokens, HV, V]


def alloc(shape, dtype, device, poison: bool) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=device) if poison else torch.empty(
        shape, dtype=dtype, device=device)


def l2norm(x: torch.Tensor, poison: bool = False) -> torch.Tensor:
    """Row-wise l2 normalisation of the last dim, in fp32, rounded to x's dtype."""
    d = x.shape[-1]
    y = alloc(x.shape, x.dtype, x.device, poison)
    n = x.numel() // d
    br = 16
    launch(l2norm_kernel, (triton.cdiv(n, br),), x, y, n, D=d, BD=triton.next_power_of_2(d), BR=br,
           device=x.device)
    return y


def run_prologue(q, k, v, g, beta, plan: ChunkPlan, use_qk_l2norm: bool, poison: bool = False,
                 fuse_norm: bool = False, num_warps: int = 4, solve: str = SOLVE) -> Prologue:
    """Launch the shared prologue on flattened `[tokens, heads, D]` tensors. The q/k l2-norm runs as two launches
    of l2norm_kernel (as the two-kernel pipeline does) or, with `fuse_norm`, inside the prologue kernel."""
    tokens, H, K = k.shape
    HV, V = v.shape[1], v.shape[2]
    dev = k.device
    norm_inside = use_qk_l2norm and fuse_norm
    if use_qk_l2norm and not fuse_norm:
        q, k = l2norm(q, poison), l2norm(k, poison)
    qn = alloc(q.shape, q.dtype, dev, poison) if norm_inside else q
    kn = alloc(k.shape, k.dtype, dev, poison) if norm_inside else k
    g_cum = alloc((tokens, HV), torch.float32, dev, poison)
    w = alloc((tokens, HV, K), torch.bfloat16, dev, poison)
    u = alloc((tokens, HV, V), torch.bfloat16, dev, poison)
    if plan.n_chunks and solve == "rows":
        t = alloc((tokens, HV, BT), torch.bfloat16, dev, poison)
        launch(prologue_rows_kernel, (plan.n_chunks, HV), q, k, v, g, beta, qn, kn, g_cum, w, u, t, plan.cu_seqlens,
               plan.chunks, H=H, HV=HV, K=K, V=V, KP=triton.next_power_of_2(K), VP=triton.next_power_of_2(V),
               BT=BT, NORM=norm_inside, num_warps=num_warps, device=dev)
    elif plan.n_chunks:
        launch(prologue_kernel, (plan.n_chunks, HV), q, k, v, g, beta, qn, kn, g_cum, w, u, plan.cu_seqlens,
               plan.chunks, H=H, HV=HV, K=K, V=V, KP=triton.next_power_of_2(K), VP=triton.next_power_of_2(V),
               BT=BT, NORM=norm_inside, SOLVE=solve, num_warps=num_warps, device=dev)
    return Prologue(qn, kn, g_cum, w, u)
