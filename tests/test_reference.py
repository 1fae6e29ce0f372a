"""The float64 references: hand-derived values, an independent scalar implementation, and the structural identities
(varlen = sequences alone, GVA = repeated heads, state_v_first = transpose, chunked = per-token)."""
from __future__ import annotations

import math

import pytest
import torch

from conftest import assert_unchanged, clone_all, small_inputs
from gdnlab.metrics import errors
from gdnlab.reference import chunk_gated_delta_rule_ref, l2norm, recurrent_gated_delta_rule_ref

F64 = torch.float64
REFS = [recurrent_gated_delta_rule_ref, chunk_gated_delta_rule_ref]
REF_IDS = ["recurrent", "chunk"]


def _embed(rows: list[list[float]], D: int = 16) -> torch.Tensor:
    """[T][2] numbers -> [1, T, 1, D] float64, zero beyond the first two components.

    Zero components of k, q and v (and of S0) leave a 2x2 problem embedded exactly in a 16x16 one (the smallest
    head size check_inputs allows): those rows and columns of S stay zero.
    """
    x = torch.zeros(1, len(rows), 1, D, dtype=F64)
    x[0, :, 0, :2] = torch.tensor(rows, dtype=F64)
    return x


def _hand_problem(T: int) -> dict:
    # token 1: g = ln 0.5, beta = 0.5, k = (1, 2), v = (4.5, 7), q = (2, 1); token 2: g = 0, beta = 1,
    # k = (0, 1), v = (4.5, 2), q = (1, 1). S0 = [[1, 2], [3, 4]] (rows: K index, columns: V index). scale 0.5.
    h0 = torch.zeros(1, 1, 16, 16, dtype=F64)
    h0[0, 0, :2, :2] = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=F64)
    return dict(q=_embed([[2, 1], [1, 1]][:T]), k=_embed([[1, 2], [0, 1]][:T]), v=_embed([[4.5, 7], [4.5, 2]][:T]),
                g=torch.tensor([[[math.log(0.5)], [0.0]]], dtype=F64)[:, :T],
                beta=torch.tensor([[[0.5], [1.0]]], dtype=F64)[:, :T],
                scale=0.5, initial_state=h0, output_final_state=True)


@pytest.mark.parametrize("fn", REFS, ids=REF_IDS)
def test_hand_derived_T1_T2(fn) -> None:
    # Token 1, by hand:
    #   S  = 0.5 * [[1,2],[3,4]]                  = [[0.5, 1], [1.5, 2]]
    #   S^T k = (0.5*1 + 1.5*2, 1*1 + 2*2)        = (3.5, 5)
    #   u  = 0.5 * ((4.5, 7) - (3.5, 5))          = (0.5, 1)
    #   S += k (x) u = [[0.5, 1], [1, 2]]         -> [[1, 2], [2.5, 4]]
    #   o  = 0.5 * S^T q = 0.5 * (2*1 + 1*2.5, 2*2 + 1*4) = (2.25, 4)
    o, ht = fn(**_hand_problem(1))
    assert o.dtype == F64 and ht.dtype == F64
    assert o[0, 0, 0, :2].tolist() == pytest.approx([2.25, 4.0], rel=1e-15)
    assert ht[0, 0, :2, :2].flatten().tolist() == pytest.approx([1.0, 2.0, 2.5, 4.0], rel=1e-15)
    # Token 2: g = 0 keeps S; S^T k = (2.5, 4); u = 1 * ((4.5, 2) - (2.5, 4)) = (2, -2);
    #   S += (0, 1) (x) (2, -2)  -> [[1, 2], [4.5, 2]];  o = 0.5 * (1 + 4.5, 2 + 2) = (2.75, 2)
    o, ht = fn(**_hand_problem(2))
    assert o[0, 0, 0, :2].tolist() == pytest.approx([2.25, 4.0], rel=1e-15)
    assert o[0, 1, 0, :2].tolist() == pytest.approx([2.75, 2.0], rel=1e-15)
    assert ht[0, 0, :2, :2].flatten().tolist() == pytest.approx([1.0, 2.0, 4.5, 2.0], rel=1e-15)
    # the embedding leaves everything else zero
    assert o[..., 2:].abs().max() == 0 and ht[0, 0, 2:].abs().max() == 0 and ht[0, 0, :, 2:].abs().max() == 0


