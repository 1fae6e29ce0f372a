"""Run the lab's Triton kernels anywhere: compiled on CUDA, or through Triton's interpreter on CPU.

Triton's interpreter stores bf16 as raw uint16 and then gets bf16 wrong (docs/design.md §7): `tl.dot` multiplies
the bit patterns, elementwise arithmetic and comparisons act on the bits, and fp32->bf16 casts truncate. The
numerics layer here patches the interpreter's builder for the duration of a launch so that CPU runs round the way a
GPU does: bf16 operands are decoded exactly, dots accumulate through a pluggable matrix-unit model (default: exact
products summed in float64 and rounded once to fp32), casts to bf16 round to nearest even, and bf16 elementwise
arithmetic is done in fp32 and rounded back. Outside `launch` the interpreter is left exactly as Triton ships it.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol, Sequence

import numpy as np
import torch
import triton
import triton.language as tl
from triton.runtime import interpreter as _ti
from triton.runtime.jit import JITFunction

from gdnlab import handles

class DotModel(Protocol):
    """How a matrix unit turns a [M,K]x[K,N] product plus an fp32 accumulator into fp32."""

    name: str

    def dot(self, a: np.ndarray, b: np.ndarray, c: np.ndarray, input_type: str = "bf16") -> np.ndarray: ...


class ExactDot:
    """Exact products, summed in float64, rounded once to fp32: an order-free stand-in for a tensor core."""

    name = "exact"
    description = "exact products, float64 sum, one rounding to fp32 (round to nearest even)"

    def dot(self, a: np.ndarray, b: np.ndarray, c: np.ndarray, input_type: str = "bf16") -> np.ndarray:
        return (np.matmul(a.astype(np.float64), b.astype(np.float64)) + c.astype(np.float64)).astype(np.float32)


_DOT_MODEL: DotModel = ExactDot()


# ---- bit-level helpers (also used by tests) -------------------------------------------------------------------

def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """Decode bf16 bit patterns (uint16) exactly to float32."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def f32_to_bf16_bits(x: np.ndarray, rounding: str = "rtne") -> np.ndarray:
    """Round float32 to bf16 bit patterns: to nearest even (the GPU's `.to(tl.bfloat16)`), or toward zero."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    if rounding == "rtz":
        out = bits >> np.uint32(16)
    else:
        bias = np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
        out = (bits + bias) >> np.uint32(16)
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    out = np.where(nan, (bits >> np.uint32(16)) | np.uint32(0x40), out)
    return out.astype(np.uint16)


def _is_bf16(handle: Any) -> bool:
    return handle.dtype.scalar == tl.bfloat16


def _as_f32(handle: Any) -> np.ndarray:
    if _is_bf16(handle):
        return bf16_bits_to_f32(handle.data)
    return handle.data


# ---- the patched builder methods ------------------------------------------------------------------------------

def _make_patches(builder: Any) -> dict[str, Callable]:
    TH = _ti.TensorHandle
    orig_cast, orig_binary, orig_unary = builder.cast_impl, builder.binary_op, builder.unary_op
    orig_fp_to_fp, orig_rsqrt = builder.create_fp_to_fp, builder.create_rsqrt

    def cast_impl(src, dst_type):
        s, d = src.dtype.scalar, dst_type.scalar
        if s == tl.bfloat16 and d != tl.bfloat16:
            return orig_cast(TH(bf16_bits_to_f32(src.data), tl.float32), dst_type)
        if d == tl.bfloat16 and s.is_floating() and s != tl.bfloat16:
            return TH(f32_to_bf16_bits(src.data.astype(np.float32)), tl.bfloat16)
        return orig_cast(src, dst_type)

    def create_fp_to_fp(src, dst_type, rounding_mode):
        if dst_type.scalar == tl.bfloat16 and src.dtype.scalar == tl.float32:
            mode = "rtz" if rounding_mode == _ti._ir.ROUNDING_MODE.RTZ else "rtne"
            return TH(f32_to_bf16_bits(src.data, mode), tl.bfloat16)
        return orig_fp_to_fp(src, dst_type, rounding_mode)

    def binary_op(lhs, rhs, op):
        if not (_is_bf16(lhs) or _is_bf16(rhs)):
            return orig_binary(lhs, rhs, op)
        out = op(_as_f32(lhs), _as_f32(rhs))
        if out.dtype == np.bool_:
            return TH(out, tl.int1)
        return TH(f32_to_bf16_bits(out.astype(np.float32)), tl.bfloat16)

    def unary_op(arg, op):
        if not _is_bf16(arg):
            return orig_unary(arg, op)
        return TH(f32_to_bf16_bits(op(_as_f32(arg)).astype(np.float32)), tl.bfloat16)

    def create_rsqrt(arg):
        if not _is_bf16(arg):
            return orig_rsqrt(arg)
        return TH(f32_to_bf16_bits((1 / np.sqrt(_as_f32(arg))).astype(np.float32)), tl.bfloat16)

    def create_dot(a, b, d, input_precision, max_num_imprecise_acc):
        if d.data.dtype != np.float32:
            raise NotImplementedError(f"gdnlab numerics: dot accumulator {d.data.dtype} (only fp32 is modelled)")
        ad, bd = _as_f32(a), _as_f32(b)
        kind = "bf16" if _is_bf16(a) else "fp32"
        if a.dtype.scalar == tl.float32 and input_precision == _ti._ir.INPUT_PRECISION.TF32:
            ad, bd, kind = _ti._round_f32_to_tf32(ad), _ti._round_f32_to_tf32(bd), "tf32"
        ad, bd = ad.astype(np.float32), bd.astype(np.float32)
        c = np.broadcast_to(d.data, ad.shape[:-1] + bd.shape[-1:]).astype(np.float32)
        if ad.ndim == 2:
            out = _DOT_MODEL.dot(ad, bd, c, kind)
        else:
            out = np.stack([_DOT_MODEL.dot(x, y, z, kind) for x, y, z in zip(ad, bd, c)])
        return TH(np.asarray(out, dtype=np.float32), d.dtype.scalar)

    return dict(cast_impl=cast_impl, create_fp_to_fp=create_fp_to_fp, binary_op=binary_op, unary_op=unary_op,
                create_rsqrt=create_rsqrt, create_dot=create_dot)


@contextlib.contextmanager
def numerics_layer() -> Iterator[None]:
    """Patch Triton's interpreter builder so bf16 rounds like a GPU; restore it on exit."""
    builder = _ti.interpreter_builder
    patches = _make_patches(builder)
    saved = {name: builder.__dict__.get(name) for name in patches}
    builder.__dict__.update(patches)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                builder.__dict__.pop(name, None)
            else:
                builder.__dict__[name] = value


