"""metrics: known small cases, NaN never passes, the named budgets, valid_rows and masks."""
from __future__ import annotations

import math

import pytest
import torch

from gdnlab.metrics import CUTEDSL_OUTPUT, CUTEDSL_STATE, FLA_REL_RMS, Budget, errors, ulp_bf16, valid_rows


def test_known_values() -> None:
    ref = torch.tensor([[3.0, -4.0], [0.5, 2.0]])
    out = torch.tensor([[3.5, -4.0], [0.5, 1.0]])
    e = errors(out, ref)
    assert e["max_abs"] == 1.0
    assert e["mean_abs"] == pytest.approx(1.5 / 4, rel=1e-15)
    # ||d|| = sqrt(0.25 + 1) ; ||ref|| = sqrt(9 + 16 + 0.25 + 4)
    assert e["rel_rms"] == pytest.approx(math.sqrt(1.25) / math.sqrt(29.25), rel=1e-15)
    assert set(e) == {"max_abs", "mean_abs", "rel_rms"} and all(type(v) is float for v in e.values())
    z = errors(ref, ref)
    assert z == dict(max_abs=0.0, mean_abs=0.0, rel_rms=0.0)


def test_float64_arithmetic_for_low_precision_operands() -> None:
    # bf16 out against float64 ref: the difference is taken in float64, not in bf16
    ref = torch.tensor([1.0 + 2 ** -12], dtype=torch.float64)
    out = torch.tensor([1.0], dtype=torch.bfloat16)
    assert errors(out, ref)["max_abs"] == 2 ** -12


def test_ulp_bf16_is_the_unit_roundoff() -> None:
    assert ulp_bf16 == 2 ** -8
    x = torch.randn(10000, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    rel = ((x.to(torch.bfloat16).double() - x) / x).abs()
    assert rel.max().item() <= ulp_bf16 and rel.max().item() > 0.9 * ulp_bf16


def test_nan_never_passes() -> None:
    ref = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))
    out = ref.clone()
    out[2, 3] = float("nan")
    e = errors(out, ref)
    assert all(math.isnan(v) for v in e.values())
    for b in (CUTEDSL_OUTPUT, CUTEDSL_STATE, FLA_REL_RMS, Budget("none")):
        ok, errs = b.check(out, ref)
        assert ok is False and math.isnan(errs["max_abs"])
    ref_nan = ref.clone()
    ref_nan[0, 0] = float("nan")
    assert math.isnan(errors(ref, ref_nan)["rel_rms"])


def test_inf_never_passes() -> None:
    ref = torch.ones(3) * 0.5
    out = ref.clone()
    out[1] = float("inf")
    ok, errs = CUTEDSL_OUTPUT.check(out, ref)
    assert not ok and errs["max_abs"] == math.inf


def test_zero_reference() -> None:
    z = torch.zeros(3)
    assert errors(z, z)["rel_rms"] == 0.0
    assert errors(z + 1e-3, z)["rel_rms"] == math.inf


def test_budgets_values_and_strictness() -> None:
    assert (CUTEDSL_OUTPUT.max_abs, CUTEDSL_OUTPUT.mean_abs, CUTEDSL_OUTPUT.rel_rms) == (2e-3, 6e-5, None)
    assert (CUTEDSL_STATE.max_abs, CUTEDSL_STATE.mean_abs) == (2e-2, 6e-4)
    assert FLA_REL_RMS.rel_rms == 0.005 and FLA_REL_RMS.limits() == {"rel_rms": 0.005}
    ref = torch.zeros(1000, dtype=torch.float64)
    out = ref.clone()
    out[0] = 1.5e-3                                  # max 1.5e-3 < 2e-3, mean 1.5e-6 < 6e-5
    ok, errs = CUTEDSL_OUTPUT.check(out, ref)
    assert ok and errs["max_abs"] == 1.5e-3
    out[0] = 2e-3                                    # the limit itself fails (strict)
    assert not CUTEDSL_OUTPUT.check(out, ref)[0]
    out[:] = 5e-5                                    # max fine, mean 5e-5 < 6e-5 fine
    assert CUTEDSL_OUTPUT.check(out, ref)[0]
    out[:] = 7e-5                                    # mean over budget
    assert not CUTEDSL_OUTPUT.check(out, ref)[0]
    r = torch.ones(100, dtype=torch.float64)
    assert FLA_REL_RMS.check(r * 1.004, r)[0] and not FLA_REL_RMS.check(r * 1.006, r)[0]


def test_valid_rows() -> None:
    cu = torch.tensor([0, 3, 3, 7], dtype=torch.int32)
    m = valid_rows(cu, 10)
    assert m.dtype == torch.bool and m.tolist() == [True] * 7 + [False] * 3
    assert valid_rows(None, 4).tolist() == [True] * 4
    assert valid_rows(None, 4, B=2).shape == (2, 4)
    with pytest.raises(ValueError, match="^cu_seqlens: last offset 7 passes the end"):
        valid_rows(cu, 6)


def test_mask_selects_rows() -> None:
    gen = torch.Generator().manual_seed(1)
    ref = torch.randn(1, 6, 2, 3, generator=gen, dtype=torch.float64)
    out = ref.clone()
    out[0, 4:] += 100.0                               # garbage in the padding rows only
    mask = valid_rows(torch.tensor([0, 4]), 6)
    assert errors(out, ref, mask)["max_abs"] == 0.0   # a [T] row mask
    assert errors(out, ref, mask[None])["max_abs"] == 0.0   # a [B, T] mask
    assert errors(out, ref)["max_abs"] == pytest.approx(100.0)
    assert CUTEDSL_OUTPUT.check(out, ref, mask)[0] and not CUTEDSL_OUTPUT.check(out, ref)[0]
    with pytest.raises(ValueError, match="^mask: must have shape"):
        errors(out, ref, torch.ones(5, dtype=torch.bool))


def test_shape_and_type_errors() -> None:
    with pytest.raises(ValueError, match="^out: must have ref's shape"):
        errors(torch.zeros(3), torch.zeros(4))
    with pytest.raises(TypeError, match="^out, ref: must be torch.Tensor"):
        errors([0.0], torch.zeros(1))
