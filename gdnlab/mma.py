"""Models of how a matrix unit computes ``D = A·B + C`` for bf16 ``A``, ``B`` and fp32 ``C``, ``D``.

Every model walks K in order, in blocks of ``k_block`` products, and folds each block into the running fp32
accumulator the way the modelled hardware does. Where a published bit-accurate model exists (microsoft/MMA-Sim, PyPI
``mmasim``; Khattak & Mikaitis 2025) the model here is written to agree with it bit for bit, and
``benchmarks/mma_vs_mmasim.py`` measures that agreement. RDNA3/3.5 WMMA has no published model: the ``rdna3_hyp_*``
models are named hypotheses whose parameters are stated in their descriptions.

NaN results are returned as the quiet NaN 0x7FFFFFFF by every model (NaN payloads are not modelled; mmasim's
fused models return the same NaN, its FMA and FTZ models whatever the host CPU produces).

Operands are bf16 by default. ``dot(..., input_type="tf32" | "fp32")`` routes fp32 dots to the unit's tf32 model
(Hopper, Ampere, CDNA3 xf32; validated against mmasim too) or to an fp32 FMA chain (:data:`FP32_FMA`), see
:meth:`MMAModel.for_inputs`.

Arithmetic is vectorised numpy. Products of two bf16 (or tf32, or fp32) values are exact in float64 (16, 22 or 48
significant bits), and every intermediate below is a dyadic number whose significand fits in 53 bits, so float64
holds it exactly; scaling by a power of two is exact because no intermediate leaves float64's normal range. Rounding steps are done explicitly:

* truncation (toward zero) and floor (toward minus infinity) to a fixed number of fractional bits relative to an
  alignment exponent: ``trunc(x * 2**(F - e)) * 2**(e - F)``;
* round-toward-zero to fp32: round to nearest with numpy's float64 -> float32 cast, then step one ulp toward zero
  where that moved the magnitude up;
* round-to-nearest-even of an exact sum ``s + err`` (TwoSum) to fp32: round to odd in float64, then cast (53 >= 24 + 2
  bits, so the double rounding is innocuous).

Notation used in descriptions: a term's exponent ``e`` is that of the normalised significand in [1, 2) for each bf16
or fp32 operand (subnormals take the minimum normal exponent, -126, with a significand below 1); a product's
exponent is ``e_a + e_b`` (its significand then lies in [0, 4)). MMA-Sim's own models are the authority for the
NVIDIA and AMD CDNA arithmetic; this module re-derives them in numpy (no code copied).

Public names: :class:`MMAModel` and its subclasses, :data:`MODELS`, :data:`FP32_FMA`, :func:`get_model`,
:func:`bit_exact_fraction`, :func:`to_bf16`, :func:`random_tiles`, :func:`tile_kinds`, :func:`hardware_check_tiles`,
:data:`TILE_KINDS`, :data:`HARDWARE_KINDS`, :data:`MMASIM_TARGETS`, :func:`mmasim_dot` and :func:`mmasim_call` (these
two import ``mmasim`` lazily; only tests and benchmarks use them).
"""
from __future__ import annotations

import numpy as np

__all__ = [
    "MMAModel",
    "SequentialFMA",
    "TruncatedFusedDot",
    "CDNA3FusedDot",
    "PairwiseFP32Add",
    "MODELS",
    "FP32_FMA",
    "get_model",
    "bit_exact_fraction",
    "to_bf16",
    "random_tiles",
    "tile_kinds",
    "hardware_check_tiles",
    "TILE_KINDS",
    "HARDWARE_KINDS",
    "MMASIM_TARGETS",
    "mmasim_dot",
    "mmasim_call",
]

_F32_EMIN = -126  # smallest normal fp32 (and bf16) exponent
_ZERO_EXP = -2000  # exponent given to zero operands so that zero products never set a maximum
_TWO128 = 2.0**128
_CANON_NAN_BITS = np.uint32(0x7FFFFFFF)  # the NaN mmasim returns
_LOW_BITS = {"bf16": np.uint32(0xFFFF), "tf32": np.uint32(0x1FFF), "fp32": np.uint32(0)}  # bits that must be 0


# ----------------------------------------------------------------------------------------------------------------
# small bit-level helpers


def _exponents(x32: np.ndarray, zero_exp: int) -> np.ndarray:
    """Unbiased exponent of each float32 element (subnormals -> -126, zeros -> ``zero_exp``), as int32."""
    bits = x32.view(np.uint32)
    field = ((bits >> np.uint32(23)) & np.uint32(0xFF)).astype(np.int32)
    e = np.where(field == 0, _F32_EMIN, field - 127)
    return np.where((bits & np.uint32(0x7FFFFFFF)) == 0, zero_exp, e).astype(np.int32)


def _pow2(e: np.ndarray) -> np.ndarray:
    """2.0**e for an integer array (exact; |e| stays far inside float64's range here)."""
    return np.ldexp(1.0, e.astype(np.int32))


def _rz_to_f32(v: np.ndarray) -> np.ndarray:
    """Round float64 values toward zero to fp32 (subnormals included); |v| >= 2**128 -> +-inf as mmasim does."""
    with np.errstate(over="ignore", invalid="ignore"):
        f = v.astype(np.float32)
        up = np.abs(f.astype(np.float64)) > np.abs(v)
        f = np.where(up, np.nextafter(f, np.float32(0)), f)
        f = np.where(np.abs(v) >= _TWO128, np.copysign(np.float32(np.inf), v).astype(np.float32), f)
    return f.astype(np.float32)


def _canonical_nan(x32: np.ndarray) -> np.ndarray:
    """Replace every NaN by the quiet NaN 0x7FFFFFFF."""
    bits = x32.view(np.uint32).copy()
    bits[np.isnan(x32)] = _CANON_NAN_BITS
    return bits.view(np.float32)