def test_hand_derived_l2norm_and_default_scale() -> None:
    # One token, S0 = 0, beta = 1: S = k v^T, o = scale * v (k.q); with l2-norm k and q become unit-ish vectors.
    q, k, v = _embed([[3, 4]]), _embed([[1, 1]]), _embed([[2, -1]])
    g = torch.full((1, 1, 1), -0.3, dtype=F64)
    beta = torch.ones(1, 1, 1, dtype=F64)
    o, _ = recurrent_gated_delta_rule_ref(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
    kq = (1 * 3 + 1 * 4) / (math.sqrt(2 + 1e-6) * math.sqrt(25 + 1e-6))
    scale = 16 ** -0.5
    assert o[0, 0, 0, :2].tolist() == pytest.approx([scale * 2 * kq, -scale * kq], rel=1e-15)
    # without l2-norm: k.q = 7
    o, _ = recurrent_gated_delta_rule_ref(q, k, v, g, beta)
    assert o[0, 0, 0, :2].tolist() == pytest.approx([scale * 14, -scale * 7], rel=1e-15)


def _scalar_reference(inp) -> tuple[list, list]:
    """An independent pure-Python implementation of docs/design.md §1 (dense, one batch row), element by element."""
    q, k, v = inp.q[0].tolist(), inp.k[0].tolist(), inp.v[0].tolist()
    g, beta = inp.g[0].tolist(), inp.beta[0].tolist()
    T, H, K = len(q), len(q[0]), len(q[0][0])
    HV, V = len(v[0]), len(v[0][0])
    scale = K ** -0.5
    if inp.use_qk_l2norm_in_kernel:
        def nrm(x: list[float]) -> list[float]:
            s = math.sqrt(sum(e * e for e in x) + 1e-6)
            return [e / s for e in x]
        q = [[nrm(x) for x in row] for row in q]
        k = [[nrm(x) for x in row] for row in k]
    h0 = inp.initial_state[0].tolist()
    out = [[[0.0] * V for _ in range(HV)] for _ in range(T)]
    states = []
    for hv in range(HV):
        h = hv // (HV // H)
        S = [row[:] for row in h0[hv]]
        for t in range(T):
            a = math.exp(g[t][hv])
            for i in range(K):
                for j in range(V):
                    S[i][j] *= a
            kt, qt = k[t][h], q[t][h]
            for j in range(V):
                pred = sum(S[i][j] * kt[i] for i in range(K))
                u = beta[t][hv] * (v[t][hv][j] - pred)
                for i in range(K):
                    S[i][j] += kt[i] * u
            for j in range(V):
                out[t][hv][j] = scale * sum(S[i][j] * qt[i] for i in range(K))
        states.append(S)
    return out, states


@pytest.mark.parametrize("l2", [True, False])
def test_matches_independent_scalar_implementation(l2: bool) -> None:
    inp = small_inputs(T=5, H=1, HV=2, K=16, V=16, use_qk_l2norm=l2, seed=3)
    want_o, want_s = _scalar_reference(inp)
    for fn in REFS:
        o, ht = fn(**inp.kwargs())
        assert errors(o[0], torch.tensor(want_o, dtype=F64))["rel_rms"] < 1e-14
        assert errors(ht[0], torch.tensor(want_s, dtype=F64))["rel_rms"] < 1e-14


@pytest.mark.parametrize("fn", REFS, ids=REF_IDS)
def test_varlen_equals_each_sequence_alone(fn) -> None:
    lens = [7, 1, 70, 0, 33]
    inp = small_inputs(seqlens=lens, pad=5, seed=11)
    o, ht = fn(**inp.kwargs())
    cu = inp.cu_seqlens.tolist()
    for n, L in enumerate(lens):
        bos, eos = cu[n], cu[n + 1]
        if L == 0:
            assert torch.equal(ht[n], inp.initial_state[n])   # an empty sequence passes its state through
            continue
        sl = slice(bos, eos)
        o1, h1 = fn(inp.q[:, sl], inp.k[:, sl], inp.v[:, sl], inp.g[:, sl], inp.beta[:, sl],
                    initial_state=inp.initial_state[n:n + 1], output_final_state=True, use_qk_l2norm_in_kernel=True)
        torch.testing.assert_close(o[:, sl], o1, rtol=1e-13, atol=1e-14)
        torch.testing.assert_close(ht[n:n + 1], h1, rtol=1e-13, atol=1e-14)
    assert o[:, cu[-1]:].abs().max() == 0   # padding rows


@pytest.mark.parametrize("fn", REFS, ids=REF_IDS)
def test_dense_batch_equals_rows_alone(fn) -> None:
    inp = small_inputs(B=3, T=40, seed=12)
    o, ht = fn(**inp.kwargs())
    for b in range(3):
        ob, hb = fn(inp.q[b:b + 1], inp.k[b:b + 1], inp.v[b:b + 1], inp.g[b:b + 1], inp.beta[b:b + 1],
                    initial_state=inp.initial_state[b:b + 1], output_final_state=True, use_qk_l2norm_in_kernel=True)
        torch.testing.assert_close(o[b:b + 1], ob, rtol=1e-13, atol=1e-14)
        torch.testing.assert_close(ht[b:b + 1], hb, rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("fn", REFS, ids=REF_IDS)
def test_gva_equals_repeated_heads(fn) -> None:
    inp = small_inputs(T=30, H=2, HV=6, seed=13)
    kw = inp.kwargs()
    o, ht = fn(**kw)
    # value head hv reads key head hv // 3: repeat each key head 3 times
    o2, ht2 = fn(**{**kw, "q": inp.q.repeat_interleave(3, dim=2), "k": inp.k.repeat_interleave(3, dim=2)})
    assert torch.equal(o, o2) and torch.equal(ht, ht2)
    # and not the other grouping (hv -> hv % H), which would differ
    o3, _ = fn(**{**kw, "q": inp.q.repeat(1, 1, 3, 1), "k": inp.k.repeat(1, 1, 3, 1)})
    assert errors(o3, o)["rel_rms"] > 1e-2


@pytest.mark.parametrize("fn", REFS, ids=REF_IDS)
def test_state_v_first_is_the_transposed_layout(fn) -> None:
    inp = small_inputs(seqlens=[9, 20], pad=2, K=32, V=48, seed=14)
    kw = inp.kwargs()
    o, ht = fn(**kw)
    o2, ht2 = fn(**{**kw, "initial_state": inp.initial_state.transpose(-1, -2).contiguous()}, state_v_first=True)
    assert ht2.shape == (2, 4, 48, 32)
    assert torch.equal(o, o2)
    assert torch.equal(ht.transpose(-1, -2), ht2)


CHUNK_CASES = {
    "dense_T150": dict(T=150),
    "dense_B3_T65_noh0": dict(B=3, T=65, initial_state=False),
    "dense_T1": dict(T=1),
    "varlen_pad_h0": dict(seqlens=[1, 64, 65, 130, 3], pad=6),
    "varlen_empty_seq": dict(seqlens=[5, 0, 70]),
    "gva_K64_V96": dict(T=100, H=1, HV=3, K=64, V=96),
    "correlated_keys": dict(T=200, regime="correlated", decay=None),
    "cutedsl_gate": dict(T=140, regime="cutedsl", decay=None),
    "fla_regime": dict(T=130, regime="fla", decay=None),
    "slow_gate": dict(T=128, decay=1e-3),
    "bf16_inputs": dict(T=96, dtype=torch.bfloat16, state_dtype=torch.float32),
}


@pytest.mark.parametrize("chunk_size", [64, 16])
@pytest.mark.parametrize("case", list(CHUNK_CASES), ids=list(CHUNK_CASES))
def test_chunked_equals_per_token(case: str, chunk_size: int) -> None:
    inp = small_inputs(seed=20, **CHUNK_CASES[case])
    o, ht = recurrent_gated_delta_rule_ref(**inp.kwargs())
    o2, ht2 = chunk_gated_delta_rule_ref(**inp.kwargs(), chunk_size=chunk_size)
    assert errors(o2, o)["rel_rms"] < 1e-12
    assert errors(o2, o)["max_abs"] < 1e-12 * o.abs().max().item()
    assert errors(ht2, ht)["rel_rms"] < 1e-12


def test_chunked_rejects_bad_chunk_size() -> None:
    with pytest.raises(ValueError, match="^chunk_size: must be a positive int"):
        chunk_gated_delta_rule_ref(**small_inputs().kwargs(), chunk_size=0)


@pytest.mark.parametrize("fn", REFS, ids=REF_IDS)
def test_padding_rows_zero_and_shapes(fn) -> None:
    inp = small_inputs(seqlens=[10, 3], pad=9, seed=15)
    assert inp.q[:, 13:].abs().min() > 0          # the padding rows hold real values...
    o, ht = fn(**inp.kwargs())
    assert o.shape == (1, 22, 4, 32) and o.dtype == F64
    assert o[:, 13:].abs().max() == 0              # ...and their outputs are zero
    assert o[:, :13].abs().min() > 0
    assert ht.shape == (2, 4, 32, 32) and ht.dtype == F64
    _, none = fn(**{**inp.kwargs(), "output_final_state": False})
    assert none is None


@pytest.mark.parametrize("fn", REFS, ids=REF_IDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_inputs_unchanged(fn, dtype: torch.dtype) -> None:
    # float64 inputs are the interesting case: .to(float64) returns the very same tensor
    for extra in (dict(), dict(state_v_first=True)):
        inp = small_inputs(seqlens=[5, 30], pad=3, dtype=dtype, state_dtype=dtype, use_qk_l2norm=True)
        kw = inp.kwargs()
        if extra:
            kw["initial_state"] = kw["initial_state"].transpose(-1, -2)   # non-contiguous on purpose
        before = clone_all(kw)
        fn(**kw, **extra)
        assert_unchanged(before, kw)


def test_l2norm_formula() -> None:
    x = torch.tensor([[3.0, 4.0], [0.0, 0.0]], dtype=F64)
    y = l2norm(x)
    assert y[0].tolist() == pytest.approx([3 / math.sqrt(25 + 1e-6), 4 / math.sqrt(25 + 1e-6)], rel=1e-15)
    assert y[1].tolist() == [0.0, 0.0]


def test_zero_initial_state_equals_none() -> None:
    inp = small_inputs(T=70, initial_state=False, seed=16)
    o, ht = recurrent_gated_delta_rule_ref(**inp.kwargs())
    zeros = torch.zeros(1, 4, 32, 32, dtype=F64)
    o2, ht2 = recurrent_gated_delta_rule_ref(**{**inp.kwargs(), "initial_state": zeros})
    assert torch.equal(o, o2) and torch.equal(ht, ht2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.gpu
def test_chunked_on_cuda_matches_cpu() -> None:
    inp = small_inputs(seqlens=[3, 100, 64], pad=4, seed=17)
    o, ht = chunk_gated_delta_rule_ref(**inp.kwargs())
    o2, ht2 = chunk_gated_delta_rule_ref(**inp.to("cuda").kwargs())
    assert o2.device.type == "cuda" and ht2.device.type == "cuda"
    assert errors(o2, o)["rel_rms"] < 1e-12 and errors(ht2, ht)["rel_rms"] < 1e-12