@contextlib.contextmanager
def dot_model(model: DotModel | str) -> Iterator[DotModel]:
    """Run interpreted dots "as on" a named matrix unit (see gdnlab.mma.MODELS), e.g. `with dot_model("hopper"):`."""
    global _DOT_MODEL
    if isinstance(model, str):
        if model == "exact":
            model = ExactDot()
        else:
            from gdnlab.mma import get_model
            model = get_model(model)
    saved, _DOT_MODEL = _DOT_MODEL, model
    try:
        yield model
    finally:
        _DOT_MODEL = saved


def current_dot_model() -> DotModel:
    """The matrix-unit model interpreted dots use now."""
    return _DOT_MODEL


# ---- dual compiled / interpreted launch -----------------------------------------------------------------------

_INTERPRETED: dict[Callable, _ti.InterpretedFunction] = {}


def _interpreted(fn: JITFunction) -> _ti.InterpretedFunction:
    if fn.fn not in _INTERPRETED:
        _INTERPRETED[fn.fn] = _ti.InterpretedFunction(fn.fn)
    return _INTERPRETED[fn.fn]


def _call_interpreted(self: JITFunction, *args: Any, **kwargs: Any) -> Any:
    # triton.language is patched once per launch (see _interpreting), not once per call as Triton's own
    # InterpretedFunction.__call__ does: that re-patching was about a fifth of the interpreter's time.
    return _interpreted(self).rewrite()(*args, **kwargs)