def to_bf16(x: np.ndarray) -> np.ndarray:
    """Round float32/float64 values to the nearest bf16 (ties to even); returned as float32."""
    x32 = np.asarray(x, dtype=np.float32)
    bits = x32.view(np.uint32).astype(np.uint64)
    rounded = (bits + np.uint64(0x7FFF) + ((bits >> np.uint64(16)) & np.uint64(1))) & np.uint64(0xFFFF0000)
    out = rounded.astype(np.uint32)
    nan = np.isnan(x32)
    out[nan] = (x32.view(np.uint32)[nan] | np.uint32(0x00400000)) & np.uint32(0xFFFF0000)
    return out.view(np.float32).reshape(x32.shape)


def _is_bf16(x32: np.ndarray) -> bool:
    return not np.any(x32.view(np.uint32) & np.uint32(0xFFFF))


def bit_exact_fraction(x: np.ndarray, y: np.ndarray, nan_equal: bool = False) -> float:
    """Fraction of elements of two float32 arrays whose bit patterns are identical.

    ``+0`` and ``-0`` differ. With ``nan_equal`` any two NaNs count as equal whatever their payloads.
    """
    x32 = np.ascontiguousarray(x, dtype=np.float32)
    y32 = np.ascontiguousarray(y, dtype=np.float32)
    if x32.shape != y32.shape:
        raise ValueError(f"shapes differ: {x32.shape} vs {y32.shape}")
    if x32.size == 0:
        return 1.0
    same = x32.view(np.uint32) == y32.view(np.uint32)
    if nan_equal:
        same |= np.isnan(x32) & np.isnan(y32)
    return float(np.mean(same))


# ----------------------------------------------------------------------------------------------------------------
# the models


class MMAModel:
    """A matrix-unit model: ``dot(a, b, c)`` returns fp32 ``a @ b + c`` computed as the modelled hardware does.

    Attributes: ``name``; ``description`` (the arithmetic, with its parameters); ``k_block`` (products fused per
    step: K is walked in order in blocks of this size, the last block may be shorter); ``mmasim`` (the mmasim
    architecture and instruction the model is validated against, or None); ``equivalent_to`` (the name of a model
    with identical arithmetic, or None); ``tf32`` (the model of the unit's tf32 path, or None); ``input_type`` (the
    operand type the model is for: "bf16", or "tf32" for the tf32 models).
    """

    name: str
    description: str
    k_block: int
    mmasim: tuple[str, str] | None = None
    equivalent_to: str | None = None
    tf32: MMAModel | None = None
    input_type: str = "bf16"

    def dot(self, a: np.ndarray, b: np.ndarray, c: np.ndarray, input_type: str = "bf16") -> np.ndarray:
        """``D = a @ b + c``: a ``[..., M, K]`` and b ``[..., K, N]`` float32, c ``[..., M, N]`` float32; leading batch
        dimensions broadcast. Returns float32 ``[..., M, N]``; inputs are not modified.

        ``input_type`` says what the operands are on the device: ``"bf16"`` (the default: the values must be
        bf16-representable; the model's own arithmetic), ``"tf32"`` (values must be tf32-representable; the unit's
        tf32 path where it has one, see :meth:`for_inputs`) or ``"fp32"`` (an fp32 FMA chain).
        """
        a32 = np.asarray(a, dtype=np.float32)
        b32 = np.asarray(b, dtype=np.float32)
        c32 = np.asarray(c, dtype=np.float32)
        if a32.ndim < 2 or b32.ndim < 2 or c32.ndim < 2:
            raise ValueError("a, b and c must be at least 2-D")
        if a32.shape[-1] != b32.shape[-2]:
            raise ValueError(f"a is [..., M, K] and b [..., K, N]: got {a32.shape} and {b32.shape}")
        if c32.shape[-2:] != (a32.shape[-2], b32.shape[-1]):
            raise ValueError(f"c must be [..., {a32.shape[-2]}, {b32.shape[-1]}], got {c32.shape}")
        if input_type not in _LOW_BITS:
            raise ValueError(f"input_type must be one of {sorted(_LOW_BITS)}, got {input_type!r}")
        for name, x in (("a", a32), ("b", b32)):
            if np.any(x.view(np.uint32) & _LOW_BITS[input_type]):
                raise ValueError(f"{name} holds values that are not {input_type}-representable")
        batch = np.broadcast_shapes(a32.shape[:-2], b32.shape[:-2], c32.shape[:-2])
        a32 = np.broadcast_to(a32, batch + a32.shape[-2:])
        b32 = np.broadcast_to(b32, batch + b32.shape[-2:])
        c32 = np.array(np.broadcast_to(c32, batch + c32.shape[-2:]), dtype=np.float32)
        if a32.shape[-1] == 0:
            return c32
        return self.for_inputs(input_type)._dot(a32, b32, c32)

    def for_inputs(self, input_type: str) -> MMAModel:
        """The model that computes this unit's dots on ``input_type`` operands: itself for its own operand type
        (``self.input_type``; an FMA chain takes any); for ``"tf32"`` its ``tf32`` model where the unit has a tf32
        path (NVIDIA tensor cores, CDNA3 xf32), else the fp32 FMA chain; the fp32 FMA chain for ``"fp32"`` (how
        Triton compiles ``input_precision="ieee"`` fp32 dots for NVIDIA and RDNA, and how CDNA computes fp32 MFMA)."""
        if input_type not in _LOW_BITS:
            raise ValueError(f"input_type must be one of {sorted(_LOW_BITS)}, got {input_type!r}")
        if input_type == self.input_type or isinstance(self, SequentialFMA):
            return self
        if input_type == "tf32" and self.tf32 is not None:
            return self.tf32
        if input_type in ("tf32", "fp32"):
            return FP32_FMA
        raise ValueError(f"model {self.name!r} computes {self.input_type} operands, not {input_type}")

    def _dot(self, a32: np.ndarray, b32: np.ndarray, c32: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _blocks(self, k: int) -> list[tuple[int, int]]:
        return [(k0, min(k0 + self.k_block, k)) for k0 in range(0, k, self.k_block)]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, k_block={self.k_block})"


