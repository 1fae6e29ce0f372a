"""gdnlab.arch_study on tiny shapes: the shared-prologue runner equals the public API bit for bit, the tables respond
to the model, and the findings assert what they say."""
from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest
import torch

import gdnlab
from gdnlab import arch_study as arch
from gdnlab.cases import ISOLATION
from gdnlab.interp import current_dot_model, dot_model

TINY = replace(arch.REPORT_PROBLEM, H=1, HV=1, K=32, V=32)
MODELS = ["exact", "hopper", "cdna3"]


@pytest.fixture(scope="module")
def seq() -> pd.DataFrame:
    return arch.seq_len_table(MODELS, [40, 64, 100], problem=TINY, progress=False)


@pytest.fixture(scope="module")
def iso() -> pd.DataFrame:
    return arch.isolation_table(MODELS, ISOLATION, problem=TINY, progress=False)


@pytest.mark.parametrize("model", ["hopper", "rdna3_hyp_dot2"])
def test_run_variants_equals_public_api(model):
    inp = TINY.inputs(80, "cpu")
    with dot_model(model):
        outs = arch.run_variants(inp)
        for name, v in arch.VARIANTS.items():
            o, ht = gdnlab.chunk_gated_delta_rule(**inp.kwargs(), backend=v.backend, poison=True, **v.options)
            assert torch.equal(o, outs[name][0]) and torch.equal(ht, outs[name][1]), name


@pytest.mark.parametrize("model", ["ampere", "cdna2"])
def test_fixed_bit_equal_to_two_kernel_under_model(model):
    inp = TINY.inputs(100, "cpu")
    with dot_model(model):
        outs = arch.run_variants(inp, ["two_kernel", "fused_fixed", "fused_shipped"])
    assert torch.equal(outs["fused_fixed"][0], outs["two_kernel"][0])
    assert torch.equal(outs["fused_fixed"][1], outs["two_kernel"][1])
    assert not torch.equal(outs["fused_shipped"][0], outs["two_kernel"][0])
    assert torch.equal(outs["fused_shipped"][1], outs["two_kernel"][1])


def test_outputs_change_with_the_model():
    inp = TINY.inputs(128, "cpu")
    with dot_model("exact"):
        a = arch.run_variants(inp, ["two_kernel"])["two_kernel"]
    with dot_model("hopper"):
        b = arch.run_variants(inp, ["two_kernel"])["two_kernel"]
    assert not torch.equal(a[1], b[1])  # the fp32 final state sees the accumulation order


def test_dot_model_restored_and_bad_arguments():
    before = current_dot_model()
    arch.seq_len_table(["exact", "hopper"], [64], problem=TINY, variants=["two_kernel"], progress=False)
    assert current_dot_model() is before
    with pytest.raises(ValueError, match="models"):
        arch.seq_len_table(["nope"], [64], problem=TINY, progress=False)
    with pytest.raises(ValueError, match="variants"):
        arch.run_variants(TINY.inputs(8, "cpu"), ["nope"])
    with pytest.raises(ValueError, match="seq_lens"):
        arch.seq_len_table(["exact"], [0], problem=TINY, progress=False)


def test_seq_len_table(seq):
    assert {"device", "torch", "triton", "seed", "model", "variant", "backend", "seq_len", "max_abs_err",
            "diff_vs_baseline", "diff_vs_exact", "diff_vs_downcast_on"} <= set(seq.columns)
    assert len(seq) == len(MODELS) * len(arch.VARIANTS) * 3
    assert list(dict.fromkeys(seq.model)) == MODELS
    assert (seq[seq.model == "exact"].diff_vs_exact == 0).all()
    # the fp32 final state moves with the model (the bf16 output may or may not)
    st = seq[seq.variant == "two_kernel"].groupby("model").state_max_abs_err.first()
    assert st["hopper"] != st["exact"] or st["cdna3"] != st["exact"]
    nodc = seq[seq.variant.str.endswith("no_downcast")]
    assert nodc.diff_vs_downcast_on.notna().all() and (nodc.downcast == False).all()  # noqa: E712


def test_isolation_table(iso):
    assert set(iso.case) == {c.name for c in ISOLATION}
    assert set(iso.variant) == set(arch.BASIC)
    quiet = iso[(iso.case == "iso_1chunk_noh0") & (iso.variant == "fused_shipped")]
    assert (quiet.output_diff_vs_baseline == 0).all()


def test_findings_hold_and_answer(seq, iso):
    assert "not architecture-specific" in arch.answer(seq, iso).claim
    eff = arch.effects(seq)
    assert set(eff.seq_len) == {40, 64, 100} and (eff.excess > 0).all()
    assert "head size K = 32" in arch.answer(seq, iso).claim
    s = arch.model_shift_summary(arch.model_shift(seq))
    assert "hopper" in s.numbers["by_model"]
    for view in (arch.errors_view(seq), arch.ablation_view(seq), arch.shift_view(arch.model_shift(seq)),
                 arch.isolation_view(iso)):
        assert not view.empty


def test_findings_raise_with_numbers(seq, iso):
    bad = seq.copy()
    sel = (bad.model == "hopper") & (bad.variant == "fused_shipped")
    bad.loc[sel, "max_abs_err"] *= 3  # a model where the excess is 3x larger
    with pytest.raises(AssertionError, match="numbers"):
        arch.excess_under_every_model(bad)
    bad = seq.copy()
    bad.loc[(bad.variant == "fused_fixed") & (bad.model == "cdna3"), "diff_vs_baseline"] = 2.0 ** -9
    with pytest.raises(AssertionError, match="not bit-equal"):
        arch.fixed_bit_equal_everywhere(bad, iso)
    eff = arch.effects(seq)
    eff.loc[0, "downcast_change"] = eff.loc[0, "excess"]
    with pytest.raises(AssertionError, match="1/10"):
        arch.model_and_downcast_negligible(eff)
    bad = iso.copy()
    bad.loc[(bad.case == "iso_1chunk_noh0") & (bad.variant == "fused_shipped"), "output_diff_vs_baseline"] = 1e-3
    with pytest.raises(AssertionError):
        arch.isolation_signature_everywhere(bad)


def test_study_config():
    cfg = arch.study_config()
    assert cfg["models"][0] == "exact" and set(cfg["models"]) == set(arch.ALL_MODELS)
    assert cfg["shape"]["K"] == 128 and cfg["seq_lens"] == [63, 64, 128, 192]
    q = arch.study_config(quick=True, models=["exact"])
    assert q["models"] == arch.QUICK["models"] and q["shape"] == arch.QUICK["shape"]
    with pytest.raises(ValueError, match="unknown"):
        arch.study_config(models=["exact", "volta"])
    mt = arch.model_table(["hopper", "exact", "rdna3_hyp_dot2"])
    assert list(mt.model) == ["exact", "hopper", "rdna3_hyp_dot2"]
    assert list(mt.kind) == ["exact", "validated (mmasim)", "hypothesis"]
