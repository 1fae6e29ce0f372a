"""The shared prologue (gdnlab/kernels/prologue.py) on CPU: its blocked solve against a float64 solve of the same
chunk, every way of finishing the solve, and the l2-norm moved inside the prologue (fuse_norm) bit-equal to the
two launches of its own."""
from __future__ import annotations

import pytest
import torch

import gdnlab
from gdnlab.cases import CASES_BY_NAME
from gdnlab.inputs import make_inputs
from gdnlab.kernels import BT, ChunkPlan, run_prologue
from gdnlab.metrics import ulp_bf16


def _flat(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    return x.reshape(-1, *x.shape[2:]).to(dtype or x.dtype).contiguous()


def _wy_float64(k, v, g, beta, bounds, H: int, HV: int):
    """T = (I + A)^-1 per chunk in float64 and the WY factors W, U, from the prologue's own bf16 k and its bf16
    operands (beta K, beta exp(G) K, beta V are rounded to bf16 where docs/design.md §4 says the kernels round
    them)."""
    rnd = lambda x: x.to(torch.bfloat16).double()  # noqa: E731
    k, v, g, beta = k.double(), v.double(), g.double(), beta.double()
    tokens, K = k.shape[0], k.shape[2]
    W = torch.zeros(tokens, HV, K, dtype=torch.float64)
    U = torch.zeros(tokens, HV, v.shape[2], dtype=torch.float64)
    bound_w, bound_u = torch.zeros_like(W), torch.zeros_like(U)
    for bos, eos in bounds:
        for c0 in range(bos, eos, BT):
            sl = slice(c0, min(c0 + BT, eos))
            for hv in range(HV):
                kk, vv, bb = k[sl, hv // (HV // H)], v[sl, hv], beta[sl, hv]
                gc = torch.cumsum(g[sl, hv], 0)
                A = torch.tril(rnd(bb[:, None] * kk) @ kk.T * torch.exp(gc[:, None] - gc[None, :]), -1)
                T = torch.linalg.inv(torch.eye(len(bb), dtype=torch.float64) + A)
                kb, vb = rnd(kk * (bb * torch.exp(gc))[:, None]), rnd(vv * bb[:, None])
                W[sl, hv], U[sl, hv] = T @ kb, T @ vb
                bound_w[sl, hv], bound_u[sl, hv] = T.abs() @ kb.abs(), T.abs() @ vb.abs()
    return W, U, bound_w, bound_u


@pytest.mark.parametrize("regime", ["cutedsl", "correlated", "decay"])
def test_blocked_solve_matches_float64(regime):
    """W and U from the 16x16 blocked fp32 solve are within the bf16 rounding of T and of the result of a float64
    inverse of the same A: |W - W64| <= 2 u (|T| |KB| + |W64|) + tiny elementwise, u = 2^-8; every element written."""
    inp = make_inputs(B=1, T=150, H=2, HV=4, K=64, V=32, regime=regime, seed=41)
    q, k, v = _flat(inp.q), _flat(inp.k), _flat(inp.v)
    g, beta = _flat(inp.g, torch.float32), _flat(inp.beta)
    bounds = [(0, 150)]
    pro = run_prologue(q, k, v, g, beta, ChunkPlan.build(bounds, q.device), True, poison=True)
    for x in (pro.q, pro.k, pro.g_cum, pro.w, pro.u):
        assert not x.isnan().any(), "every element of the prologue's outputs must be written"
    W, U, bw, bu = _wy_float64(pro.k, v, g, beta, bounds, 2, 4)
    for got, want, bound in ((pro.w, W, bw), (pro.u, U, bu)):
        floor = torch.finfo(torch.bfloat16).smallest_normal  # bf16 subnormals (a fast gate's exp(G)) round coarser
        excess = (got.double() - want).abs() - 2 * ulp_bf16 * (bound + want.abs()) - floor
        assert excess.max() <= 0, f"worst excess over the bf16 bound: {excess.max():.3g}"


@pytest.mark.parametrize("name", ["t129", pytest.param("b3_t65_bf16", marks=pytest.mark.slow),
                                  pytest.param("var_pad", marks=pytest.mark.slow)])
def test_norm_inside_the_prologue_is_bit_equal(name):
    """Moving the q/k l2-norm into the prologue changes launches, not numbers (value heads sharing a key head: 2)."""
    kw = CASES_BY_NAME[name].inputs().kwargs()
    assert kw["use_qk_l2norm_in_kernel"]
    o2, h2 = gdnlab.chunk_gated_delta_rule(**kw, backend="two_kernel", poison=True)
    of, hf = gdnlab.chunk_gated_delta_rule(**kw, backend="two_kernel", fuse_norm=True, poison=True)
    assert not of.isnan().any() and not hf.isnan().any()
    assert torch.equal(of, o2) and torch.equal(hf, h2)


def test_norm_inside_without_l2norm():
    """Without the in-kernel l2-norm, fuse_norm reads q and k as given, like the two-kernel path."""
    kw = make_inputs(B=1, T=70, H=1, HV=2, K=32, V=32, regime="fla", seed=8).kwargs()
    assert not kw["use_qk_l2norm_in_kernel"]
    o2, h2 = gdnlab.chunk_gated_delta_rule(**kw, backend="two_kernel")
    of, hf = gdnlab.chunk_gated_delta_rule(**kw, backend="fused_fixed", fuse_norm=True, poison=True)
    o3, h3 = gdnlab.chunk_gated_delta_rule(**kw, backend="fused_fixed")
    assert torch.equal(of, o3) and torch.equal(hf, h3) and torch.equal(hf, h2)


@pytest.mark.parametrize("solve,opts", [("tf32x3", {}), ("ieee", {}), ("doubling", {}), ("by_blocks", {}),
                                        ("by_blocks", dict(fold_norm=True, split_wu=True)),
                                        ("by_blocks", dict(fuse_norm=True))])
def test_other_solves_stay_within_bf16_of_the_blocks(solve, opts):
    """The other ways of forming T give W, U within one bf16 step of the default block substitution: the 64x64-dot
    ways of finishing the solve (kept for the speed study; under the interpreter tf32x3 runs as fp32), and by_blocks
    (A, T, W, U formed block by block) with each norm handling; g_cum, and with the fold the gates, equal."""
    inp = make_inputs(B=1, T=100, H=1, HV=2, K=64, V=32, regime="correlated", seed=12)
    args = [_flat(inp.q), _flat(inp.k), _flat(inp.v), _flat(inp.g, torch.float32), _flat(inp.beta)]
    plan = ChunkPlan.build([(0, 100)], args[0].device)
    a = run_prologue(*args, plan, True, **opts)
    b = run_prologue(*args, plan, True, poison=True, solve=solve, **opts)
    for x, y in ((a.g_cum, b.g_cum), (a.g_q, b.g_q), (a.g_k, b.g_k), (a.q, b.q), (a.k, b.k)):
        assert x is None or torch.equal(x, y)
    for x, y in ((a.w, b.w), (a.u, b.u)):
        assert not y.isnan().any()
        assert ((x.float() - y.float()).abs() <= 2 * ulp_bf16 * x.float().abs().clamp_min(1e-3)).all()


@pytest.mark.parametrize("opts", [{}, dict(fold_norm=True)])
def test_moves_solve_is_bit_equal_to_the_blocks(opts):
    """"moves" takes A's blocks out and puts T together by register moves instead of masked sums: the same
    numbers, bit for bit, on a ragged chunk (T = 100) with rows past the sequence."""
    inp = make_inputs(B=1, T=100, H=1, HV=2, K=64, V=32, regime="correlated", seed=13)
    args = [_flat(inp.q), _flat(inp.k), _flat(inp.v), _flat(inp.g, torch.float32), _flat(inp.beta)]
    plan = ChunkPlan.build([(0, 100)], args[0].device)
    a = run_prologue(*args, plan, True, **opts)
    b = run_prologue(*args, plan, True, poison=True, solve="moves", **opts)
    assert not b.w.isnan().any() and not b.u.isnan().any()
    assert torch.equal(a.w, b.w) and torch.equal(a.u, b.u)



def test_chunk_plan_segments_cut_runs_at_sequence_ends():
    plan = ChunkPlan.build([(0, 300), (300, 310), (310, 450)], torch.device("cpu"))  # 5, 1 and 3 chunks
    assert plan.segments(2).tolist() == [[0, 0, 2], [0, 2, 4], [0, 4, 5], [1, 0, 1], [2, 0, 2], [2, 2, 3]]
    assert plan.segments(2) is plan.segments(2) and plan.runs(4) is plan.segments(3)
    assert plan.runs(0) is None and plan.runs(9) is None
    with pytest.raises(ValueError, match="programs"):
        run_prologue(*[torch.zeros(1)] * 5, plan, True, programs=-1)


def test_register_caps_out_of_range_are_refused():
    inp = make_inputs(B=1, T=64, H=1, HV=2, K=64, V=64, seed=2)
    args = [_flat(inp.q), _flat(inp.k), _flat(inp.v), _flat(inp.g, torch.float32), _flat(inp.beta)]
    plan = ChunkPlan.build([(0, 64)], args[0].device)
    for bad in (-1, 16, 256):
        with pytest.raises(ValueError, match="maxnreg: must be"):
            run_prologue(*args, plan, True, maxnreg=bad)
