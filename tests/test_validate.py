"""check_inputs: every bad input refused with the right exception and a message naming the argument."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from conftest import assert_unchanged, clone_all, small_inputs
from gdnlab.reference import chunk_gated_delta_rule_ref, recurrent_gated_delta_rule_ref
from gdnlab.validate import Problem, check_inputs


def _call_kw(inp) -> dict[str, Any]:
    kw = inp.kwargs()
    kw.pop("output_final_state")
    return kw


def _good() -> dict[str, Any]:
    """Valid dense arguments: B=2, T=20, H=2, HV=4, K=V=32, with initial state."""
    return _call_kw(small_inputs(B=2))


def _good_varlen() -> dict[str, Any]:
    return _call_kw(small_inputs(seqlens=[3, 9, 5], pad=4))


def test_problem_dense() -> None:
    kw = _good()
    p = check_inputs(**kw)
    assert isinstance(p, Problem)
    assert (p.B, p.T, p.H, p.HV, p.K, p.V, p.N) == (2, 20, 2, 4, 32, 32, 2)
    assert p.scale == pytest.approx(32 ** -0.5)
    assert p.seq_bounds == [(0, 20), (20, 40)]
    assert p.has_initial_state and not p.state_v_first and not p.varlen
    assert p.device == kw["q"].device and p.dtype == torch.float64
    assert all(type(b) is int and type(e) is int for b, e in p.seq_bounds)


def test_problem_varlen_and_options() -> None:
    kw = _good_varlen()
    kw["initial_state"] = kw["initial_state"].transpose(-1, -2).contiguous()
    p = check_inputs(**kw, state_v_first=True)
    assert (p.B, p.T, p.N) == (1, 21, 3)
    assert p.seq_bounds == [(0, 3), (3, 12), (12, 17)] and p.seqlens == [3, 9, 5]
    assert p.varlen and p.state_v_first
    p = check_inputs(**{**kw, "initial_state": None, "scale": 2})
    assert p.scale == 2.0 and isinstance(p.scale, float) and not p.has_initial_state


def test_check_leaves_inputs_unchanged() -> None:
    kw = _good_varlen()
    before = clone_all(kw)
    check_inputs(**kw)
    assert_unchanged(before, kw)


def _set(**changes: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda kw: {**kw, **changes}


def _empty_T(kw: dict[str, Any]) -> dict[str, Any]:
    return {**kw, **{name: kw[name][:, :0] for name in ("q", "k", "v", "g", "beta")}}


# (id, start from varlen?, mutate, exception, message regex)
BAD: list[tuple[str, bool, Callable[[dict[str, Any]], dict[str, Any]], type, str]] = [
    # ---- types
    ("q_not_tensor", False, lambda kw: {**kw, "q": kw["q"].tolist()}, TypeError, r"^q: must be a torch\.Tensor"),
    ("k_not_tensor", False, _set(k=None), TypeError, r"^k: must be a torch\.Tensor"),
    ("v_numpy", False, lambda kw: {**kw, "v": kw["v"].numpy()}, TypeError, r"^v: must be a torch\.Tensor"),
    ("g_float", False, _set(g=0.5), TypeError, r"^g: must be a torch\.Tensor"),
    ("beta_not_tensor", False, _set(beta="x"), TypeError, r"^beta: must be a torch\.Tensor"),
    ("h0_list", False, _set(initial_state=[1.0]), TypeError, r"^initial_state: must be a torch\.Tensor or None"),
    ("cu_list", True, _set(cu_seqlens=[0, 3, 12, 17]), TypeError, r"^cu_seqlens: must be a torch\.Tensor or None"),
    ("scale_str", False, _set(scale="0.1"), TypeError, r"^scale: must be a float"),
    ("scale_bool", False, _set(scale=True), TypeError, r"^scale: must be a float"),
    ("scale_tensor", False, _set(scale=torch.tensor(0.1)), TypeError, r"^scale: must be a float"),
    ("l2_int", False, _set(use_qk_l2norm_in_kernel=1), TypeError, r"^use_qk_l2norm_in_kernel: must be a bool"),
    ("v_first_none", False, _set(state_v_first=None), TypeError, r"^state_v_first: must be a bool"),
    ("final_str", False, _set(output_final_state="yes"), TypeError, r"^output_final_state: must be a bool"),
    # ---- dtypes
    ("q_int", False, lambda kw: {**kw, "q": kw["q"].to(torch.int32), "k": kw["k"].to(torch.int32),
                                 "v": kw["v"].to(torch.int32)}, TypeError, r"^q: must have a floating dtype"),
    ("k_mixed", False, lambda kw: {**kw, "k": kw["k"].float()}, TypeError, r"^k: must have q's dtype"),
    ("v_mixed", False, lambda kw: {**kw, "v": kw["v"].to(torch.bfloat16)}, TypeError, r"^v: must have q's dtype"),
    ("g_int", False, lambda kw: {**kw, "g": kw["g"].to(torch.int64)}, TypeError, r"^g: must have a floating"),
    ("beta_bool", False, lambda kw: {**kw, "beta": kw["beta"] > 0.5}, TypeError, r"^beta: must have a floating"),
    ("h0_int", False, lambda kw: {**kw, "initial_state": kw["initial_state"].to(torch.int32)}, TypeError,
     r"^initial_state: must have a floating"),
    # ---- ranks and shapes
    ("q_rank3", False, lambda kw: {**kw, "q": kw["q"][0]}, ValueError, r"^q: must be 4-d \[B,T,H,K\]"),
    ("k_rank5", False, lambda kw: {**kw, "k": kw["k"][None]}, ValueError, r"^k: must be 4-d"),
    ("v_rank3", False, lambda kw: {**kw, "v": kw["v"][:, :, 0]}, ValueError, r"^v: must be 4-d \[B,T,HV,V\]"),
    ("g_rank4", False, lambda kw: {**kw, "g": kw["g"][..., None]}, ValueError, r"^g: must be 3-d \[B,T,HV\]"),
    ("beta_rank2", False, lambda kw: {**kw, "beta": kw["beta"][0]}, ValueError, r"^beta: must be 3-d"),
    ("k_shape", False, lambda kw: {**kw, "k": kw["k"][:, :, :1]}, ValueError, r"^k: must have q's shape"),
    ("v_batch", False, lambda kw: {**kw, "v": kw["v"][:1]}, ValueError, r"^v: batch and time dims must match"),
    ("v_time", False, lambda kw: {**kw, "v": kw["v"][:, :7]}, ValueError, r"^v: batch and time dims must match"),
    ("hv_not_multiple", False, lambda kw: {**kw, "v": kw["v"][:, :, :3], "g": kw["g"][..., :3],
                                           "beta": kw["beta"][..., :3], "initial_state": None},
     ValueError, r"^v: value heads HV must be a positive multiple of the H=2 key heads, got HV=3"),
    ("g_shape", False, lambda kw: {**kw, "g": kw["g"][..., :2]}, ValueError, r"^g: must have shape \[B,T,HV\]"),
    ("beta_time", False, lambda kw: {**kw, "beta": kw["beta"][:, :5]}, ValueError, r"^beta: must have shape"),
    ("q_empty_T", False, _empty_T, ValueError, r"^q: B, T and H must be at least 1"),
    ("K_too_big", False, lambda kw: {**kw, "q": kw["q"].repeat(1, 1, 1, 9), "k": kw["k"].repeat(1, 1, 1, 9),
                                     "initial_state": None}, ValueError, r"^K .*no larger than 256.*got 288"),
    ("K_not_16", False, lambda kw: {**kw, "q": kw["q"][..., :24], "k": kw["k"][..., :24], "initial_state": None},
     ValueError, r"^K .*multiple of 16.*kernel limits.*got 24"),
    ("V_not_16", False, lambda kw: {**kw, "v": kw["v"][..., :8], "initial_state": None},
     ValueError, r"^V .*multiple of 16.*got 8"),
    # ---- initial state
    ("h0_rank3", False, lambda kw: {**kw, "initial_state": kw["initial_state"][0]}, ValueError,
     r"^initial_state: must be 4-d \[N,HV,K,V\]"),
    ("h0_heads", False, lambda kw: {**kw, "initial_state": kw["initial_state"][:, :2]}, ValueError,
     r"^initial_state: must have shape \[N,HV,K,V\]"),
    ("h0_count", False, lambda kw: {**kw, "initial_state": kw["initial_state"][:1]}, ValueError,
     r"^initial_state: must hold one state per sequence \(N=2\), got 1"),
    ("h0_count_varlen", True, lambda kw: {**kw, "initial_state": kw["initial_state"][:2]}, ValueError,
     r"^initial_state: must hold one state per sequence \(N=3\), got 2"),
    ("h0_v_first_layout", False, lambda kw: {**kw, "initial_state": kw["initial_state"][..., :16],
                                             "state_v_first": True}, ValueError,
     r"^initial_state: must have shape \[N,HV,V,K\] \(state_v_first\)"),
    # ---- cu_seqlens
    ("cu_float", True, lambda kw: {**kw, "cu_seqlens": kw["cu_seqlens"].float()}, ValueError,
     r"^cu_seqlens: must be an integer tensor, got torch\.float32"),
    ("cu_2d", True, lambda kw: {**kw, "cu_seqlens": kw["cu_seqlens"][None]}, ValueError, r"^cu_seqlens: must be 1-d"),
    ("cu_short", True, lambda kw: {**kw, "cu_seqlens": kw["cu_seqlens"][:1], "initial_state": None}, ValueError,
     r"^cu_seqlens: must hold at least 2 offsets"),
    ("cu_start", True, lambda kw: {**kw, "cu_seqlens": torch.tensor([3, 5, 12, 17], dtype=torch.int32)},
     ValueError, r"^cu_seqlens: must start at 0, got 3$"),
    ("cu_decreasing", True, lambda kw: {**kw, "cu_seqlens": torch.tensor([0, 5, 4, 17], dtype=torch.int32)},
     ValueError, r"^cu_seqlens: must be non-decreasing, got 5 then 4 at index 2"),
    ("cu_past_end", True, lambda kw: {**kw, "cu_seqlens": torch.tensor([0, 5, 12, 22], dtype=torch.int32)},
     ValueError, r"^cu_seqlens: last offset must not pass the end of the T=21 token buffer, got 22"),
    ("cu_with_B2", False, lambda kw: {**kw, "cu_seqlens": torch.tensor([0, 5, 20]), "initial_state": None},
     ValueError, r"^cu_seqlens: needs B == 1"),
    # ---- devices and values
    ("g_meta_device", False, lambda kw: {**kw, "g": kw["g"].to("meta")}, ValueError,
     r"^g: must be on q's device cpu, got meta"),
    ("cu_meta_device", True, lambda kw: {**kw, "cu_seqlens": kw["cu_seqlens"].to("meta")}, ValueError,
     r"^cu_seqlens: must be on q's device"),
    ("scale_nan", False, _set(scale=float("nan")), ValueError, r"^scale: must be finite"),
]


@pytest.mark.parametrize("varlen,mutate,exc,match", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_refused(varlen: bool, mutate, exc: type, match: str) -> None:
    kw = mutate(_good_varlen() if varlen else _good())
    with pytest.raises(exc, match=match):
        check_inputs(**kw)


@pytest.mark.parametrize("fn", [recurrent_gated_delta_rule_ref, chunk_gated_delta_rule_ref])
def test_references_validate_first(fn) -> None:
    kw = _good_varlen()
    with pytest.raises(ValueError, match=r"^cu_seqlens: must start at 0, got 3$"):
        fn(**{**kw, "cu_seqlens": torch.tensor([3, 5, 12, 17], dtype=torch.int32)})
    with pytest.raises(TypeError, match=r"^k: must have q's dtype"):
        fn(**{**kw, "k": kw["k"].float()})


def test_padding_and_empty_sequences_accepted() -> None:
    kw = _good_varlen()
    p = check_inputs(**{**kw, "cu_seqlens": torch.tensor([0, 0, 12, 12], dtype=torch.int64)})
    assert p.seqlens == [0, 12, 0] and p.T == 21


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("backend", ["two_kernel", "fused_fixed", "fast"])
def test_triton_backends_refuse_non_bf16_naming_q(backend: str, dtype: torch.dtype) -> None:
    """The Triton kernels compute in bf16: other q/k/v dtypes are refused at the entry point, naming q and the
    supported dtype, before any kernel runs (they used to fail inside Triton's interpreter)."""
    import gdnlab
    kw = {k: (v.to(dtype) if k in ("q", "k", "v") else v) for k, v in _good().items()}
    with pytest.raises(TypeError, match=r"^q: this backend computes q, k, v in torch.bfloat16 only, got "):
        gdnlab.chunk_gated_delta_rule(**kw, backend=backend)
    o, _ = gdnlab.chunk_gated_delta_rule(**kw, backend="reference")  # the reference takes any floating dtype
    assert torch.isfinite(o).all()


def test_supported_dtypes_leave_other_calls_alone() -> None:
    kw = _good()
    assert check_inputs(**kw, dtypes=(kw["q"].dtype,)).dtype == kw["q"].dtype
    with pytest.raises(TypeError, match=r"^q: this backend computes q, k, v in torch.bfloat16 only"):
        check_inputs(**{**kw, "q": kw["q"].half(), "k": kw["k"].half(), "v": kw["v"].half()},
                     dtypes=(torch.bfloat16,))


def _bf16(kw: dict[str, Any]) -> dict[str, Any]:
    """The arguments with q, k, v in bf16, as the Triton backends take them."""
    return {k: (v.to(torch.bfloat16) if k in ("q", "k", "v") else v) for k, v in kw.items()}


@pytest.mark.parametrize("backend", ["two_kernel", "fast"])
@pytest.mark.parametrize("change, exc, match", [
    (dict(cu_seqlens=torch.tensor([[0, 12]], dtype=torch.int32)), ValueError, "^cu_seqlens: must be 1-d"),
    (dict(cu_seqlens=torch.tensor(12, dtype=torch.int32)), ValueError, "^cu_seqlens: must be 1-d"),
    (dict(scale=[0.25]), TypeError, "^scale: "),
    (dict(output_final_state=[True]), TypeError, "^output_final_state: must be a bool"),
])
def test_triton_backends_name_the_argument_before_their_call_cache(backend: str, change: dict, exc: type,
                                                                   match: str) -> None:
    """The Triton backends remember checked calls by their signature (pipeline.signature); an argument that cannot
    be part of one goes to the full check, which names it, instead of failing while the key is built."""
    import gdnlab
    kw = {**_bf16(_good()), **change}
    if "cu_seqlens" in change:
        kw = {**kw, "q": kw["q"][:1], "k": kw["k"][:1], "v": kw["v"][:1], "g": kw["g"][:1], "beta": kw["beta"][:1],
              "initial_state": None}
    with pytest.raises(exc, match=match):
        gdnlab.chunk_gated_delta_rule(**kw, backend=backend)


def test_options_are_refused_by_every_backend_that_does_not_take_them() -> None:
    import gdnlab
    for backend, match in (("reference", "reference backend takes no kernel options"),
                            ("fast", r"this backend \(the two_kernel kernels\) does not take \['bv'\]")):
        with pytest.raises(TypeError, match=match):
            gdnlab.chunk_gated_delta_rule(**_bf16(_good()), backend=backend, bv=32)
    o, _ = gdnlab.chunk_gated_delta_rule(**_good(), backend="reference", poison=True)  # poison: accepted, no effect
    assert torch.isfinite(o).all()