class SequentialFMA(MMAModel):
    """One product at a time: ``c = RNE_fp32(c + a_k * b_k)`` with the product exact (an fp32 FMA chain)."""

    def __init__(self, name: str, description: str, mmasim: tuple[str, str] | None = None,
                 equivalent_to: str | None = None) -> None:
        self.name, self.description, self.k_block = name, description, 1
        self.mmasim, self.equivalent_to = mmasim, equivalent_to

    def _dot(self, a32: np.ndarray, b32: np.ndarray, c32: np.ndarray) -> np.ndarray:
        k = a32.shape[-1]
        finite = np.isfinite(a32).all() and np.isfinite(b32).all() and _is_bf16(a32) and _is_bf16(b32)
        amax, bmax = (float(np.abs(x).max()) if finite else np.inf for x in (a32, b32))
        anz, bnz = (np.abs(x[x != 0]) for x in (a32, b32))
        amin = float(anz.min()) if anz.size else 1.0
        bmin = float(bnz.min()) if bnz.size else 1.0
        # bf16 values with every product exact in fp32 (< 2**127 and a multiple of 2**-149)? Then c + fl32(p) is
        # the FMA. Otherwise (fp32 values too): exact float64 products, TwoSum, round to odd, round to fp32.
        if finite and amax * bmax < 2.0**127 and amin * bmin >= 2.0**-133:
            c = c32.copy()
            with np.errstate(invalid="ignore", over="ignore"):
                for i in range(k):
                    c += a32[..., :, i, None] * b32[..., None, i, :]
            return _canonical_nan(c)
        a64, b64 = a32.astype(np.float64), b32.astype(np.float64)
        c = c32
        with np.errstate(invalid="ignore", over="ignore"):
            for i in range(k):
                c64 = c.astype(np.float64)
                p = a64[..., :, i, None] * b64[..., None, i, :]
                s = c64 + p
                t = s - c64
                err = (c64 - (s - t)) + (p - t)  # TwoSum: c64 + p == s + err exactly
                bits = s.view(np.int64)
                fix = np.isfinite(s) & (err != 0) & ((bits & 1) == 0)
                step = np.where((s > 0) == (err > 0), 1, -1)
                s = (bits + np.where(fix, step, 0)).view(np.float64)  # round to odd
                c = s.astype(np.float32)
        return _canonical_nan(c)


class TruncatedFusedDot(MMAModel):
    """NVIDIA-style fused dot (MMA-Sim's T-FDPA), one step per block of ``k_block`` products.

    Per step: the products (exact) and C are aligned to the largest exponent ``e_max`` among them (a zero product
    or a zero C counts with exponent ``e_zero``), each term is truncated toward zero to ``F`` fractional bits below
    ``2**e_max``, the truncated terms are summed exactly, and the sum is rounded toward zero to fp32 (subnormals
    kept; magnitudes >= 2**128 give inf; a zero result is +0). Non-finite inputs give the IEEE sum (inf or NaN,
    NaN as 0x7FFFFFFF).
    """

    def __init__(self, name: str, description: str, k_block: int, F: int, e_zero: int,
                 mmasim: tuple[str, str] | None = None, equivalent_to: str | None = None) -> None:
        self.name, self.description, self.k_block = name, description, k_block
        self.F, self.e_zero = F, e_zero
        self.mmasim, self.equivalent_to = mmasim, equivalent_to

    def _dot(self, a32: np.ndarray, b32: np.ndarray, c32: np.ndarray) -> np.ndarray:
        a64 = a32.astype(np.float64)
        bt32 = np.swapaxes(b32, -1, -2)
        bt64 = bt32.astype(np.float64)
        ea, eb = _exponents(a32, _ZERO_EXP), _exponents(bt32, _ZERO_EXP)
        special_inputs = not (np.isfinite(a32).all() and np.isfinite(b32).all())
        c = c32
        with np.errstate(invalid="ignore", over="ignore"):
            for k0, k1 in self._blocks(a32.shape[-1]):
                p = a64[..., :, None, k0:k1] * bt64[..., None, :, k0:k1]
                e_prod = (ea[..., :, None, k0:k1] + eb[..., None, :, k0:k1]).max(axis=-1)
                e_c = _exponents(c, self.e_zero)
                e_max = np.maximum(e_prod, e_c)
                scale = _pow2(self.F - e_max)
                c64 = c.astype(np.float64)
                total = np.trunc(p * scale[..., None]).sum(axis=-1) + np.trunc(c64 * scale)
                d = _rz_to_f32(total / scale) + np.float32(0.0)
                if special_inputs or not np.isfinite(c).all():
                    naive = p.sum(axis=-1) + c64
                    bad = ~np.isfinite(naive)
                    d = np.where(bad, naive.astype(np.float32), d)
                c = _canonical_nan(d.astype(np.float32))
        return c


