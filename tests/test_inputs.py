"""make_inputs: seeded determinism, regime statistics, varlen structure; and the conformance cases as data."""
from __future__ import annotations

import pytest
import torch

from gdnlab.cases import CASES, CASES_BY_NAME, ISOLATION, Case, total_chunks
from gdnlab.inputs import REGIMES, GDNInputs, make_inputs
from gdnlab.reference import l2norm, recurrent_gated_delta_rule_ref
from gdnlab.validate import check_inputs

TENSORS = ("q", "k", "v", "g", "beta", "initial_state")


def _tensors(inp: GDNInputs) -> dict[str, torch.Tensor]:
    return {n: getattr(inp, n) for n in TENSORS if getattr(inp, n) is not None}


@pytest.mark.parametrize("regime", list(REGIMES))
def test_same_seed_same_bits_different_seed_differs(regime: str) -> None:
    a = make_inputs(T=70, regime=regime, seed=5)
    b = make_inputs(T=70, regime=regime, seed=5)
    c = make_inputs(T=70, regime=regime, seed=6)
    for n, x in _tensors(a).items():
        assert torch.equal(x, getattr(b, n)), n
        assert not torch.equal(x, getattr(c, n)), n


@pytest.mark.parametrize("regime", list(REGIMES))
def test_shapes_dtypes_and_validity(regime: str) -> None:
    inp = make_inputs(B=2, T=33, H=2, HV=6, K=64, V=32, regime=regime, seed=1, state_dtype=torch.bfloat16)
    assert inp.q.shape == inp.k.shape == (2, 33, 2, 64)
    assert inp.v.shape == (2, 33, 6, 32) and inp.g.shape == inp.beta.shape == (2, 33, 6)
    assert inp.initial_state.shape == (2, 6, 64, 32) and inp.initial_state.dtype == torch.bfloat16
    assert inp.q.dtype == inp.k.dtype == inp.v.dtype == inp.beta.dtype == torch.bfloat16
    assert inp.g.dtype == torch.float32
    assert inp.cu_seqlens is None and inp.n_seqs == 2 and inp.seqlens == [33, 33]
    assert inp.regime == regime and inp.seed == 1 and inp.scale is None
    p = check_inputs(**inp.kwargs())
    assert (p.N, p.HV, p.K, p.V) == (2, 6, 64, 32)
    for n, x in _tensors(inp).items():   # never degenerate
        assert torch.isfinite(x.float()).all(), n
        assert x.float().abs().min() > 0 or n in ("q", "k", "v"), n   # gates, betas, states strictly non-zero
        assert x.float().std() > 0, n
        assert not torch.all(x == 1), n
    assert (inp.g < 0).all() and (inp.beta > 0).all() and (inp.beta < 1).all()


def test_kwargs_runs_the_reference_and_to_device() -> None:
    inp = make_inputs(seqlens=[3, 40], pad=2, H=1, HV=2, K=16, V=16, seed=2)
    kw = inp.kwargs()
    assert set(kw) == {"q", "k", "v", "g", "beta", "initial_state", "cu_seqlens", "scale",
                       "use_qk_l2norm_in_kernel", "output_final_state"}
    assert kw["output_final_state"] is True
    o, ht = recurrent_gated_delta_rule_ref(**kw)
    assert o.shape == (1, 45, 2, 16) and ht.shape == (2, 2, 16, 16)
    moved = inp.to("cpu")
    assert moved is not inp and all(torch.equal(x, getattr(moved, n)) for n, x in _tensors(inp).items())
    assert torch.equal(moved.cu_seqlens, inp.cu_seqlens)


def test_varlen_structure() -> None:
    inp = make_inputs(seqlens=[5, 1, 0, 64], pad=3, seed=4)
    assert inp.cu_seqlens.dtype == torch.int32 and inp.cu_seqlens.tolist() == [0, 5, 6, 6, 70]
    assert inp.q.shape[:2] == (1, 73) and inp.v.shape[:2] == (1, 73)
    assert inp.n_seqs == 4 and inp.seqlens == [5, 1, 0, 64]
    assert inp.initial_state.shape[0] == 4
    # padding rows are random like the rest, never zeros
    assert inp.q[0, 70:].float().abs().sum() > 0 and inp.v[0, 70:].float().abs().sum() > 0
    assert (inp.g[0, 70:] < 0).all()
    with pytest.raises(ValueError, match="^B: a ragged batch"):
        make_inputs(B=2, seqlens=[3, 4])
    with pytest.raises(ValueError, match="^pad: trailing padding rows need a ragged batch"):
        make_inputs(T=10, pad=2)


