"""The pipeline's stage calls, used one by one as the device benchmarks and arch_study use them, give bit for bit
what the public entry point gives."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import gdnlab
from gdnlab.inputs import make_inputs
from gdnlab.kernel_params import FUSED_VARIANTS
from gdnlab.kernels import l2norm, pipeline


@pytest.fixture(scope="module")
def small():
    return make_inputs(B=1, T=70, H=1, HV=2, K=32, V=32, seed=3, decay=0.1).kwargs()


@pytest.mark.parametrize("backend,path,opts", [("two_kernel", "two_kernel", {}),
                                               ("fused_shipped", "fused", FUSED_VARIANTS["fused_shipped"].options)])
def test_stages_one_by_one_equal_the_entry_point(small, backend, path, opts):
    o_want, h_want = gdnlab.chunk_gated_delta_rule(**small, backend=backend)
    x = pipeline.flatten(**small)
    xn = dataclasses.replace(x, q=l2norm(x.q), k=l2norm(x.k))  # the l2-norm as a stage of its own
    pro = pipeline.prologue(xn, False)
    o, ht = pipeline.allocate_outputs(x, output_final_state=True, state_v_first=False)
    pipeline.walk(x, pro, path, o, ht, state_v_first=False, BV=32, **opts)
    assert torch.equal(o.view_as(o_want), o_want) and torch.equal(ht, h_want)


def test_unknown_path_is_refused(small):
    x = pipeline.flatten(**small)
    with pytest.raises(ValueError, match="^path"):
        pipeline.state_and_outputs(x, pipeline.prologue(x, True), "three_kernel", output_final_state=False,
                                   state_v_first=False, BV=32)


def test_repeated_calls_are_checked_in_full(small):
    """The check's verdict is remembered by signature, and a signature that differs only in an argument's type or
    cu_seqlens's values is checked afresh: a remembered pass never lets a bad call through."""
    pipeline.flatten(**small)
    with pytest.raises(TypeError, match="^output_final_state"):
        pipeline.flatten(**{**small, "output_final_state": 1})  # equal to True, but not a bool
    with pytest.raises(TypeError, match="^scale"):
        pipeline.flatten(**{**small, "scale": True})
    ragged = {**small, "initial_state": None, "cu_seqlens": torch.tensor([0, 30, 70])}
    assert pipeline.flatten(**ragged).problem.seq_bounds == [(0, 30), (30, 70)]
    with pytest.raises(ValueError, match="^cu_seqlens"):
        pipeline.flatten(**{**ragged, "cu_seqlens": torch.tensor([0, 30, 71])})
    x = pipeline.flatten(**{**ragged, "cu_seqlens": torch.tensor([0, 40, 70])})
    assert x.problem.seq_bounds == [(0, 40), (40, 70)] and x.plan.cu_seqlens.tolist() == [0, 40, 70]


def test_signature_separates_what_the_check_reads(small):
    base = pipeline.signature(*(small[n] for n in ("q", "k", "v", "g", "beta", "initial_state")), None, None,
                              False, True, False)
    assert base == pipeline.signature(*(small[n].clone() for n in ("q", "k", "v", "g", "beta", "initial_state")),
                                      None, None, False, True, False)
    for changed in (dict(q=small["q"][:, :-1]), dict(g=small["g"].double()), dict(initial_state=None)):
        kw = {**small, **changed}
        assert pipeline.signature(*(kw[n] for n in ("q", "k", "v", "g", "beta", "initial_state")), None, None,
                                  False, True, False) != base
    assert pipeline.signature("q", *(small[n] for n in ("k", "v", "g", "beta", "initial_state")), None, None) is None