class CDNA3FusedDot(MMAModel):
    """AMD CDNA3 (MI300, gfx942) bf16 MFMA step (MMA-Sim's TR-FDPA with F=24, F2=31), per block of 8 products.

    Per step: a product whose magnitude is >= 2**128 becomes inf; the products are aligned to their largest exponent
    ``e_dot``, truncated toward zero to ``F`` fractional bits and summed exactly; with ``e_max = max(e_dot, e_c)``
    (a zero C has exponent -126) the product sum is rounded toward minus infinity to ``F2 + 1`` fractional bits below
    ``2**e_max`` and C to ``F`` bits; the two are added exactly, the sum is normalised (fp32 subnormal range kept)
    and rounded toward minus infinity to ``F2`` fractional bits, and that is rounded to nearest-even fp32.
    Non-finite inputs or overflowing products give the IEEE sum (inf or NaN, NaN as 0x7FFFFFFF).
    """

    def __init__(self, name: str, description: str, k_block: int = 8, F: int = 24, F2: int = 31,
                 mmasim: tuple[str, str] | None = None, equivalent_to: str | None = None) -> None:
        self.name, self.description, self.k_block = name, description, k_block
        self.F, self.F2 = F, F2
        self.mmasim, self.equivalent_to = mmasim, equivalent_to

    def _dot(self, a32: np.ndarray, b32: np.ndarray, c32: np.ndarray) -> np.ndarray:
        F, F2 = self.F, self.F2
        a64 = a32.astype(np.float64)
        bt32 = np.swapaxes(b32, -1, -2)
        bt64 = bt32.astype(np.float64)
        ea, eb = _exponents(a32, _ZERO_EXP), _exponents(bt32, _ZERO_EXP)
        finite_ab = np.isfinite(a32).all() and np.isfinite(b32).all()
        may_overflow = not finite_ab or float(np.abs(a32).max()) * float(np.abs(b32).max()) >= _TWO128
        c = c32
        with np.errstate(invalid="ignore", over="ignore"):
            for k0, k1 in self._blocks(a32.shape[-1]):
                p = a64[..., :, None, k0:k1] * bt64[..., None, :, k0:k1]
                # all-zero blocks: any exponent works (the sum is 0); clamp keeps the scale finite
                e_dot = np.maximum((ea[..., :, None, k0:k1] + eb[..., None, :, k0:k1]).max(axis=-1), -400)
                s_dot = np.trunc(p * _pow2(F - e_dot)[..., None]).sum(axis=-1) + 0.0  # units of 2**(e_dot-F)
                e_c = _exponents(c, _F32_EMIN)
                e_max = np.maximum(e_dot, e_c)
                c64 = c.astype(np.float64)
                d_part = np.floor(s_dot * _pow2(e_dot - F + F2 + 1 - e_max))  # units of 2**(e_max-F2-1)
                c_part = np.floor(c64 * _pow2(F - e_max))  # units of 2**(e_max-F)
                x = (d_part * 2.0 ** -(F2 + 1) + c_part * 2.0**-F) * _pow2(e_max)
                _, ex = np.frexp(x)
                e_x = np.maximum(ex - 1, _F32_EMIN)
                q = _pow2(F2 - e_x)
                d = (np.floor(x * q) / q).astype(np.float32)
                if may_overflow or not np.isfinite(c).all():
                    p_inf = np.where(np.abs(p) >= _TWO128, np.copysign(np.inf, p), p)
                    naive = p_inf.sum(axis=-1) + c64
                    d = np.where(np.isfinite(naive), d, naive.astype(np.float32))
                c = _canonical_nan(d.astype(np.float32))
        return c