@pytest.mark.parametrize("kw,match", [
    (dict(regime="nope"), "^regime: must be one of"),
    (dict(T=0), "^T: must be an int >= 1"),
    (dict(HV=6, H=4), "^HV: must be a multiple of H=4"),
    (dict(seqlens=[3, -1]), r"^seqlens\[\]: must be an int >= 0"),
    (dict(seqlens=[]), "^seqlens: must hold at least one"),
    (dict(decay=0.0), "^decay: must be a positive finite float"),
    (dict(decay=float("inf")), "^decay: must be a positive finite float"),
    (dict(dtype=torch.int32), "^dtype: must be a floating"),
    (dict(use_qk_l2norm=1), "^use_qk_l2norm: must be a bool or None"),
])
def test_bad_arguments(kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_inputs(**kw)


def test_cutedsl_regime_statistics() -> None:
    inp = make_inputs(B=4, T=256, seed=7, dtype=torch.float32)
    assert inp.use_qk_l2norm_in_kernel is True
    for x in (inp.q, inp.k, inp.v):
        assert abs(x.mean().item()) < 0.02 and abs(x.std().item() - 1) < 0.02
    assert abs(inp.beta.mean().item() - 0.5) < 0.02        # sigmoid(N(0,1)) is symmetric about 1/2
    assert abs(inp.initial_state.std().item() - 0.05) < 0.002
    neg = -inp.g
    assert (neg > 0).all()
    assert 2 < neg.mean().item() < 14                       # a fast gate (mean ~7 across seeds)


def test_fla_regime_statistics() -> None:
    inp = make_inputs(B=4, T=256, regime="fla", seed=8, dtype=torch.float32)
    assert inp.use_qk_l2norm_in_kernel is False
    norms = inp.k.norm(dim=-1)
    assert torch.allclose(norms, torch.ones_like(norms), atol=1e-5)   # keys normalised beforehand
    assert abs(inp.q.std().item() - 1) < 0.02
    # g = logsigmoid(N(0,1)): E[-g] = E[softplus(-z)] ~ 0.806
    assert abs((-inp.g).mean().item() - 0.806) < 0.02
    assert (inp.g < 0).all()


def test_correlated_regime_keys_nearly_parallel() -> None:
    inp = make_inputs(T=128, regime="correlated", seed=9, dtype=torch.float32)
    kn = l2norm(inp.k.double())
    cos = (kn[0, :, None] * kn[0, None, :]).sum(-1)          # [T, T, H]
    assert cos.min().item() > 0.95 and cos.mean().item() > 0.98
    plain = l2norm(make_inputs(T=128, regime="cutedsl", seed=9, dtype=torch.float32).k.double())
    assert (plain[0, :-1] * plain[0, 1:]).sum(-1).abs().mean().item() < 0.2
    assert abs((-inp.g).mean().item() - 0.01) < 0.001        # slow gate keeps A large


@pytest.mark.parametrize("decay", [1e-3, 0.05, 1.0])
def test_decay_regime_mean(decay: float) -> None:
    inp = make_inputs(B=2, T=512, regime="decay", decay=decay, seed=10)
    neg = -inp.g
    assert abs(neg.mean().item() / decay - 1) < 0.02
    assert (neg > 0).all() and (neg < 2 * decay).all()


def test_decay_overrides_only_the_gate() -> None:
    base = make_inputs(T=100, regime="cutedsl", seed=11)
    slow = make_inputs(T=100, regime="cutedsl", seed=11, decay=0.01)
    for n in ("q", "k", "v", "beta", "initial_state"):
        assert torch.equal(getattr(base, n), getattr(slow, n)), n
    assert abs((-slow.g).mean().item() - 0.01) < 0.001 and (-base.g).mean().item() > 1
    default = make_inputs(T=100, regime="decay", seed=11)
    assert abs((-default.g).mean().item() - 0.1) < 0.01


def test_options() -> None:
    assert make_inputs(T=5, initial_state=False).initial_state is None
    assert make_inputs(T=5, regime="fla", use_qk_l2norm=True).use_qk_l2norm_in_kernel is True
    assert make_inputs(T=5, use_qk_l2norm=False).use_qk_l2norm_in_kernel is False
    a = make_inputs(T=5, h0_scale=0.05, seed=3).initial_state
    b = make_inputs(T=5, h0_scale=0.5, seed=3).initial_state
    assert torch.allclose(b, a * 10, rtol=1e-6)
    x = make_inputs(T=5, dtype=torch.float16)
    assert x.q.dtype == torch.float16 and x.g.dtype == torch.float32


# ------------------------------------------------------------------------------------------------ conformance cases
def test_cases_matrix() -> None:
    assert len(CASES) == 23 and len(ISOLATION) == 3
    names = [c.name for c in CASES + ISOLATION]
    assert len(set(names)) == len(names) and set(CASES_BY_NAME) == set(names)
    assert all(n.replace("_", "").isalnum() for n in names)
    assert total_chunks() < 120
    assert max(c.n_tokens for c in CASES) <= 600
    assert sum(c.n_tokens <= 200 for c in CASES) >= 15
    dense_T = {c.T for c in CASES if c.seqlens is None and c.B == 1}
    assert {1, 63, 64, 65, 128, 129, 192} <= dense_T and max(dense_T) > 256
    assert any(c.B > 1 and c.T % 64 for c in CASES)
    varlen = [c for c in CASES if c.seqlens is not None]
    assert any(1 in c.seqlens for c in varlen)
    assert any(len(c.seqlens) >= 8 for c in varlen)
    assert any(c.pad > 0 for c in varlen)
    assert {c.state_dtype for c in CASES} == {torch.float32, torch.bfloat16}
    assert {c.initial_state for c in CASES} == {True, False}


def test_isolation_cases() -> None:
    a, b, c = ISOLATION
    assert (a.T, a.initial_state) == (64, False)
    assert (b.T, b.initial_state) == (64, True)
    assert (c.T, c.initial_state) == (128, False)
    assert [x.n_chunks for x in ISOLATION] == [1, 1, 2]


@pytest.mark.parametrize("case", CASES + ISOLATION, ids=lambda c: c.name)
def test_case_inputs(case: Case) -> None:
    inp = case.inputs()
    p = check_inputs(**inp.kwargs())
    assert (p.H, p.HV, p.K, p.V) == (4, 8, 128, 128) and p.dtype == torch.bfloat16
    assert p.N == len(case.lengths) and p.seqlens == case.lengths
    assert inp.q.shape[1] * inp.q.shape[0] == case.n_tokens
    assert (inp.initial_state is not None) == case.initial_state
    if case.initial_state:
        assert inp.initial_state.dtype == case.state_dtype
    assert torch.equal(inp.q, case.inputs().q)                # seeded
