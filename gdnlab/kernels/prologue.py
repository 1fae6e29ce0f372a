"""The prologue every chunked path shares: optional q/k l2-norm, then per chunk the cumulative gate, the gated
beta.K.K^T, its unit-lower-triangular inverse T = (I + A)^-1, and the WY factors W = T(beta exp(G) K), U = T(beta V).

Rounding (DESIGN.md section 3): G and A are fp32; T is solved in fp32 and rounded to bf16; W and U are stored bf16.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from gdnlab.interp import launch
from gdnlab.kernels.tiles import load_rows, store_rows

BT = 64


@triton.jit
def l2norm_kernel(x_ptr, y_ptr, n_rows, D: tl.constexpr, BD: tl.constexpr, BR: tl.constexpr):
    """y = x / sqrt(sum(x^2) + 1e-6) per row, computed in fp32, stored in y's dtype."""
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    mrow = rows < n_rows
    x = load_rows(x_ptr, rows, mrow, D, 0, BD, D).to(tl.float32)
    y = x / tl.sqrt(tl.sum(x * x, 1) + 1e-6)[:, None]
    store_rows(y_ptr, rows, mrow, D, 0, y, BD, D)


@triton.jit
def prologue_kernel(k_ptr, v_ptr, g_ptr, beta_ptr, gcum_ptr, w_ptr, u_ptr, cu_ptr, chunks_ptr,
                    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr):
    """One program per (chunk, value head): cumsum, A, solve_tril and W/U for that chunk."""
    i_c, i_hv = tl.program_id(0), tl.program_id(1)
    i_n = tl.load(chunks_ptr + 2 * i_c)
    i_t = tl.load(chunks_ptr + 2 * i_c + 1)
    bos = tl.load(cu_ptr + i_n).to(tl.int64)
    eos = tl.load(cu_ptr + i_n + 1).to(tl.int64)
    i_h = i_hv // (HV // H)
    r = tl.arange(0, BT)
    rows = bos + i_t * BT + r
    mrow = rows < eos

    g = tl.load(g_ptr + rows * HV + i_hv, mask=mrow, other=0.0).to(tl.float32)
    g_cum = tl.cumsum(g, 0)
    tl.store(gcum_ptr + rows * HV + i_hv, g_cum, mask=mrow)
    beta = tl.load(beta_ptr + rows * HV + i_hv, mask=mrow, other=0.0).to(tl.float32)

    kh = k_ptr + i_h * K
    a = tl.zeros([BT, BT], dtype=tl.float32)
    for k0 in range(0, K, 64):
        kt = load_rows(kh, rows, mrow, H * K, k0, 64, K)
        a += tl.dot((kt.to(tl.float32) * beta[:, None]).to(kt.dtype), tl.trans(kt))
    strict = (r[:, None] > r[None, :]) & mrow[:, None] & mrow[None, :]
    a = tl.where(strict, a * tl.exp(tl.where(strict, g_cum[:, None] - g_cum[None, :], 0.0)), 0.0)

    # T = (I + A)^-1 with D = I + (the 16x16 diagonal blocks of A) and N = D^-1 (the rest), which is nilpotent
    # (N^4 = 0): T = (I - N)(I + N^2) D^-1. D^-1 by forward substitution, the same row of all four blocks per step.
    eye = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    same_blk = (r[:, None] // 16) == (r[None, :] // 16)
    a_diag = tl.where(same_blk, a, 0.0)
    t = eye
    for i in range(1, 16):
        t = tl.where((r % 16 == i)[:, None], eye - tl.dot(a_diag, t, input_precision="ieee"), t)
    n = tl.dot(t, a - a_diag, input_precision="ieee")
    x = eye - n
    x = x + tl.dot(x, tl.dot(n, n, input_precision="ieee"), input_precision="ieee")
    t = tl.dot(x, t, input_precision="ieee")
    t = t.to(tl.bfloat16)

    eg = tl.exp(g_cum)
    for k0 in range(0, K, 64):
        kt = load_rows(kh, rows, mrow, H * K, k0, 64, K)
        kb = (kt.to(tl.float32) * (beta * eg)[:, None]).to(tl.bfloat16)
        store_rows(w_ptr + i_hv * K, rows, mrow, HV * K, k0, tl.dot(t, kb), 64, K)
    for v0 in range(0, V, 64):
        vt = load_rows(v_ptr + i_hv * V, rows, mrow, HV * V, v0, 64, V)
        vb = (vt.to(tl.float32) * beta[:, None]).to(tl.bfloat16)
        store_rows(u_ptr + i_hv * V, rows, mrow, HV * V, v0, tl.dot(t, vb), 64, V)


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


def run_prologue(q, k, v, g, beta, plan: ChunkPlan, use_qk_l2norm: bool, poison: bool = False) -> Prologue:
    """Launch the shared prologue on flattened `[tokens, heads, D]` tensors."""
    tokens, H, K = k.shape
    HV, V = v.shape[1], v.shape[2]
    if use_qk_l2norm:
        q, k = l2norm(q, poison), l2norm(k, poison)
    dev = k.device
    g_cum = alloc((tokens, HV), torch.float32, dev, poison)
    w = alloc((tokens, HV, K), torch.bfloat16, dev, poison)
    u = alloc((tokens, HV, V), torch.bfloat16, dev, poison)
    if plan.n_chunks:
        launch(prologue_kernel, (plan.n_chunks, HV), k, v, g, beta, g_cum, w, u, plan.cu_seqlens, plan.chunks,
               H=H, HV=HV, K=K, V=V, BT=BT, num_warps=4, device=dev)
    return Prologue(q, k, g_cum, w, u)