class PairwiseFP32Add(MMAModel):
    """Products rounded to fp32, then a tree of fp32 round-to-nearest-even additions per block, added to C.

    ``k_block`` is 2 (``c + (p0 + p1)``) or 4 (``c + ((p0 + p1) + (p2 + p3))``). With ``ftz`` (AMD CDNA2, MMA-Sim's
    FTZ_MUL_ADD) subnormal inputs are flushed to +0, every subnormal product or sum to a zero of its sign, and C to
    +0 at the start of every instruction of ``instr_k`` products (which only turns a -0 accumulator into +0 there).
    ``instr_k="auto"`` follows the instruction Triton picks for CDNA2 bf16: 32x32x8 (K = 8) when the output tile
    has M, N >= 32, else 16x16x16 (K = 16). A K that is not a multiple of ``k_block`` is padded with +0 products.
    """

    def __init__(self, name: str, description: str, k_block: int, ftz: bool, instr_k: int | str = "auto",
                 mmasim: tuple[str, str] | None = None, equivalent_to: str | None = None) -> None:
        if k_block not in (2, 4):
            raise ValueError("k_block must be 2 or 4")
        self.name, self.description, self.k_block, self.ftz = name, description, k_block, ftz
        self.instr_k = instr_k
        self.mmasim, self.equivalent_to = mmasim, equivalent_to

    def _flush(self, x: np.ndarray, keep_sign: bool) -> np.ndarray:
        if not self.ftz:
            return x
        zero = x * np.float32(0.0) if keep_sign else np.zeros_like(x)
        return np.where(np.abs(x) < np.float32(2.0**_F32_EMIN), zero, x).astype(np.float32)

    def _dot(self, a32: np.ndarray, b32: np.ndarray, c32: np.ndarray) -> np.ndarray:
        k, P = a32.shape[-1], self.k_block
        instr_k = self.instr_k
        if instr_k == "auto":
            instr_k = 8 if min(c32.shape[-2:]) >= 32 else 16
        with np.errstate(invalid="ignore", over="ignore"):
            a = self._flush(a32, keep_sign=False)
            b = self._flush(b32, keep_sign=False)
            c = c32
            kp = -(-k // P) * P
            prod = np.zeros((kp,) + c.shape, dtype=np.float32)  # K first: prod[i] is a contiguous [..., M, N]
            prod[:k] = np.moveaxis(a, -1, 0)[..., :, None] * np.moveaxis(b, -2, 0)[..., None, :]
            flush = self._flush
            if self.ftz:
                # Nonzero products and C all >= 2**-103 (ulp >= 2**-126): every sum is a multiple of 2**-126, so
                # nothing can become subnormal and only the -0 -> +0 of C at instruction starts remains.
                nz_p, nz_c = np.abs(prod[prod != 0]), np.abs(c[c != 0])
                if (nz_p.size == 0 or nz_p.min() >= 2.0**-103) and (nz_c.size == 0 or nz_c.min() >= 2.0**-103):
                    def flush(x: np.ndarray, keep_sign: bool) -> np.ndarray:
                        return x if keep_sign else x + np.float32(0.0)
            prod = flush(prod, keep_sign=True)
            for k0 in range(0, kp, P):
                if k0 % int(instr_k) == 0:
                    c = flush(c, keep_sign=False)
                s = flush(prod[k0] + prod[k0 + 1], keep_sign=True)
                if P == 4:
                    s2 = flush(prod[k0 + 2] + prod[k0 + 3], keep_sign=True)
                    s = flush(s + s2, keep_sign=True)
                c = flush(c + s, keep_sign=True)
        return _canonical_nan(np.asarray(c, dtype=np.float32))


def _build_models() -> dict[str, MMAModel]:
    models: list[MMAModel] = [
        SequentialFMA(
            "ideal",
            "Reference: exact bf16 products accumulated one at a time in fp32 with round-to-nearest-even "
            "(c = RNE_fp32(c + a_k*b_k) for k = 0..K-1, an FMA chain), subnormals kept. k_block = 1.",
            mmasim=("CDNA3", "v_mfma_f32_16x16x4_f32 (fp32 FMA chain, fed bf16 values)"),
        ),
        TruncatedFusedDot(
            "hopper",
            "NVIDIA sm_90 (H100/H200) bf16 wgmma/mma with fp32 accumulate: per step 16 exact products plus C in one "
            "fused sum, aligned to the largest exponent (zero terms count as exponent -133), each term truncated "
            "to 25 fractional bits, sum rounded toward zero to fp32. k_block = 16, F = 25, e_zero = -133.",
            k_block=16, F=25, e_zero=-133, mmasim=("Hopper", "wgmma m64n8k16.f32.bf16.bf16; mma m16n8k16"),
        ),
        TruncatedFusedDot(
            "ampere",
            "NVIDIA sm_80/sm_86/sm_89 bf16 mma with fp32 accumulate: per step 8 exact products plus C in one fused "
            "sum, aligned to the largest exponent (zero terms count as exponent -132), each term truncated to 24 "
            "fractional bits, sum rounded toward zero to fp32. k_block = 8, F = 24, e_zero = -132.",
            k_block=8, F=24, e_zero=-132, mmasim=("Ampere", "mma m16n8k16.f32.bf16.bf16.f32"),
        ),
        CDNA3FusedDot(
            "cdna3",
            "AMD CDNA3 (MI300, gfx942) v_mfma_f32_*_bf16: per step 8 exact products aligned to their largest "
            "exponent and truncated to 24 fractional bits, summed; combined with C (C floored to 24 bits, the "
            "product sum floored to 32 bits, both below the larger exponent), the sum floored to 31 fractional bits, "
            "then rounded to nearest-even fp32; products >= 2**128 become inf. k_block = 8, F = 24, F2 = 31.",
            k_block=8, F=24, F2=31, mmasim=("CDNA3", "v_mfma_f32_32x32x8_bf16; v_mfma_f32_16x16x16_bf16"),
        ),
        PairwiseFP32Add(
            "cdna2",
            "AMD CDNA2 (MI200, gfx90a) v_mfma_f32_*bf16_1k: subnormal inputs and C flushed to +0, products in fp32, "
            "per step of 4 products c + ((p0 + p1) + (p2 + p3)) with each addition fp32 round-to-nearest-even and "
            "every subnormal product or sum flushed to a signed zero, C flushed to +0 at the start of each "
            "instruction (K = 8 for output tiles with M, N >= 32, else 16). k_block = 4.",
            k_block=4, ftz=True, mmasim=("CDNA2", "v_mfma_f32_32x32x8bf16_1k; v_mfma_f32_16x16x16bf16_1k"),
        ),
        SequentialFMA(
            "rdna3_hyp_fp32seq",
            "HYPOTHESIS for RDNA3/3.5 WMMA (gfx11xx, e.g. gfx1151 v_wmma_f32_16x16x16_bf16), no public model: the "
            "unit behaves like a chain of fp32 FMAs, exact products, round-to-nearest-even after every product, "
            "subnormals kept. k_block = 1. Same arithmetic as 'ideal'.",
            equivalent_to="ideal",
        ),
        PairwiseFP32Add(
            "rdna3_hyp_dot2",
            "HYPOTHESIS for RDNA3/3.5 WMMA, no public model: built from v_dot2-style steps: products rounded to "
            "fp32, c = RNE_fp32(c + RNE_fp32(p0 + p1)) per pair, subnormals kept (no flush). k_block = 2.",
            k_block=2, ftz=False,
        ),
        TruncatedFusedDot(
            "rdna3_hyp_trunc16",
            "HYPOTHESIS for RDNA3/3.5 WMMA, no public model: one fused step per 16 products (the full K of "
            "v_wmma_f32_16x16x16_bf16) plus C, aligned to the largest exponent (zero terms count as exponent -132), "
            "each term truncated to 24 fractional bits, sum rounded toward zero to fp32. "
            "k_block = 16, F = 24, e_zero = -132.",
            k_block=16, F=24, e_zero=-132,
        ),
    ]
    by_name = {m.name: m for m in models}
    by_name["hopper"].tf32 = TruncatedFusedDot(
        "hopper_tf32",
        "NVIDIA sm_90 tf32 wgmma/mma with fp32 accumulate: as 'hopper' with 8 products per step. "
        "k_block = 8, F = 25, e_zero = -133.",
        k_block=8, F=25, e_zero=-133, mmasim=("Hopper", "wgmma m64n8k8.f32.tf32.tf32; mma m16n8k8"),
    )
    by_name["hopper"].tf32.input_type = "tf32"
    by_name["ampere"].tf32 = TruncatedFusedDot(
        "ampere_tf32",
        "NVIDIA sm_80 tf32 mma with fp32 accumulate: as 'ampere' with 4 products per step. "
        "k_block = 4, F = 24, e_zero = -132.",
        k_block=4, F=24, e_zero=-132, mmasim=("Ampere", "mma m16n8k8.f32.tf32.tf32.f32"),
    )
    by_name["ampere"].tf32.input_type = "tf32"
    by_name["cdna3"].tf32 = CDNA3FusedDot(
        "cdna3_xf32",
        "AMD CDNA3 v_mfma_f32_*_xf32: as 'cdna3' with 4 products per step. k_block = 4, F = 24, F2 = 31.",
        k_block=4, F=24, F2=31, mmasim=("CDNA3", "v_mfma_f32_16x16x8_xf32"),
    )
    by_name["cdna3"].tf32.input_type = "tf32"
    return by_name


FP32_FMA: MMAModel = SequentialFMA(
    "fp32_fma",
    "fp32 (or tf32) operands on a unit without a tf32 path: an fp32 FMA chain, c = RNE_fp32(c + a_k*b_k) with the "
    "product exact, k = 0..K-1 (CDNA fp32 MFMA; Triton's input_precision='ieee' fp32 dots). k_block = 1.",
    mmasim=("CDNA3", "v_mfma_f32_16x16x4_f32"),
)
MODELS: dict[str, MMAModel] = _build_models()


def get_model(name: str | MMAModel) -> MMAModel:
    """The model called ``name`` (a model passes through); ValueError lists the names for an unknown one."""
    if isinstance(name, MMAModel):
        return name
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown MMA model {name!r}; known: {sorted(MODELS)}") from None


# ----------------------------------------------------------------------------------------------------------------
# random instruction tiles, hard cases included

TILE_KINDS: tuple[str, ...] = (
    "normal",     # randn operands rounded to bf16, randn C
    "uniform",    # random bf16 bit patterns, exponents in [-6, 6]; C with full 24-bit significands
    "spread",     # exponents over [-40, 40] (C over [-60, 60]): alignment shifts terms far out
    "cancel",     # products in +- pairs (one bf16 ulp apart at times), C often -(A·B): catastrophic cancellation
    "big_c",      # |C| in [2**16, 2**41) against products below 1
    "small_c",    # |C| in [2**-60, 2**-29) against products near 1
    "subnormal",  # bf16 subnormal inputs, fp32 subnormal C, products and results in the subnormal range
    "ties",       # integer products onto C = +-(2**24 + even): half-ulp ties, scaled by 2**r
    "zeros",      # half the operands +-0, C +-0 or tiny: zero-term exponent and signed-zero rules
    "overflow",   # products up to 2**127 and C near fp32 max: results beyond fp32's range or cancelling back
    "specials",   # inf and NaN sprinkled into A, B and C
)
HARDWARE_KINDS: tuple[str, ...] = tuple(k for k in TILE_KINDS if k != "specials")


def _rand_bf16(rng: np.random.Generator, shape: tuple[int, ...], emin: int, emax: int) -> np.ndarray:
    """Random bf16 values (as float32): random sign and 7-bit mantissa, exponent uniform in [emin, emax];
    exponents below -126 give subnormals (random nonzero 7-bit significand)."""
    sign = rng.integers(0, 2, shape).astype(np.uint32) << np.uint32(31)
    e = rng.integers(emin, emax + 1, shape)
    mant = rng.integers(0, 128, shape).astype(np.uint32)
    field = np.clip(e + 127, 0, 254).astype(np.uint32)
    sub = e < _F32_EMIN
    mant = np.where(sub, rng.integers(1, 128, shape).astype(np.uint32) >> np.minimum(-_F32_EMIN - e, 6).astype(
        np.uint32), mant)
    mant = np.where(sub & (mant == 0), 1, mant).astype(np.uint32)
    bits = sign | (field << np.uint32(23)) | (mant << np.uint32(16))
    return bits.view(np.float32)


def _rand_f32(rng: np.random.Generator, shape: tuple[int, ...], emin: int, emax: int) -> np.ndarray:
    """Random fp32 values with full 23-bit mantissas, exponent uniform in [emin, emax] (< -126: subnormals)."""
    sign = rng.integers(0, 2, shape).astype(np.uint32) << np.uint32(31)
    e = rng.integers(emin, emax + 1, shape)
    mant = rng.integers(0, 1 << 23, shape).astype(np.uint32)
    sub = e < _F32_EMIN
    mant = np.where(sub, (mant | np.uint32(1 << 22)) >> np.minimum(-_F32_EMIN - e, 22).astype(np.uint32), mant)
    field = np.where(sub, 0, np.clip(e + 127, 1, 254)).astype(np.uint32)
    bits = sign | (field << np.uint32(23)) | mant.astype(np.uint32)
    return bits.view(np.float32)


def _widen(x: np.ndarray, input_type: str) -> np.ndarray:
    """bf16 values given the extra mantissa bits of ``input_type`` (tf32: 3 more, fp32: 16 more), chosen by a hash of
    the magnitude so that equal and opposite values stay equal and opposite; zeros, inf and NaN unchanged."""
    if input_type == "bf16":
        return x
    bits = x.view(np.uint32)
    mag = (bits >> np.uint32(16)) & np.uint32(0x7FFF)
    low = ((mag * np.uint32(0x9E3779B1)) >> np.uint32(13)) & np.uint32(0xFFFF) & ~_LOW_BITS[input_type]
    keep = (mag == 0) | ~np.isfinite(x)
    return np.where(keep, bits, bits | low).astype(np.uint32).view(np.float32)


def _signed_zeros(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return np.where(rng.integers(0, 2, shape) == 1, np.float32(-0.0), np.float32(0.0)).astype(np.float32)


def _exact_dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.matmul(a.astype(np.float64), b.astype(np.float64))


def _kind_tiles(kind: str, rng: np.random.Generator, t: int, m: int, k: int, n: int, input_type: str = "bf16"
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``t`` tiles of one kind; A and B hold ``input_type`` values (bf16 patterns widened by :func:`_widen`)."""
    sa, sb, sc = (t, m, k), (t, k, n), (t, m, n)

    def w(x: np.ndarray) -> np.ndarray:
        return _widen(np.asarray(x, dtype=np.float32), input_type)

    if kind == "normal":
        return w(to_bf16(rng.standard_normal(sa))), w(to_bf16(rng.standard_normal(sb))), \
            rng.standard_normal(sc).astype(np.float32)
    if kind == "uniform":
        return w(_rand_bf16(rng, sa, -6, 6)), w(_rand_bf16(rng, sb, -6, 6)), _rand_f32(rng, sc, -4, 8)
    if kind == "spread":
        return w(_rand_bf16(rng, sa, -40, 40)), w(_rand_bf16(rng, sb, -40, 40)), _rand_f32(rng, sc, -60, 60)
    if kind == "cancel":
        a = w(_rand_bf16(rng, sa, -4, 4))
        b = w(_rand_bf16(rng, sb, -4, 4))
        if k >= 2:
            a[:, :, 1::2] = a[:, :, 0:(k // 2) * 2:2]
            nb = -b[:, 0:(k // 2) * 2:2, :]
            bump = rng.integers(-1, 2, nb.shape).astype(np.int32) * (rng.random(nb.shape) < 0.3)
            nbits = nb.view(np.uint32).astype(np.int64) + bump * 0x10000
            b[:, 1::2, :] = nbits.astype(np.uint32).view(np.float32)
        choice = rng.integers(0, 3, sc)
        c = np.where(choice == 0, _signed_zeros(rng, sc),
                     np.where(choice == 1, _rand_f32(rng, sc, -24, -8),
                              (-_exact_dot(a, b)).astype(np.float32)))
        return a, b, c.astype(np.float32)
    if kind == "big_c":
        return w(_rand_bf16(rng, sa, -8, 0)), w(_rand_bf16(rng, sb, -8, 0)), _rand_f32(rng, sc, 16, 40)
    if kind == "small_c":
        return w(_rand_bf16(rng, sa, -4, 4)), w(_rand_bf16(rng, sb, -4, 4)), _rand_f32(rng, sc, -60, -30)
    if kind == "subnormal":
        a = _rand_bf16(rng, sa, -134, -124)
        b = np.where(rng.random(sb) < 0.05, _rand_bf16(rng, sb, 0, 12), _rand_bf16(rng, sb, -12, -1))
        c = np.where(rng.random(sc) < 0.7, _rand_f32(rng, sc, -149, -127), _signed_zeros(rng, sc))
        return w(a), w(b), c.astype(np.float32)
    if kind == "ties":  # small integers times 2**r: exact in every input type, not widened
        r = rng.integers(-10, 11, (t, 1, 1))
        scale = np.ldexp(1.0, r)
        a = (rng.integers(-16, 17, sa) * scale).astype(np.float32)
        b = rng.integers(-16, 17, sb).astype(np.float32)
        c = (np.where(rng.integers(0, 2, sc) == 1, -1.0, 1.0)
             * (2.0**24 + 2.0 * rng.integers(0, 1 << 22, sc)) * scale).astype(np.float32)
        return a, b, c
    if kind == "zeros":
        a = np.where(rng.random(sa) < 0.5, _signed_zeros(rng, sa), _rand_bf16(rng, sa, -80, -50))
        b = np.where(rng.random(sb) < 0.5, _signed_zeros(rng, sb), _rand_bf16(rng, sb, -80, -50))
        u = rng.random(sc)
        c = np.where(u < 0.4, _signed_zeros(rng, sc),
                     np.where(u < 0.7, _rand_f32(rng, sc, -149, -127), _rand_f32(rng, sc, -130, -100)))
        return w(a), w(b), c.astype(np.float32)
    if kind == "overflow":
        return w(_rand_bf16(rng, sa, 52, 64)), w(_rand_bf16(rng, sb, 52, 64)), _rand_f32(rng, sc, 118, 127)
    if kind == "specials":
        a, b, c = _kind_tiles("normal", rng, t, m, k, n, input_type)
        specials = np.array([np.inf, -np.inf, np.nan], dtype=np.float32)
        for x in (a, b, c):
            hit = rng.random(x.shape) < 0.02
            x[hit] = specials[rng.integers(0, 3, int(hit.sum()))]
        return a, b, c
    raise ValueError(f"unknown tile kind {kind!r}; known: {TILE_KINDS}")


def tile_kinds(n: int, kinds: tuple[str, ...] = TILE_KINDS) -> list[str]:
    """The kind of each of ``n`` tiles drawn by :func:`random_tiles` with these ``kinds``: tile i is
    ``kinds[i % len(kinds)]``."""
    return [kinds[i % len(kinds)] for i in range(n)]


def random_tiles(n: int, m: int, k: int, cols: int, seed: int = 0, kinds: tuple[str, ...] = TILE_KINDS,
                 input_type: str = "bf16") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` random tiles ``a [n, m, k]``, ``b [n, k, cols]`` (float32 holding ``input_type`` values: bf16, tf32 or
    fp32) and ``c [n, m, cols]`` (float32); tile i is of kind ``kinds[i % len(kinds)]`` (see :data:`TILE_KINDS`).
    Deterministic in ``seed``."""
    if n < 0 or min(m, k, cols) < 1:
        raise ValueError("n must be >= 0 and m, k, cols >= 1")
    if input_type not in _LOW_BITS:
        raise ValueError(f"input_type must be one of {sorted(_LOW_BITS)}, got {input_type!r}")
    for kind in kinds:
        if kind not in TILE_KINDS:
            raise ValueError(f"unknown tile kind {kind!r}; known: {TILE_KINDS}")
    a = np.zeros((n, m, k), np.float32)
    b = np.zeros((n, k, cols), np.float32)
    c = np.zeros((n, m, cols), np.float32)
    labels = np.array(tile_kinds(n, kinds), dtype=object)
    for j, kind in enumerate(kinds):
        idx = np.nonzero(labels == kind)[0]
        if idx.size == 0:
            continue
        rng = np.random.default_rng([seed, j, m, k, cols])
        a[idx], b[idx], c[idx] = _kind_tiles(kind, rng, idx.size, m, k, cols, input_type)
    return a, b, c


def hardware_check_tiles(n: int, seed: int = 0, m: int = 64, k: int = 64, cols: int = 64,
                         kinds: tuple[str, ...] = HARDWARE_KINDS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tiles for comparing a model with a real GPU bit for bit: ``a [n, m, k]``, ``b [n, k, cols]`` float32 holding
    bf16 values (cast them to torch.bfloat16 exactly), ``c [n, m, cols]`` float32. Push each tile through
    ``tl.dot(a, b, acc=c)`` (fp32 accumulate, K walked in order) and compare with ``MODELS["hopper"].dot(a, b, c)``
    via :func:`bit_exact_fraction`. All kinds except ``specials`` by default (finite inputs); tile i's kind is
    ``tile_kinds(n, kinds)[i]``."""
    return random_tiles(n, m, k, cols, seed=seed, kinds=kinds)


# ----------------------------------------------------------------------------------------------------------------
# mmasim (validation only; imported lazily)

# name -> the gdnlab model (with the operand type, "bf16" unless "input" says otherwise) and the mmasim instruction
MMASIM_TARGETS: dict[str, dict] = {
    "hopper_wgmma": dict(model="hopper", family="WGMMA", arch="Hopper", instruction="m64n8k16.f32.bf16.bf16",
                         shape=(64, 8, 16)),
    "hopper_mma": dict(model="hopper", family="MMA", arch="Hopper", instruction="m16n8k16.f32.bf16.bf16.f32",
                       shape=(16, 8, 16)),
    "ampere_mma": dict(model="ampere", family="MMA", arch="Ampere", instruction="m16n8k16.f32.bf16.bf16.f32",
                       shape=(16, 8, 16)),
    "cdna3_32x32x8": dict(model="cdna3", family="MFMA", arch="CDNA3", instruction="f32_32x32x8_bf16",
                          shape=(32, 32, 8)),
    "cdna3_16x16x16": dict(model="cdna3", family="MFMA", arch="CDNA3", instruction="f32_16x16x16_bf16",
                           shape=(16, 16, 16)),
    "cdna2_32x32x8_1k": dict(model="cdna2", family="MFMA", arch="CDNA2", instruction="f32_32x32x8bf16_1k",
                             shape=(32, 32, 8)),
    "cdna2_16x16x16_1k": dict(model="cdna2", family="MFMA", arch="CDNA2", instruction="f32_16x16x16bf16_1k",
                              shape=(16, 16, 16)),
    "ideal_fma": dict(model="ideal", family="MFMA", arch="CDNA3", instruction="f32_16x16x4_f32",
                      shape=(16, 16, 4)),
    # fp32 / tf32 operands (MMAModel.dot(..., input_type=...))
    "fp32_fma": dict(model="ideal", input="fp32", family="MFMA", arch="CDNA3", instruction="f32_16x16x4_f32",
                     shape=(16, 16, 4)),
    "hopper_tf32_wgmma": dict(model="hopper", input="tf32", family="WGMMA", arch="Hopper",
                              instruction="m64n8k8.f32.tf32.tf32", shape=(64, 8, 8)),
    "hopper_tf32_mma": dict(model="hopper", input="tf32", family="MMA", arch="Hopper",
                            instruction="m16n8k8.f32.tf32.tf32.f32", shape=(16, 8, 8)),
    "ampere_tf32_mma": dict(model="ampere", input="tf32", family="MMA", arch="Ampere",
                            instruction="m16n8k8.f32.tf32.tf32.f32", shape=(16, 8, 8)),
    "cdna3_xf32": dict(model="cdna3", input="tf32", family="MFMA", arch="CDNA3", instruction="f32_16x16x8_xf32",
                       shape=(16, 16, 8)),
}


def mmasim_dot(target: str, a: np.ndarray, b: np.ndarray, c: np.ndarray, batch: int = 256) -> np.ndarray:
    """``D = a @ b + c`` computed by mmasim's instruction ``MMASIM_TARGETS[target]`` for tiles ``a [T, m, K]``,
    ``b [T, K, n]``, ``c [T, m, n]`` (the instruction's m and n; K a multiple of its k: the instruction is chained
    over K in order, each D feeding the next C). Needs the ``mmasim`` package (a dev dependency)."""
    import torch

    spec = MMASIM_TARGETS[target]
    if spec["family"] == "MFMA":
        from mmasim.amd import MFMA as Op
    elif spec["family"] == "WGMMA":
        from mmasim.nv_ptx import WGMMA as Op
    else:
        from mmasim.nv_ptx import MMA as Op
    op = Op(spec["arch"], spec["instruction"])
    m, n, k = spec["shape"]
    if a.shape[1:] != (m, a.shape[2]) or b.shape[2] != n or a.shape[2] % k:
        raise ValueError(f"{target} takes [T, {m}, K] x [T, K, {n}] tiles with K a multiple of {k}")
    in_dtype = op.a_type
    out = np.empty(c.shape, np.float32)
    for t0 in range(0, a.shape[0], batch):
        ta = torch.from_numpy(np.ascontiguousarray(a[t0:t0 + batch])).to(in_dtype)
        tb = torch.from_numpy(np.ascontiguousarray(b[t0:t0 + batch])).to(in_dtype)
        tc = torch.from_numpy(np.ascontiguousarray(c[t0:t0 + batch]))
        tbt = tb.transpose(1, 2)
        for k0 in range(0, a.shape[2], k):
            av = ta[:, :, None, k0:k0 + k].expand(-1, -1, n, -1)
            bv = tbt[:, None, :, k0:k0 + k].expand(-1, m, -1, -1)
            tc = op.dpa(av, bv, tc)
        out[t0:t0 + batch] = tc.numpy()
    return out


def mmasim_call(target: str, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """One tile through mmasim's instruction object itself (``op(A, B, C)``), chained over K; for cross-checks of
    the batched :func:`mmasim_dot`."""
    import torch

    spec = MMASIM_TARGETS[target]
    if spec["family"] == "MFMA":
        from mmasim.amd import MFMA as Op
    elif spec["family"] == "WGMMA":
        from mmasim.nv_ptx import WGMMA as Op
    else:
        from mmasim.nv_ptx import MMA as Op
    op = Op(spec["arch"], spec["instruction"])
    k = spec["shape"][2]
    ta = torch.from_numpy(np.ascontiguousarray(a)).to(op.a_type)
    tb = torch.from_numpy(np.ascontiguousarray(b)).to(op.b_type)
    tc = torch.from_numpy(np.ascontiguousarray(c))
    for k0 in range(0, a.shape[1], k):
        tc = op(ta[:, k0:k0 + k], tb[k0:k0 + k], tc)
    return tc.numpy()
