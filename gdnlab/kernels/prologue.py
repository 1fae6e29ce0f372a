"""The prologue every chunked path shares: optional q/k l2-norm, then per chunk the cumulative gate, the gated
beta.K.K^T, its unit-lower-triangular inverse T = (I + A)^-1, and the WY factors W = T(beta exp(G) K), U = T(beta V).

Rounding (docs/design.md §4): G and A are fp32; T is solved in fp32 and rounded to bf16; W and U are stored
bf16.
BT is gdnlab.kernel_params.BT.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from gdnlab.interp import launch
from gdnlab.kernel_params import BT, cdiv, pow2
from gdnlab.kernels.tiles import as_index, l2_norm_of_rows, load_rows, store_rows

#: How the prologue finishes T = (I + A)^-1 after its 16x16 diagonal blocks (see _solve).
SOLVE = "blocks"
#: Every way of finishing it that _solve knows.
SOLVES = ("blocks", "tf32x3", "ieee")


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
def _split_dot(a, b):
    """a @ b for fp32 a and bf16 b, with a as the sum of two bf16 terms (its rounding and the remainder's): about
    16 significant bits of a instead of 8, two tensor-core dots."""
    hi = a.to(tl.bfloat16)
    return tl.dot(hi, b) + tl.dot((a - hi.to(tl.float32)).to(tl.bfloat16), b)


@triton.jit
def prologue_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, qn_ptr, kn_ptr, gcum_ptr, w_ptr, u_ptr, cu_ptr, chunks_ptr,
                    gq_ptr, gk_ptr, lq_ptr, lk_ptr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                    KP: tl.constexpr, VP: tl.constexpr, BT: tl.constexpr, NORM: tl.constexpr, SOLVE: tl.constexpr,
                    I64: tl.constexpr = True, FOLD: tl.constexpr = False, SPLIT: tl.constexpr = False):
    """One program per (chunk, value head): [q/k l2-norm,] cumsum, A, T = (I + A)^-1 and W/U for that chunk.

    A, W and U are whole-chunk tensor-core dots; the solve works on 16x16 blocks (see _solve), so no 64x64 fp32
    product runs on the FMA units.

    FOLD (the l2-norm folded into the gates): q and k stay raw and no normalised row is ever rounded. Every
    product of the chunked form meets a row's norm through an exp of the cumulative gate, so the norms go there:
    from the rows' log-norms (lq_ptr / lk_ptr, fp32 [tokens, H], log_norm_kernel) the kernel stores
    gq = G - log|q| and gk = G + log|k| (fp32 [tokens, HV], gq_ptr / gk_ptr) for the later kernels, and uses
    G - log|k| for A's rows and W's operand and gk for A's columns.

    SPLIT (W and U without rounded operands): W = T diag(beta exp(G)) K and U = T diag(beta) V are formed as the
    fp32 T with the per-row factors scaled into its columns, split into two bf16 terms (_split_dot) and multiplied
    into the k and v rows as loaded, so neither T nor beta exp(G) K nor beta V is rounded to bf16.
    """
    i_c, i_hv = tl.program_id(0), tl.program_id(1)
    i_n = tl.load(chunks_ptr + 2 * i_c)
    i_t = tl.load(chunks_ptr + 2 * i_c + 1)
    bos = as_index(tl.load(cu_ptr + i_n), I64)
    eos = as_index(tl.load(cu_ptr + i_n + 1), I64)
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

    # k is loaded (and normalised) again rather than kept live across the solve: the form the H200 runs measured;
    # the Hopper build spills the same 848 B either way (docs/speed-notes.md).
    kt = _keys(k_ptr + i_h * K, kn_ptr + i_h * K, rows, mrow, first, H * K, K, KP, NORM, False)
    if SPLIT:
        w = _split_dot(t32 * (beta * tl.exp(g_row))[None, :], kt)
    else:
        w = tl.dot(t, (kt.to(tl.float32) * (beta * tl.exp(g_row))[:, None]).to(tl.bfloat16))
    store_rows(w_ptr + i_hv * K, rows, mrow, HV * K, 0, w, KP, K)
    vt = load_rows(v_ptr + i_hv * V, rows, mrow, HV * V, 0, VP, V)
    if SPLIT:
        u = _split_dot(t32 * beta[None, :], vt)
    else:
        u = tl.dot(t, (vt.to(tl.float32) * beta[:, None]).to(tl.bfloat16))
    store_rows(u_ptr + i_hv * V, rows, mrow, HV * V, 0, u, VP, V)


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
    """What the prologue hands to the state/output stage. q, k are l2-normalised when asked (or raw, with the
    norms folded into the gates g_q and g_k, when fold_norm asked for that)."""

    q: torch.Tensor
    k: torch.Tensor
    g_cum: torch.Tensor  # fp32 [tokens, HV]
    w: torch.Tensor  # bf16 [tokens, HV, K]
    u: torch.Tensor  # bf16 [tokens, HV, V]
    norm_q: bool = False  # q is still to be l2-normalised, by the output kernel
    g_q: torch.Tensor | None = None  # fold_norm: q and k are raw; G - log|q| and G + log|k| per row and value
    g_k: torch.Tensor | None = None  # head (fp32 [tokens, HV]), the gates of the output's and the state's products


def wide_index(*tensors: torch.Tensor) -> bool:
    """True when some tensor has 2^31 elements or more, so that the kernels must index in int64 (their I64)."""
    return max(t.numel() for t in tensors) >= 2 ** 31


def alloc(shape, dtype, device, poison: bool) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=device) if poison else torch.empty(
        shape, dtype=dtype, device=device)


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
                 split_wu: bool = False) -> Prologue:
    """Launch the shared prologue on flattened `[tokens, heads, D]` tensors. The q/k l2-norm runs as two launches
    of l2norm_kernel (as the two-kernel pipeline does) or, with `fuse_norm`, inside the prologue kernel; with
    `norm_q_in_output` only k's runs here and q's is left to the output kernel (Prologue.norm_q). With `fold_norm`
    (two-kernel path only) q and k stay raw and the prologue folds their rows' log-norms (one launch of
    log_norm_kernel) into the gates (its FOLD). `split_wu`: W and U from unrounded operands (its SPLIT). `index64`:
    int64 indices (None: where a buffer needs them)."""
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
    w = alloc((tokens, HV, K), torch.bfloat16, dev, poison)
    u = alloc((tokens, HV, V), torch.bfloat16, dev, poison)
    if plan.n_chunks:
        launch(prologue_kernel, (plan.n_chunks, HV), q, k, v, g, beta, qn, kn, g_cum, w, u, plan.cu_seqlens,
               plan.chunks, g_q if fold else g_cum, g_k if fold else g_cum, log_norms[0] if fold else g_cum,
               log_norms[1] if fold else g_cum, H=H, HV=HV, K=K, V=V, KP=pow2(K),
               VP=pow2(V), BT=BT, NORM=norm_inside, SOLVE=solve, num_warps=num_warps, device=dev,
               I64=wide_index(q, v, w) if index64 is None else index64, FOLD=fold,
               SPLIT=split_wu)
    return Prologue(qn, kn, g_cum, w, u, norm_q, g_q, g_k)
