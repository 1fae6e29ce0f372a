"""The interpreter numerics layer: each correction checked against torch, and each stock defect it corrects
checked to still exist, so that a Triton release that changes the behaviour underneath fails here first."""
import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from triton.runtime import interpreter as ti

from gdnlab import interp


@triton.jit
def _dot_kernel(a_ptr, b_ptr, o_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    idx = r[:, None] * N + r[None, :]
    tl.store(o_ptr + idx, tl.dot(tl.load(a_ptr + idx), tl.load(b_ptr + idx)))


@triton.jit
def _dot_f32_kernel(a_ptr, b_ptr, o_ptr, N: tl.constexpr, PREC: tl.constexpr):
    r = tl.arange(0, N)
    idx = r[:, None] * N + r[None, :]
    tl.store(o_ptr + idx, tl.dot(tl.load(a_ptr + idx), tl.load(b_ptr + idx), input_precision=PREC))


@triton.jit
def _cast_kernel(x_ptr, y_ptr, z_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    x = tl.load(x_ptr + r)
    tl.store(y_ptr + r, x.to(tl.bfloat16))
    tl.store(z_ptr + r, x.to(tl.bfloat16, fp_downcast_rounding="rtz"))


@triton.jit
def _elementwise_kernel(a_ptr, b_ptr, add_ptr, mul_ptr, sub_ptr, lt_ptr, exp_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    a = tl.load(a_ptr + r)
    b = tl.load(b_ptr + r)
    tl.store(add_ptr + r, a + b)
    tl.store(mul_ptr + r, a * b)
    tl.store(sub_ptr + r, a - b)
    tl.store(lt_ptr + r, (a < b).to(tl.int8))
    tl.store(exp_ptr + r, -a)


def _stock(kernel, *args, **kw):
    """Run through Triton's interpreter exactly as shipped (no numerics layer)."""
    interp._interpreted(kernel)[(1,)](*args, **kw)


def _bf16(n, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g) * scale).to(torch.bfloat16)


N = 16


def test_stock_bf16_dot_is_wrong_and_layer_fixes_it():
    a, b = _bf16(N * N, 1).view(N, N), _bf16(N * N, 2).view(N, N)
    ref = (a.double() @ b.double()).float()
    out = torch.full((N, N), float("nan"))
    _stock(_dot_kernel, a, b, out, N=N)
    # Stock: dot of raw uint16 bit patterns (values ~1e10). If this fails, Triton fixed it: revisit gdnlab.interp.
    assert not torch.allclose(out, ref, atol=1.0)
    out = torch.full((N, N), float("nan"))
    interp.launch(_dot_kernel, (1,), a, b, out, N=N, device="cpu")
    assert torch.equal(out, ref)  # exact products, one rounding: equals float64 rounded to fp32


def test_fp32_dot_ieee_exact_and_tf32_rounds_operands():
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(N, N, generator=g), torch.randn(N, N, generator=g)
    ieee, tf32 = torch.full((N, N), float("nan")), torch.full((N, N), float("nan"))
    interp.launch(_dot_f32_kernel, (1,), a, b, ieee, N=N, PREC="ieee", device="cpu")
    interp.launch(_dot_f32_kernel, (1,), a, b, tf32, N=N, PREC="tf32", device="cpu")
    assert torch.allclose(ieee.double(), a.double() @ b.double(), rtol=1e-6, atol=1e-6)
    rel = ((tf32 - ieee).norm() / ieee.norm()).item()
    assert 1e-5 < rel < 2e-3  # tf32 keeps 10 mantissa bits


def _cast_inputs():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(56, generator=g) * 10
    # Exact ties (to even, both directions), a non-tie, inf, NaN, and overflow past bf16's max.
    ties = torch.tensor([1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, -(1.0 + 2 ** -8), 1.0 + 2 ** -8 + 2 ** -20])
    special = torch.tensor([float("inf"), float("-inf"), float("nan"), 3.4e38])
    return torch.cat([x, ties, special])


def test_stock_cast_truncates_and_layer_rounds_to_nearest_even():
    x = _cast_inputs()
    n = x.numel()
    y, z = torch.empty(n, dtype=torch.bfloat16), torch.empty(n, dtype=torch.bfloat16)
    _stock(_cast_kernel, x, y, z, N=n)
    trunc = torch.from_numpy(interp.f32_to_bf16_bits(x.numpy(), "rtz").view(np.int16)).view(torch.bfloat16)
    finite = torch.isfinite(x)
    # Stock: `.to(tl.bfloat16)` truncates. If this fails, Triton now rounds: revisit gdnlab.interp.
    assert torch.equal(y[finite], trunc[finite])
    assert not torch.equal(y[finite], x[finite].to(torch.bfloat16))
    y, z = torch.empty(n, dtype=torch.bfloat16), torch.empty(n, dtype=torch.bfloat16)
    interp.launch(_cast_kernel, (1,), x, y, z, N=n, device="cpu")
    want = x.to(torch.bfloat16)
    nan = x.isnan()
    assert torch.equal(y[~nan].view(torch.int16), want[~nan].view(torch.int16))
    assert y[nan].isnan().all()
    assert torch.equal(z[finite].view(torch.int16), trunc[finite].view(torch.int16))


def test_stock_bf16_elementwise_is_wrong_and_layer_matches_torch():
    a, b = _bf16(64, 5), _bf16(64, 6, scale=3.0)
    outs = lambda: [torch.empty(64, dtype=torch.bfloat16) for _ in range(3)] + [torch.empty(64, dtype=torch.int8),
                                                                              torch.empty(64, dtype=torch.bfloat16)]
    stock = outs()
    _stock(_elementwise_kernel, a, b, *stock, N=64)
    # Stock: arithmetic on the uint16 bit patterns. If this fails, Triton fixed it: revisit gdnlab.interp.
    assert not torch.equal(stock[0], a + b)
    fixed = outs()
    interp.launch(_elementwise_kernel, (1,), a, b, *fixed, N=64, device="cpu")
    assert torch.equal(fixed[0], a + b)
    assert torch.equal(fixed[1], a * b)
    assert torch.equal(fixed[2], a - b)
    assert torch.equal(fixed[3], (a < b).to(torch.int8))
    assert torch.equal(fixed[4], -a)


def test_layer_is_removed_after_launch():
    before = dict(ti.interpreter_builder.__dict__)
    a, b = _bf16(N * N, 7).view(N, N), _bf16(N * N, 8).view(N, N)
    interp.launch(_dot_kernel, (1,), a, b, torch.empty(N, N), N=N, device="cpu")
    assert ti.interpreter_builder.__dict__.keys() == before.keys()
    assert triton.runtime.jit.JITFunction.__call__.__name__ == "__call__"


class _PlusOne:
    name = "plus_one"

    def dot(self, a, b, c, input_type="bf16"):
        return (np.matmul(a.astype(np.float64), b.astype(np.float64)) + c + 1).astype(np.float32)


def test_dot_model_is_pluggable():
    a, b = _bf16(N * N, 9).view(N, N), _bf16(N * N, 10).view(N, N)
    out = torch.empty(N, N)
    with interp.dot_model(_PlusOne()):
        interp.launch(_dot_kernel, (1,), a, b, out, N=N, device="cpu")
    assert torch.equal(out, (a.double() @ b.double() + 1).float())
    assert interp.current_dot_model().name == "exact"


@pytest.mark.parametrize("x", [0.0, 1.0, -2.5, 1e-40, 65504.0])
def test_bf16_bits_roundtrip(x):
    bits = interp.f32_to_bf16_bits(np.array([x], dtype=np.float32))
    want = torch.tensor([x]).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert bits[0] == want[0]
    assert interp.bf16_bits_to_f32(bits)[0] == torch.tensor([x]).to(torch.bfloat16).float().item()


def test_kernels_run_as_on_hopper():
    """A named matrix-unit model drives every dot of a real kernel (fp32 solve dots through its FMA path)."""
    kw = gdnlab_inputs(seed=12)
    import gdnlab
    o_exact, h_exact = gdnlab.chunk_gated_delta_rule(**kw, backend="two_kernel")
    with interp.dot_model("hopper"):
        o_hopper, h_hopper = gdnlab.chunk_gated_delta_rule(**kw, backend="two_kernel")
    assert torch.isfinite(o_hopper).all() and torch.isfinite(h_hopper).all()
    assert not torch.equal(h_exact, h_hopper)  # truncating accumulation moves some fp32 roundings
    assert (h_exact - h_hopper).abs().max() < 1e-5
    assert (o_exact.float() - o_hopper.float()).abs().max() < 1e-2


def gdnlab_inputs(seed):
    from gdnlab.inputs import make_inputs
    return make_inputs(B=1, T=70, H=1, HV=2, K=64, V=64, seed=seed).kwargs()