_STOCK_PATCH_LANG_TENSOR = _ti._patch_lang_tensor


def _patch_lang_tensor(tensor: Any, scope: Any) -> None:
    """Triton's own tensor patching, with __index__ as Triton 3.7+ has it: a loop bound computed from a loaded
    scalar holds a one-element array, which Triton < 3.7 converts with int() and NumPy 2 refuses unless squeezed."""
    _STOCK_PATCH_LANG_TENSOR(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))


@contextlib.contextmanager
def _interpreting() -> Iterator[None]:
    """Let `@triton.jit` device functions (ours and triton.language's, e.g. tl.sum) be called from an
    interpreted kernel: Triton makes them interpretable only when TRITON_INTERPRET is set at import time."""
    saved = JITFunction.__call__
    JITFunction.__call__ = _call_interpreted
    # Both triton.language and triton.language.core (which tl.sum, tl.cdiv, ... see) stay patched for the launch.
    saved_tensor_patch = _ti._patch_lang_tensor
    _ti._patch_lang_tensor = _patch_lang_tensor
    scope = _ti._patch_lang(tl.standard.sum.fn)
    try:
        with numerics_layer():
            yield
    finally:
        scope.restore()
        _ti._patch_lang_tensor = saved_tensor_patch
        JITFunction.__call__ = saved


@dataclass(frozen=True)
class Launch:
    """One kernel launch as a wrapper issued it: the jit function, grid, positional arguments and keyword
    arguments (constexprs and the launch options num_warps / num_stages)."""

    kernel: JITFunction
    grid: tuple[int, ...]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


_RECORDING: list[tuple[list[Launch], bool]] = []
#: Per recorded_launches block, the tensors the kernels' allocator made inside it (note_made).
_MADE: list[list[torch.Tensor]] = []


@contextlib.contextmanager
def recorded_launches(run: bool = False) -> Iterator[list[Launch]]:
    """Within the block, :func:`launch` records every launch in the yielded list instead of running it, so that a
    wrapper's exact arguments can be compiled for another target (gdnlab.compile_matrix) without running it; with
    `run` it records and runs them (gdnlab.plans builds a call's plan so)."""
    got: list[Launch] = []
    _RECORDING.append((got, run))
    _MADE.append([])
    try:
        yield got
    finally:
        _RECORDING.pop()
        _MADE.pop()


def note_made(t: torch.Tensor) -> torch.Tensor:
    """`t`, noted as made inside the innermost recorded_launches block (if any): gdnlab.plans takes only such
    tensors for a call's own buffers, so a tensor it cannot account for stops a plan rather than being replaced."""
    if _MADE:
        _MADE[-1].append(t)
    return t


def made_tensors() -> list[torch.Tensor]:
    """The tensors noted by note_made in the innermost recorded_launches block so far."""
    return list(_MADE[-1]) if _MADE else []


def launch(kernel: JITFunction, grid: Sequence[int], *args: Any, device: torch.device | str, **kwargs: Any) -> None:
    """Launch `kernel` compiled on CUDA (through its cached handle, gdnlab.handles), or interpreted with the
    numerics layer when `device` is the CPU (or only record it, inside :func:`recorded_launches`)."""
    global _INTERPRETING
    if _RECORDING:
        got, run = _RECORDING[-1]
        got.append(Launch(kernel, tuple(grid), args, kwargs))
        if not run:
            return
    if (device.type if isinstance(device, torch.device) else torch.device(device).type) == "cuda":
        handles.launch(kernel, grid, args, kwargs)
        return
    kwargs = {k: v for k, v in kwargs.items() if k not in handles.LAUNCH_OPTIONS}
    with _interpreting():
        _interpreted(kernel)[tuple(grid)](*args, **kwargs)


def triton_version() -> str:
    """The installed Triton version (recorded in every table row)."""
    return triton.__version__
