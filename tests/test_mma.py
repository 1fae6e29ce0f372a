"""gdnlab.mma: matrix-unit models against mmasim, hand-made rounding cases, interface."""
from __future__ import annotations

import csv
import itertools
import time

import numpy as np
import pytest

from gdnlab import mma, runs

NO_SPECIALS = tuple(k for k in mma.TILE_KINDS if k != "specials")


def f32(*xs: float) -> np.ndarray:
    return np.array(xs, dtype=np.float32)


def one_row(products: list[float], c: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """a [1, K] = products, b [K, 1] = ones, c [1, 1]: D = sum(products) + c."""
    a = f32(*products)[None, :]
    return a, np.ones((a.shape[1], 1), np.float32), f32(c)[None, :]


# ------------------------------------------------------------------------------------------------ against mmasim

# (target, K, tiles): single instructions and chains over K = 64, on every tile kind; the number of tiles keeps
# the product count per case near that of 150 m16n8k16 tiles (mmasim is the slow side), at least 2 tiles per kind.


def _tiles(m: int, n: int, k: int, budget: int) -> int:
    return int(np.clip(budget // (m * n * k), 2 * len(mma.TILE_KINDS), 300))


_SPECS = mma.MMASIM_TARGETS.items()
MMASIM_CASES = [(t, s["shape"][2], _tiles(*s["shape"], budget=150 * 16 * 8 * 16)) for t, s in _SPECS]
MMASIM_CASES += [(t, 64, _tiles(*s["shape"][:2], 64, budget=40 * 16 * 8 * 16)) for t, s in _SPECS]


@pytest.mark.parametrize("target,k,tiles", MMASIM_CASES, ids=[f"{t}-K{k}" for t, k, _ in MMASIM_CASES])
def test_model_bit_exact_vs_mmasim(target: str, k: int, tiles: int) -> None:
    pytest.importorskip("mmasim")
    spec = mma.MMASIM_TARGETS[target]
    m, n, _ = spec["shape"]
    input_type = spec.get("input", "bf16")
    a, b, c = mma.random_tiles(tiles, m, k, n, seed=7 + k, input_type=input_type)
    ref = mma.mmasim_dot(target, a, b, c)
    got = mma.get_model(spec["model"]).dot(a, b, c, input_type=input_type)
    # every bit identical, NaN included, except NaN payloads (host-CPU artefacts in mmasim's FMA and FTZ paths)
    assert mma.bit_exact_fraction(ref, got, nan_equal=True) == 1.0
    assert mma.bit_exact_fraction(ref[~np.isnan(ref)], got[~np.isnan(ref)]) == 1.0


def test_mmasim_batched_call_matches_instruction_object() -> None:
    pytest.importorskip("mmasim")
    a, b, c = mma.random_tiles(11, 16, 16, 8, seed=3)
    batched = mma.mmasim_dot("hopper_mma", a, b, c)
    for i in range(11):
        assert mma.bit_exact_fraction(mma.mmasim_call("hopper_mma", a[i], b[i], c[i]), batched[i], True) == 1.0


def test_committed_table_meets_target() -> None:
    path = runs.path(runs.latest("cpu", has="mma_models_vs_mmasim.csv"), "mma_models_vs_mmasim.csv", "cpu")
    rows = list(csv.DictReader(open(path)))
    covered = {spec["model"] for spec in mma.MMASIM_TARGETS.values()}
    for model in covered:
        mine = [r for r in rows if r["model"] == model]
        assert mine, model
        assert max(int(r["cases"]) for r in mine) >= 10_000
        assert min(float(r["bit_exact_fraction"]) for r in mine) >= 0.999
    assert {"model", "mmasim_arch", "instruction", "cases", "bit_exact_fraction", "mmasim_version", "date"} <= set(
        rows[0])


# ------------------------------------------------------------------------------------------------ hand-made cases

def test_ideal_equals_float64_matmul_on_exact_inputs() -> None:
    rng = np.random.default_rng(0)
    # multiples of 2**-4 up to 4 in size: every partial sum is exact in fp32, so rounding never happens
    a = (rng.integers(-64, 65, (3, 64, 64)) / 16).astype(np.float32)
    b = (rng.integers(-64, 65, (3, 64, 32)) / 16).astype(np.float32)
    c = (rng.integers(-1000, 1000, (3, 64, 32)) / 256).astype(np.float32)
    want = (np.matmul(a.astype(np.float64), b.astype(np.float64)) + c).astype(np.float32)
    for name in ("ideal", "hopper", "ampere", "cdna3", "cdna2", "rdna3_hyp_dot2", "rdna3_hyp_trunc16"):
        assert mma.bit_exact_fraction(mma.MODELS[name].dot(a, b, c), want) == 1.0, name


def test_ideal_is_close_to_float64_on_random_inputs() -> None:
    a, b, c = mma.random_tiles(4, 64, 64, 64, seed=1, kinds=("normal",))
    exact = np.matmul(a.astype(np.float64), b.astype(np.float64)) + c
    got = mma.MODELS["ideal"].dot(a, b, c).astype(np.float64)
    # sequential fp32 RNE accumulation: error below K * 2**-24 * sum|terms|
    bound = 64 * 2.0**-24 * (np.matmul(np.abs(a).astype(np.float64), np.abs(b)) + np.abs(c))
    assert np.all(np.abs(got - exact) <= bound)
    k1 = mma.MODELS["ideal"].dot(a[..., :1], b[..., :1, :], c)  # one FMA: exactly RNE of the exact value
    assert mma.bit_exact_fraction(k1, (a[..., :1].astype(np.float64) * b[..., :1, :] + c).astype(np.float32)) == 1


def test_rounding_direction_above_half_ulp() -> None:
    """1 + 0.75 ulp: round-to-nearest models go up, the truncating NVIDIA models stay at 1 (toward zero)."""
    ulp = 2.0**-23
    for sign in (1.0, -1.0):
        a, b, c = one_row([sign * 1.5 * 2.0**-24], sign * 1.0)
        for name in ("ideal", "cdna3", "cdna2", "rdna3_hyp_dot2"):
            assert mma.MODELS[name].dot(a, b, c)[0, 0] == np.float32(sign * (1 + ulp)), name
        for name in ("hopper", "ampere", "rdna3_hyp_trunc16"):
            assert mma.MODELS[name].dot(a, b, c)[0, 0] == np.float32(sign), name


def test_alignment_truncation_drops_small_products() -> None:
    """C = 1 and 16 products of 2**-26 (exact sum 1 + 2**-22): terms below the 25th (Hopper) or 24th (Ampere)
    fractional bit of the largest exponent are truncated away one by one (and a sequential FMA chain rounds each
    away); CDNA3 sums each 8 products before meeting C and keeps them. 2**-25 survives Hopper but not Ampere."""
    a, b, c = one_row([2.0**-26] * 16, 1.0)
    assert mma.MODELS["cdna3"].dot(a, b, c)[0, 0] == np.float32(1 + 2.0**-22)  # 8 products fused exactly first
    assert mma.MODELS["ideal"].dot(a, b, c)[0, 0] == np.float32(1.0)  # each 1 + 2**-26 rounds back to 1
    assert mma.MODELS["hopper"].dot(a, b, c)[0, 0] == np.float32(1.0)
    assert mma.MODELS["ampere"].dot(a, b, c)[0, 0] == np.float32(1.0)
    a, b, c = one_row([2.0**-25] * 16, 1.0)
    assert mma.MODELS["hopper"].dot(a, b, c)[0, 0] == np.float32(1 + 2.0**-21)
    assert mma.MODELS["ampere"].dot(a, b, c)[0, 0] == np.float32(1.0)


def test_cdna3_rounds_c_toward_minus_infinity() -> None:
    """Product 2, C = -2**-26: exact 2 - 2**-26 rounds to 2 (ideal; Hopper truncates C's term to 0), but CDNA3
    floors C to 24 bits below the product's exponent (-2**-23) and lands on 2 - 2**-23; +2**-26 floors to 0."""
    a, b, c = one_row([2.0], -(2.0**-26))
    assert mma.MODELS["ideal"].dot(a, b, c)[0, 0] == np.float32(2.0)
    assert mma.MODELS["hopper"].dot(a, b, c)[0, 0] == np.float32(2.0)
    assert mma.MODELS["cdna3"].dot(a, b, c)[0, 0] == np.float32(2.0 - 2.0**-23)
    a, b, c = one_row([2.0], 2.0**-26)
    assert mma.MODELS["cdna3"].dot(a, b, c)[0, 0] == np.float32(2.0)


def test_ties_to_even_and_signed_zero() -> None:
    # 2**24 + 1 is a tie between 2**24 and 2**24 + 2: RNE picks the even 2**24, and so does truncation
    a, b, c = one_row([1.0], 2.0**24)
    assert mma.MODELS["ideal"].dot(a, b, c)[0, 0] == np.float32(2.0**24)
    # 2**24 + 3: tie between 2**24 + 2 and 2**24 + 4, RNE goes up to the even 2**24 + 4, RZ stays at 2**24 + 2
    a, b, c = one_row([3.0], 2.0**24)
    assert mma.MODELS["ideal"].dot(a, b, c)[0, 0] == np.float32(2.0**24 + 4)
    assert mma.MODELS["cdna3"].dot(a, b, c)[0, 0] == np.float32(2.0**24 + 4)
    assert mma.MODELS["hopper"].dot(a, b, c)[0, 0] == np.float32(2.0**24 + 2)
    # exact cancellation with C = -0: fused NVIDIA models return +0, IEEE addition too
    a, b, c = one_row([1.0, -1.0], -0.0)
    for name in mma.MODELS:
        d = mma.MODELS[name].dot(a, b, c)[0, 0]
        assert d == 0 and not np.signbit(d), name


def test_cdna2_flushes_subnormals() -> None:
    tiny = 2.0**-130  # a bf16 subnormal
    a, b, c = one_row([tiny, 0.0, 0.0, 0.0], 0.0)
    assert mma.MODELS["cdna2"].dot(a, b, c)[0, 0] == 0
    assert mma.MODELS["rdna3_hyp_dot2"].dot(a, b, c)[0, 0] == np.float32(tiny)
    assert mma.MODELS["ideal"].dot(a, b, c)[0, 0] == np.float32(tiny)


def test_overflow_and_specials() -> None:
    a, b, c = one_row([2.0**127, 2.0**127], 0.0)
    for name in mma.MODELS:
        assert mma.MODELS[name].dot(a, b, c)[0, 0] == np.inf, name
    a, b, c = one_row([np.inf, 1.0], -np.inf)
    for name in mma.MODELS:
        d = mma.MODELS[name].dot(a, b, c)
        assert np.isnan(d[0, 0]) and d.view(np.uint32)[0, 0] == 0x7FFFFFFF, name


# ------------------------------------------------------------------------------------------------ models differ

def test_models_differ_on_random_inputs() -> None:
    a, b, c = mma.random_tiles(2, 64, 64, 64, seed=11, kinds=("normal",))
    outs = {name: m.dot(a, b, c) for name, m in mma.MODELS.items()}
    for x, y in itertools.combinations(outs, 2):
        same = mma.bit_exact_fraction(outs[x], outs[y])
        if x == mma.MODELS[y].equivalent_to or y == mma.MODELS[x].equivalent_to:
            assert same == 1.0, (x, y)
        else:
            assert same < 0.99, (x, y, same)


def test_truncating_models_are_biased_toward_zero() -> None:
    a, b, c = mma.random_tiles(4, 64, 64, 64, seed=5, kinds=("uniform",))
    exact = np.matmul(a.astype(np.float64), b.astype(np.float64)) + c
    for name in ("hopper", "ampere"):
        err = (mma.MODELS[name].dot(a, b, c) - exact) * np.sign(exact)
        assert err.mean() < 0 and np.mean(err < 0) > 3 * np.mean(err > 0), name
    err = (mma.MODELS["ideal"].dot(a, b, c) - exact) * np.sign(exact)
    assert 0.5 < np.mean(err < 0) / np.mean(err > 0) < 2


# ------------------------------------------------------------------------------------------------ interface

def test_interface() -> None:
    assert {"ideal", "hopper", "ampere", "cdna3", "cdna2"} <= set(mma.MODELS)
    assert any(n.startswith("rdna3_hyp_") for n in mma.MODELS)
    for name, m in mma.MODELS.items():
        assert isinstance(m, mma.MMAModel) and m.name == name and m.description and m.k_block >= 1
        assert mma.get_model(name) is m and mma.get_model(m) is m
    assert (mma.MODELS["hopper"].k_block, mma.MODELS["ampere"].k_block, mma.MODELS["cdna3"].k_block) == (16, 8, 8)
    with pytest.raises(ValueError, match="unknown MMA model"):
        mma.get_model("volta")


def test_dot_shapes_batches_and_validation() -> None:
    a, b, c = mma.random_tiles(3, 16, 48, 8, seed=2, kinds=("normal",))
    a0, b0, c0 = a.copy(), b.copy(), c.copy()
    for m in mma.MODELS.values():
        d = m.dot(a, b, c)
        assert d.dtype == np.float32 and d.shape == (3, 16, 8)
        one = m.dot(a[1], b[1], c[1])
        assert one.shape == (16, 8) and mma.bit_exact_fraction(one, d[1]) == 1.0
    assert np.array_equal(a, a0) and np.array_equal(b, b0) and np.array_equal(c, c0)
    with pytest.raises(ValueError, match="bf16"):
        mma.MODELS["hopper"].dot(a + np.float32(1e-3), b, c)
    with pytest.raises(ValueError):
        mma.MODELS["hopper"].dot(a, b[:, :8], c)


def test_input_types() -> None:
    hopper = mma.MODELS["hopper"]
    assert hopper.for_inputs("bf16") is hopper and hopper.for_inputs("tf32").k_block == 8
    assert mma.MODELS["ampere"].for_inputs("tf32").k_block == 4 and mma.MODELS["cdna3"].for_inputs("tf32").k_block == 4
    for name, m in mma.MODELS.items():
        assert isinstance(m.for_inputs("fp32"), mma.SequentialFMA)
        if name not in ("hopper", "ampere", "cdna3"):
            assert isinstance(m.for_inputs("tf32"), mma.SequentialFMA)
        else:
            tf32 = m.for_inputs("tf32")
            assert tf32.input_type == "tf32" and tf32.for_inputs("tf32") is tf32
            assert tf32.for_inputs("fp32") is mma.FP32_FMA
            with pytest.raises(ValueError, match="computes tf32"):
                tf32.for_inputs("bf16")
    for input_type, low in (("tf32", 0x1FFF), ("fp32", 0)):
        a, b, c = mma.random_tiles(22, 16, 16, 8, seed=1, input_type=input_type)
        assert not np.any(a.view(np.uint32) & low) and np.any(a.view(np.uint32) & 0xFFFF)
        with pytest.raises(ValueError, match="bf16"):
            hopper.dot(a, b, c)
        d = hopper.dot(a, b, c, input_type=input_type)
        assert d.shape == c.shape
        assert mma.bit_exact_fraction(hopper.for_inputs(input_type).dot(a, b, c, input_type=input_type), d) == 1.0
    a, b, c = mma.random_tiles(22, 16, 16, 8, seed=1, input_type="fp32")
    with pytest.raises(ValueError, match="tf32"):
        hopper.dot(a, b, c, input_type="tf32")
    with pytest.raises(ValueError, match="input_type"):
        hopper.dot(a, b, c, input_type="fp16")
    # fp32 values: the FMA chain is exact per step (one rounding), unlike fp32 multiply-then-add
    a = np.full((1, 1), 1 + 2.0**-23, np.float32)
    b = np.full((1, 1), 1 - 2.0**-23, np.float32)
    c = np.full((1, 1), -1.0, np.float32)
    assert mma.FP32_FMA.dot(a, b, c, input_type="fp32")[0, 0] == np.float32(-(2.0**-46))


def test_partial_last_block() -> None:
    """K = 24 with k_block 16: one 16-product step then one 8-product step."""
    a, b, c = mma.random_tiles(5, 16, 24, 8, seed=4, kinds=("uniform",))
    m = mma.MODELS["hopper"]
    step = m.dot(a[..., 16:], b[..., 16:, :], m.dot(a[..., :16], b[..., :16, :], c))
    assert mma.bit_exact_fraction(m.dot(a, b, c), step) == 1.0


def test_speed_64x64x64() -> None:
    a, b, c = mma.random_tiles(1, 64, 64, 64, seed=0, kinds=("normal",))
    for m in mma.MODELS.values():
        m.dot(a[0], b[0], c[0])
        t = time.perf_counter()
        for _ in range(5):
            m.dot(a[0], b[0], c[0])
        assert (time.perf_counter() - t) / 5 < 0.05, m.name  # a few ms on a laptop; generous for CI


def test_tiles_and_bit_exact_fraction() -> None:
    a, b, c = mma.hardware_check_tiles(30, seed=9)
    assert a.shape == (30, 64, 64) and b.shape == (30, 64, 64) and c.shape == (30, 64, 64)
    assert a.dtype == b.dtype == c.dtype == np.float32
    assert np.all(np.isfinite(a)) and np.all(np.isfinite(b)) and np.all(np.isfinite(c))
    assert not np.any(a.view(np.uint32) & 0xFFFF) and not np.any(b.view(np.uint32) & 0xFFFF)
    a2, _, c2 = mma.hardware_check_tiles(30, seed=9)
    assert np.array_equal(a, a2) and np.array_equal(c, c2)
    assert not np.array_equal(a, mma.hardware_check_tiles(30, seed=10)[0])
    assert set(mma.tile_kinds(30, mma.HARDWARE_KINDS)) == set(mma.HARDWARE_KINDS)
    assert mma.bit_exact_fraction(f32(0.0, 1.0), f32(-0.0, 1.0)) == 0.5
    assert mma.bit_exact_fraction(f32(np.nan), f32(-np.nan)) == 0.0
    assert mma.bit_exact_fraction(f32(np.nan), f32(-np.nan), nan_equal=True) == 1.0
    assert np.array_equal(mma.to_bf16(f32(1 + 2.0**-8, 1 + 3 * 2.0**-8)), f32(1.0, 1 + 2.0**-6))
