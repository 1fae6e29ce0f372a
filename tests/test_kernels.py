"""The Triton kernels on CPU (interpreter + numerics layer): conformance against the float64 reference, the
report's isolation signature, bit-equality of the fixed fused kernel with the two-kernel path, full writes, NaN."""
from __future__ import annotations

import functools

import pytest
import torch

import gdnlab
from gdnlab.cases import CASES, CASES_BY_NAME, ISOLATION, Case
from gdnlab.inputs import make_inputs
from gdnlab.metrics import CUTEDSL_OUTPUT, CUTEDSL_STATE, errors, valid_rows
from gdnlab.reference import recurrent_gated_delta_rule_ref

KERNELS = ("two_kernel", "fused_fixed", "fused_shipped")


@functools.lru_cache(maxsize=None)
def reference(name: str):
    inp = CASES_BY_NAME[name].inputs()
    return recurrent_gated_delta_rule_ref(**inp.kwargs())


@functools.lru_cache(maxsize=None)
def run(name: str, backend: str):
    """A case on a backend, outputs poisoned with NaN beforehand; checks inputs are left untouched."""
    inp = CASES_BY_NAME[name].inputs()
    kw = inp.kwargs()
    before = {k: v.clone() for k, v in kw.items() if isinstance(v, torch.Tensor)}
    o, ht = gdnlab.chunk_gated_delta_rule(**kw, backend=backend, poison=True)
    for k, v in before.items():
        assert torch.equal(kw[k], v), f"{backend} modified its input {k}"
    return o, ht


def spared(case: Case) -> bool:
    """The shipped defect (A.U instead of A.V_new) is invisible iff no chunk sees a non-zero incoming state."""
    return not case.initial_state and all(n <= 64 for n in case.lengths)


class OutputOverBudget(AssertionError):
    """The output's error is above the CuteDSL output budget, everything else about the call being right: every
    element written, padding rows zero, the final state within its budget."""


def check_budgets(case: Case, o, ht):
    """Every element written, padding zero, final state within budget, then the output within budget (the last
    failure, and only it, raises OutputOverBudget)."""
    ro, rh = reference(case.name)
    inp = case.inputs()
    assert torch.isfinite(o).all() and torch.isfinite(ht).all(), "an output element was never written"
    rows = valid_rows(inp.cu_seqlens, o.shape[1])
    assert (o[:, ~rows] == 0).all(), "padding rows must stay zero"
    ok_s, es = CUTEDSL_STATE.check(ht.to(inp.initial_state.dtype if inp.initial_state is not None else ht.dtype),
                                   rh.to(inp.initial_state.dtype if inp.initial_state is not None else rh.dtype))
    assert ok_s, f"final state {es} over budget {CUTEDSL_STATE}"
    ok_o, eo = CUTEDSL_OUTPUT.check(o[:, rows], ro[:, rows])
    if not ok_o:
        raise OutputOverBudget(f"output {eo} over budget {CUTEDSL_OUTPUT}")


def _cases(marks_for=None):
    return [pytest.param(c, id=c.name, marks=[pytest.mark.xdist_group(c.name)] + (marks_for(c) if marks_for else []))
            for c in CASES]


#: The cases whose runs cost the CPU suite most (var_16short about 30-50 s a kernel): there two_kernel's conformance
#: and the fused kernels' runs (fixed and shipped) are only in `make test-all` (marked slow). The other 17 cases,
#: spared ones and the state-carrying regimes of each kind among them (many sequences, padding, no initial state,
#: batches, several chunks), keep two_kernel's conformance, the fix's bit-equality and the shipped defect's
#: signature in `make test`.
HEAVY = {"var_16short", "t513", "b3_t65_bf16", "var_pad_bf16_noh0", "t320", "b2_t100"}


def _heavy_marks(case):
    return [pytest.mark.slow] if case.name in HEAVY else []


@pytest.mark.parametrize("case", _cases(_heavy_marks))
def test_conformance(case):
    check_budgets(case, *run(case.name, "two_kernel"))


@pytest.mark.parametrize("case", _cases(_heavy_marks))
def test_fixed_conformance(case):
    check_budgets(case, *run(case.name, "fused_fixed"))


#: Cases the defect reaches but too lightly to cross a budget: in t65_bf16_noh0 only the 65th token sees carried
#: state (its max error 1.7e-3 is under 2e-3, and one row in 65 leaves the mean at 3e-5 on the H200 as on the CPU).
UNDER_BUDGET_ANYWAY = {"t65_bf16_noh0"}


def _shipped_marks(case):
    if spared(case) or case.name in UNDER_BUDGET_ANYWAY:
        return _heavy_marks(case)
    return _heavy_marks(case) + [pytest.mark.xfail(strict=True, raises=OutputOverBudget,
                              reason="the shipped intra-chunk term uses U where the state is non-zero: the output, "
                                     "and only the output, is over budget")]


def test_only_an_output_over_budget_counts_as_the_shipped_defect():
    """The shipped kernel's xfails accept OutputOverBudget alone: an unwritten element, a non-zero padding row or a
    state over budget fail them as any other test."""
    case = next(c for c in CASES if c.pad)
    ro, rh = reference(case.name)
    o, ht = ro.to(torch.bfloat16), rh.float()
    check_budgets(case, o, ht)
    off = o.clone()
    off[:, valid_rows(case.inputs().cu_seqlens, o.shape[1])] += 0.01
    with pytest.raises(OutputOverBudget):
        check_budgets(case, off, ht)
    for bad_o, bad_h in ((o.clone().fill_(float("nan")), ht), (o.clone().fill_(1.0), ht), (o, ht + 1.0)):
        with pytest.raises(AssertionError) as err:
            check_budgets(case, bad_o, bad_h)
        assert not isinstance(err.value, OutputOverBudget)


@pytest.mark.parametrize("case", _cases(_shipped_marks))
def test_shipped_fails_exactly_where_the_defect_bites(case):
    check_budgets(case, *run(case.name, "fused_shipped"))


@pytest.mark.parametrize("case", _cases(_heavy_marks))
def test_shipped_differs_exactly_where_state_is_carried(case):
    """Budgets aside: the shipped output equals the two-kernel output iff no chunk sees a non-zero state."""
    same = torch.equal(run(case.name, "fused_shipped")[0], run(case.name, "two_kernel")[0])
    assert same == spared(case)


@pytest.mark.parametrize("case", _cases(_heavy_marks))
def test_fixed_is_bit_equal_to_two_kernel(case):
    o2, h2 = run(case.name, "two_kernel")
    of, hf = run(case.name, "fused_fixed")
    assert torch.equal(of, o2)
    assert torch.equal(hf, h2)


@pytest.mark.parametrize("case", _cases(_heavy_marks))
def test_shipped_final_state_is_bit_equal_to_two_kernel(case):
    """The report's other half: the shipped kernel's final state is exact, only its output is off."""
    assert torch.equal(run(case.name, "fused_shipped")[1], run(case.name, "two_kernel")[1])


@pytest.mark.xdist_group("isolation")
def test_isolation_signature():
    """The report's case table: exact for 1 chunk without h0; far beyond rounding with h0 or a second chunk."""
    spare, h0, two = ISOLATION
    o2, h2 = run(spare.name, "two_kernel")
    os_, hs = run(spare.name, "fused_shipped")
    assert torch.equal(os_, o2) and torch.equal(hs, h2)
    for case in (h0, two):
        ro, _ = reference(case.name)
        e_two = errors(run(case.name, "two_kernel")[0], ro)["max_abs"]
        e_shipped = errors(run(case.name, "fused_shipped")[0], ro)["max_abs"]
        assert torch.equal(run(case.name, "fused_shipped")[1], run(case.name, "two_kernel")[1])
        assert e_shipped > 4 * e_two, (case.name, e_shipped, e_two)


@pytest.mark.parametrize("backend", KERNELS + ("reference",))
@pytest.mark.parametrize("where", ["q", "v"])
def test_nan_in_input_reaches_output(backend, where):
    inp = gdnlab.inputs.make_inputs(B=1, T=70, H=2, HV=2, K=64, V=64, seed=31)
    kw = inp.kwargs()
    kw[where] = kw[where].clone()
    kw[where][0, 5, 0, 3] = float("nan")
    o, ht = gdnlab.chunk_gated_delta_rule(**kw, backend=backend)
    assert o[0, 5, 0].isnan().any(), "NaN at token 5 must show in that token's output"
    if where == "v":
        assert ht[0, 0].isnan().any(), "NaN in v must reach the final state"


@pytest.mark.parametrize("backend", KERNELS)
@pytest.mark.parametrize("K,V,BV", [(64, 64, 16), (192, 64, 32), (256, 32, 8), (80, 48, 16)])
def test_other_head_dims_and_tiles(backend, K, V, BV):
    """K up to 256 in 64-wide tiles (and K, V not multiples of 64), every BV."""
    inp = gdnlab.inputs.make_inputs(B=1, T=130, H=1, HV=2, K=K, V=V, seed=K + V)
    kw = inp.kwargs()
    ro, rh = recurrent_gated_delta_rule_ref(**kw)
    o, ht = gdnlab.chunk_gated_delta_rule(**kw, backend=backend, BV=BV, poison=True)
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    if backend != "fused_shipped":
        assert errors(o, ro)["max_abs"] < CUTEDSL_OUTPUT.max_abs
    assert errors(ht, rh)["max_abs"] < CUTEDSL_STATE.max_abs


def test_state_v_first_and_gva_through_kernels():
    inp = gdnlab.inputs.make_inputs(B=1, T=65, H=1, HV=4, K=64, V=64, seed=5)
    kw = inp.kwargs()
    o1, h1 = gdnlab.chunk_gated_delta_rule(**kw, backend="fused_fixed")
    kw["initial_state"] = kw["initial_state"].transpose(-1, -2).contiguous()
    o2, h2 = gdnlab.chunk_gated_delta_rule(**kw, backend="fused_fixed", state_v_first=True)
    assert torch.equal(o1, o2) and torch.equal(h1, h2.transpose(-1, -2))


def test_unknown_option_and_bad_bv_are_refused():
    kw = gdnlab.inputs.make_inputs(B=1, T=8, H=1, HV=1, K=16, V=16, seed=1).kwargs()
    with pytest.raises(TypeError, match="options"):
        gdnlab.chunk_gated_delta_rule(**kw, backend="two_kernel", downcast=False)
    with pytest.raises(ValueError, match="BV"):
        gdnlab.chunk_gated_delta_rule(**kw, backend="fused_fixed", BV=12)
    with pytest.raises(ValueError, match="BV"):
        gdnlab.chunk_gated_delta_rule(**kw, backend="fast", BV=0)
    with pytest.raises(ValueError, match="backend"):
        gdnlab.chunk_gated_delta_rule(**kw, backend="nope")


def test_int64_indices_only_where_a_buffer_needs_them():
    """The kernels index in int32 unless some buffer has 2^31 elements (meta tensors: no memory); forcing int64
    changes addresses' width, not numbers."""
    from gdnlab.kernels.prologue import wide_index
    small, big = torch.empty(2 ** 31 - 1, device="meta"), torch.empty(2 ** 31, device="meta")
    assert not wide_index(small, torch.empty(3, 5)) and wide_index(small, big)
    kw = make_inputs(seqlens=(30, 1, 97), H=1, HV=2, K=64, V=32, seed=12, decay=0.1).kwargs()
    o, h = gdnlab.chunk_gated_delta_rule(**kw, backend="two_kernel")
    o64, h64 = gdnlab.chunk_gated_delta_rule(**kw, backend="two_kernel", index64=True, poison=True)
    assert torch.equal(o, o64) and torch.equal(h, h64)


def test_host_grid_helpers_equal_tritons():
    import triton

    from gdnlab.kernel_params import cdiv, pow2
    assert all(pow2(n) == triton.next_power_of_2(n) for n in range(1, 4100))
    assert all(cdiv(a, b) == triton.cdiv(a, b) for a in range(0, 300) for b in range(1, 70))


def test_fold_norm_changes_only_calls_that_normalise_and_stays_in_budget():
    """fold_norm: without the l2-norm it is the two-kernel path bit for bit; with it every element is written,
    the result within the conformance budgets, and not the normalised path's bits (the rounding it removes). The
    inputs are var_pad's layout (ragged, padded, with a state) at smaller heads, for the CPU suite's time; the GPU
    suite runs fast, whose norm is folded, on var_pad itself (tests/test_gpu.py)."""
    inp = make_inputs(seqlens=[50, 70], pad=14, H=2, HV=4, K=64, V=64, seed=20)
    kw = inp.kwargs()
    ro, rh = recurrent_gated_delta_rule_ref(**kw)
    rows = valid_rows(inp.cu_seqlens, inp.q.shape[1])
    base = gdnlab.chunk_gated_delta_rule(**kw, backend="two_kernel", poison=True)
    fold = gdnlab.chunk_gated_delta_rule(**kw, backend="fast", poison=True, fold_norm=True)
    assert torch.isfinite(fold[0]).all() and torch.isfinite(fold[1]).all()
    assert (fold[0][:, int(inp.cu_seqlens[-1]):] == 0).all()
    assert CUTEDSL_OUTPUT.check(fold[0][:, rows], ro[:, rows])[0] and CUTEDSL_STATE.check(fold[1], rh)[0]
    assert not torch.equal(fold[0], base[0])
    plain = {**kw, "use_qk_l2norm_in_kernel": False}
    a = gdnlab.chunk_gated_delta_rule(**plain, backend="two_kernel", fold_norm=True)
    b = gdnlab.chunk_gated_delta_rule(**plain, backend="two_kernel")
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    with pytest.raises(ValueError, match="fold_norm"):
        gdnlab.chunk_gated_delta_rule(**kw, backend="two_kernel", fold_norm=True, norm_q_in_output=True)
    with pytest.raises(TypeError, match="fold_norm"):
        gdnlab.chunk_gated_delta_rule(**kw, backend="fused_fixed", fold_norm=True)


@pytest.mark.parametrize("kind", ["ragged", "k80"])
def test_looping_kernels_with_descriptors_are_bit_equal(kind):
    """Prologue and output programs that loop over runs of a sequence's chunks (prologue_programs, out_programs),
    with their tiles through tensor descriptors (prologue_tma, out_tma) or not: output and state bit-equal to one
    program per chunk, every element written. Ragged sequences (fast, the fold; runs cut at sequence ends) and a head's padded columns (K = 80
    in 128-wide tiles, the norm inside the prologue) read as zeros and are never written."""
    from gdnlab.interp import recorded_launches
    if kind == "ragged":
        kw = make_inputs(seqlens=(100, 28, 129), pad=7, H=1, HV=2, K=64, V=64, seed=21, dtype=torch.bfloat16,
                         state_dtype=torch.bfloat16, initial_state=False, use_qk_l2norm=True).kwargs()
        backend, opts = "fast", {}
    else:
        kw = make_inputs(B=1, T=130, H=1, HV=2, K=80, V=32, regime="decay", seed=31, dtype=torch.bfloat16,
                         state_dtype=torch.float32, use_qk_l2norm=True).kwargs()
        backend, opts = "two_kernel", dict(fuse_norm=True)
    kw["output_final_state"] = True
    o, h = gdnlab.chunk_gated_delta_rule(**kw, backend=backend, **opts)
    for tma in (False, True):
        with recorded_launches(run=True) as got:
            ot, ht = gdnlab.chunk_gated_delta_rule(**kw, backend=backend, poison=True, prologue_programs=2,
                                                   prologue_stages=3, prologue_tma=tma, out_programs=2, out_tma=tma,
                                                   **opts)
        looped = {c.kernel.__name__: (c.kwargs["LOOP"], c.kwargs["TMA"]) for c in got if "LOOP" in c.kwargs}
        assert looped == dict(prologue_kernel=(True, tma), fwd_o_kernel=(True, tma))
        assert not ht.isnan().any() and torch.equal(ht, h)
        assert torch.equal(ot.isnan(), o.isnan()) and torch.equal(ot.nan_to_num(), o.nan_to_num())


@pytest.mark.parametrize("name, opts", [("t129", {}), pytest.param("var_pad_bf16_noh0", {}, marks=pytest.mark.slow),
                                        pytest.param("var_pad", {}, marks=pytest.mark.slow),
                                        pytest.param("b3_t65_bf16", dict(fold_norm=False), marks=pytest.mark.slow)])
def test_walk_t_is_in_budget(name, opts):
    """walk_t (the prologue stores T, the state kernel forms V_new = T diag(beta) (V - diag(exp(G)) K S)): every
    element written, padding zero, inputs untouched, output and state within budget; with the fold and without,
    ragged padded batches among the cases. The launches are the T forms, not W and U."""
    from gdnlab.interp import recorded_launches
    case = CASES_BY_NAME[name]
    kw = case.inputs().kwargs()
    before = {k: v.clone() for k, v in kw.items() if isinstance(v, torch.Tensor)}
    with recorded_launches(run=True) as got:
        o, ht = gdnlab.chunk_gated_delta_rule(**kw, backend="fast", poison=True, walk_t=True, **opts)
    forms = {c.kernel.__name__: c.kwargs.get("STORE_T", c.kwargs.get("T_FORM")) for c in got
             if c.kernel.__name__ in ("prologue_kernel", "fwd_h_kernel")}
    assert forms == dict(prologue_kernel=True, fwd_h_kernel=True)
    assert all(torch.equal(kw[k], v) for k, v in before.items())
    check_budgets(case, o, ht)


def test_walk_t_with_a_v_first_state_is_the_k_first_call_transposed():
    kw = make_inputs(seqlens=[100, 30, 64], H=1, HV=2, K=64, V=32, seed=7).kwargs()  # ragged, with a state
    o, h = gdnlab.chunk_gated_delta_rule(**kw, backend="fast", walk_t=True)
    kw_vf = dict(kw, initial_state=kw["initial_state"].transpose(-1, -2).contiguous(), state_v_first=True)
    ov, hv = gdnlab.chunk_gated_delta_rule(**kw_vf, backend="fast", walk_t=True, poison=True)
    assert torch.equal(ov, o) and torch.equal(hv, h.transpose(-1, -2))


def test_walk_t_is_no_less_accurate_at_sixteen_chunks():
    """Finding (CPU emulation of the GPU's roundings, slow gate, 16 chunks): walk_t rounds neither W nor U and
    subtracts before T's product, and its output's max and mean error against the float64 recurrence are no larger
    than fast's."""
    kw = make_inputs(B=1, T=1024, H=1, HV=2, K=64, V=64, regime="decay", decay=0.001, h0_scale=0.5, seed=5,
                     dtype=torch.bfloat16, state_dtype=torch.float32).kwargs()
    ref = recurrent_gated_delta_rule_ref(**{k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point()
                                            else v for k, v in kw.items()})[0]
    err = {}
    for opts in ({}, dict(walk_t=True)):
        o, _ = gdnlab.chunk_gated_delta_rule(**kw, backend="fast", poison=True, **opts)
        e = (o.double() - ref).abs()
        err[bool(opts)] = (float(e.max()), float(e.mean()))
    assert err[True][0] <= err[False][0] and err[True][1] <= err[False][1], err


@pytest.mark.parametrize("opts", [dict(split_wu=True), dict(prologue_tma=True), dict(prologue_solve="by_blocks")])
def test_walk_t_refuses_what_needs_w_and_u(opts):
    kw = CASES_BY_NAME["t65"].inputs().kwargs()
    with pytest.raises(ValueError, match="store_t"):
        gdnlab.chunk_gated_delta_rule(**kw, backend="fast", walk_t=True, **opts)
    with pytest.raises(TypeError, match="walk_t"):
        gdnlab.chunk_gated_delta_rule(**kw, backend="fused_fixed", walk_t=True)


@pytest.mark.parametrize("name", ["var_pad_bf16_noh0", "var_long", "b3_t65_bf16"])
@pytest.mark.slow  # out_chunks is an option fast no longer takes (speed notes item 55)
def test_two_chunk_output_blocks_are_in_budget_and_leave_the_state_alone(name):
    """out_chunks=2 (each output program takes two chunks from the first one's h; the state kernel stores only
    those h): every element written, padding zero, output and state within budget on ragged, long and batched
    cases, the final state bit-equal to fast's (the walk is the same), and the loop over runs of blocks (with and
    without descriptors) bit-equal to one program per block."""
    case = CASES_BY_NAME[name]
    kw = case.inputs().kwargs()
    o, ht = gdnlab.chunk_gated_delta_rule(**kw, backend="fast", poison=True, out_chunks=2)
    check_budgets(case, o, ht)
    assert torch.equal(ht, run(name, "fast")[1])
    assert not torch.equal(o, run(name, "fast")[0])  # the blocks' later chunks do round otherwise
    if name == "var_long":
        for tma in (False, True):
            ol, hl = gdnlab.chunk_gated_delta_rule(**kw, backend="fast", poison=True, out_chunks=2, out_programs=2,
                                                   out_tma=tma)
            assert torch.equal(ol, o) and torch.equal(hl, ht)


def test_output_blocks_of_other_sizes_are_refused():
    kw = CASES_BY_NAME["t65"].inputs().kwargs()
    for bad in (3, 2.0, True):
        with pytest.raises(ValueError, match="out_chunks"):
            gdnlab.chunk_gated_delta_rule(**kw, backend="fast", out_chunks=bad)
    with pytest.raises(TypeError, match="out_chunks"):
        gdnlab.chunk_gated_delta_rule(**kw, backend="fused_fixed", out_chunks=2)


@pytest.mark.parametrize("name", ["var_pad", pytest.param("var_pad_bf16_noh0", marks=pytest.mark.slow),
                                  pytest.param("b3_t65_bf16", marks=pytest.mark.slow)])
def test_fused_output_is_bit_equal_to_fast_on_the_cpu(name):
    """fused_output (the state kernel writes the output; no h, V_new or output kernel) rounds where the output
    kernel does: every element written, padding zero, output and final state bit-equal to fast's here."""
    kw = CASES_BY_NAME[name].inputs().kwargs()
    o, ht = gdnlab.chunk_gated_delta_rule(**kw, backend="fast", poison=True, fused_output=True)
    want_o, want_ht = run(name, "fast")
    assert torch.equal(o, want_o) and torch.equal(ht, want_ht)


def test_walk_t_layouts_are_bit_equal():
    """With walk_t the state kernel's other layouts change where the numbers go and which loads run, not the
    numbers: writing the output itself (fused_output, fast's for batches) and keeping K S's K tiles for the state
    update (walk_k_once, with and without the fused output) give walk_t's output and final state bit for bit (three
    sequences, two chunks each, a bf16 state); walk_k_once is refused where the walk forms W S, not K S."""
    kw = make_inputs(B=3, T=65, H=1, HV=2, K=128, V=64, seed=15, state_dtype=torch.bfloat16).kwargs()
    want = gdnlab.chunk_gated_delta_rule(**kw, backend="fast", poison=True, walk_t=True)
    for opts in (dict(fused_output=True), dict(fused_output=True, walk_k_once=True), dict(walk_k_once=True)):
        got = gdnlab.chunk_gated_delta_rule(**kw, backend="fast", poison=True, walk_t=True, **opts)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), opts
    with pytest.raises(ValueError, match="walk_k_once"):
        gdnlab.chunk_gated_delta_rule(**kw, backend="fast", walk_t=False, walk_k_once=True)


def test_fused_output_refuses_the_output_kernels_options():
    kw = CASES_BY_NAME["t65"].inputs().kwargs()
    for opts in (dict(out_chunks=2), dict(out_BV=64), dict(out_programs=2), dict(norm_q_in_output=True)):
        with pytest.raises(ValueError, match="fused_output"):
            gdnlab.chunk_gated_delta_rule(**kw, backend="fast", fused_output=True, **opts)
    with pytest.raises(TypeError, match="fused_output"):
        gdnlab.chunk_gated_delta_rule(**kw, backend="fused_fixed", fused_output=True)


@pytest.mark.parametrize("opts, dims", [pytest.param({}, (32, 32), id="fold")] + [
    pytest.param(o, d, id=i, marks=pytest.mark.slow)  # about 8 s each on the interpreter
    for o, d, i in ((dict(fuse_norm=True), (64, 64), "norm-inside"),
                    (dict(fold_norm=False, prologue_warps=2), (64, 64), "normalised-apart"),
                    (dict(prologue_programs=2), (96, 48), "loop-other-dims"))])
def test_wu_apart_gives_fast_s_bits_with_its_launches(opts, dims):
    """wu_apart (the prologue stores T only; wu_kernel forms W and U from it): on a ragged batch with a state and two
    key heads (the quick case at K = V = 32), the output and final state are bit-equal to fast's with the same
    options (the same products, operands and roundings), every element written and the inputs untouched; the
    launches are a T-only prologue, then wu_kernel, then the W/U walk; a repeated call (its call plan) gives the
    same bits again."""
    from gdnlab.interp import recorded_launches
    kw = make_inputs(seqlens=[100, 30], H=2, HV=4, K=dims[0], V=dims[1], seed=11).kwargs()
    before = {k: v.clone() for k, v in kw.items() if isinstance(v, torch.Tensor)}
    want = gdnlab.chunk_gated_delta_rule(**kw, backend="fast", poison=True, **opts)
    with recorded_launches(run=True) as launched:
        got = gdnlab.chunk_gated_delta_rule(**kw, backend="fast", poison=True, wu_apart=True, **opts)
    assert all(torch.equal(a, b) for a, b in zip(got, want)) and torch.isfinite(got[0]).all()
    assert all(torch.equal(kw[k], v) for k, v in before.items())
    names = [c.kernel.__name__ for c in launched]
    i = names.index("prologue_kernel")
    assert names[i + 1] == "wu_kernel" and launched[i].kwargs["STORE_T"]
    assert not [c for c in launched if c.kernel.__name__ == "fwd_h_kernel"][0].kwargs.get("T_FORM")
    if not opts:  # recorded as a call plan, then replayed from it
        again = [gdnlab.chunk_gated_delta_rule(**kw, backend="fast", wu_apart=True) for _ in range(2)]
        assert all(torch.equal(a, b) for r in again for a, b in zip(r, want))


@pytest.mark.parametrize("opts, error, match", [(dict(walk_t=True), ValueError, "name one"),
                                                (dict(split_wu=True), ValueError, "wu_apart"),
                                                (dict(prologue_tma=True), ValueError, "wu_apart"),
                                                (dict(prologue_solve="by_blocks"), ValueError, "wu_apart"),
                                                (dict(wu_warps=3), ValueError, "wu_warps")])
def test_wu_apart_refuses_what_it_cannot_run(opts, error, match):
    kw = CASES_BY_NAME["t65"].inputs().kwargs()
    with pytest.raises(error, match=match):
        gdnlab.chunk_gated_delta_rule(**kw, backend="fast", wu_apart=True, **opts)
    with pytest.raises(ValueError, match="only with wu_apart"):
        gdnlab.chunk_gated_delta_rule(**kw, backend="fast", wu_warps=4)
    with pytest.raises(TypeError, match="wu_apart"):
        gdnlab.chunk_gated_delta_rule(**kw, backend="fused_fixed", wu_apart=True)


def test_walk_ws_gives_fast_s_bits_through_descriptors():
    """walk_ws (the W/U walk's tiles through tensor descriptors, its loop warp-specialised on Hopper): on a ragged
    batch with a state and two key heads, at K = 128 (two K tiles) and a V of two tiles, the output and final
    state are bit-equal to fast's, every element written; the state kernel is launched with WS and no T_FORM, and
    a repeated call (its plan) gives the same bits. Where the size rule chose walk_t (1024-2048 tokens), walk_ws
    takes its place and the solve goes back to the default."""
    from gdnlab import backends
    from gdnlab.interp import recorded_launches
    kw = make_inputs(seqlens=[100, 30], H=2, HV=4, K=128, V=64, seed=12).kwargs()
    want = gdnlab.chunk_gated_delta_rule(**kw, backend="fast", poison=True)
    with recorded_launches(run=True) as launched:
        got = gdnlab.chunk_gated_delta_rule(**kw, backend="fast", poison=True, walk_ws=True)
    assert all(torch.equal(a, b) for a, b in zip(got, want)) and torch.isfinite(got[0]).all()
    walk = [c for c in launched if c.kernel.__name__ == "fwd_h_kernel"]
    assert len(walk) == 1 and walk[0].kwargs["WS"] and not walk[0].kwargs["T_FORM"]
    again = [gdnlab.chunk_gated_delta_rule(**kw, backend="fast", walk_ws=True) for _ in range(2)]
    assert all(torch.equal(a, b) for r in again for a, b in zip(r, want))
    wide = gdnlab.chunk_gated_delta_rule(**kw, backend="fast", poison=True, walk_ws=True, index64=True)
    assert all(torch.equal(a, b) for a, b in zip(wide, want))  # int64 row indices: the same tiles
    sized = backends.fast_by_size(programs=16 * 4 * 132 // 8, walkers=64, sms=132)
    assert sized.get("walk_t") and sized.get("prologue_solve") == "moves"
    settled = backends._settle_output({**backends.FAST, **sized, "walk_ws": True}, dict(walk_ws=True),
                                      backends.FAST, sized)
    assert settled["walk_ws"] and not settled["walk_t"]
    assert settled.get("prologue_solve", backends.SOLVE) == backends.FAST.get("prologue_solve", backends.SOLVE)
    with pytest.raises(ValueError, match="walk_k_once"):
        backends._settle_output({**backends.FAST, **sized, "walk_ws": True, "walk_k_once": True},
                                dict(walk_ws=True, walk_k_once=True), backends.FAST, sized)
    batch = backends.fast_by_size(programs=8 * 32 * 32, walkers=8 * 32 * 2, sms=132)
    assert batch.get("fused_output")  # a size rule's fused walk: walk_ws=False leaves it, walk_ws=True replaces it
    off = backends._settle_output({**backends.FAST, **batch, "walk_ws": False}, dict(walk_ws=False), backends.FAST,
                                  batch)
    on = backends._settle_output({**backends.FAST, **batch, "walk_ws": True}, dict(walk_ws=True), backends.FAST,
                                 batch)
    assert off["fused_output"] and not on["fused_output"] and on["BV"] == backends.FAST["BV"]


@pytest.mark.parametrize("opts, match", [(dict(walk_t=True), "name one"), (dict(fused_output=True), "fused_output")])
def test_walk_ws_refuses_the_walks_it_is_not(opts, match):
    kw = CASES_BY_NAME["t65"].inputs().kwargs()
    with pytest.raises(ValueError, match=match):
        gdnlab.chunk_gated_delta_rule(**kw, backend="fast", walk_ws=True, **opts)
    with pytest.raises(TypeError, match="walk_ws"):
        gdnlab.chunk_gated_delta_rule(**kw, backend="fused_fixed", walk_ws=True)


def test_split_scores_is_closer_to_float64_where_the_state_decays_within_a_chunk():
    """Finding (speed notes item 74, CPU interpreter with the GPU's roundings, CuteDSL's own gate): the gated scores
    as two bf16 terms lower the output's max and mean error against the float64 recurrence below 0.9x fast's; the
    final state is fast's, every element is written, and the fused walk's output (the batches' layout) is the
    output kernel's, bit for bit, with the split as without it."""
    kw = make_inputs(T=256, H=2, HV=4, K=64, V=64, regime="cutedsl", seed=1, initial_state=True,
                     device="cpu").kwargs()
    ref = recurrent_gated_delta_rule_ref(**{**kw, "output_final_state": False})[0].double()
    o, ht = gdnlab.chunk_gated_delta_rule(**kw, backend="fast", poison=True)
    so, sht = gdnlab.chunk_gated_delta_rule(**kw, backend="fast", poison=True, split_scores=True)
    fo, fht = gdnlab.chunk_gated_delta_rule(**kw, backend="fast", poison=True, split_scores=True, fused_output=True,
                                            BV=64)
    assert not torch.isnan(so).any() and torch.equal(sht, ht) and not torch.equal(so, o)
    assert torch.equal(fo, so) and torch.equal(fht, ht)
    e, s = (o.double() - ref).abs(), (so.double() - ref).abs()
    assert s.max() < 0.9 * e.max() and s.mean() < 0.9 * e.mean(), (float(s.max() / e.max()), float(s.mean() / e.mean()))


def test_split_scores_is_a_two_kernel_option():
    kw = CASES_BY_NAME["var_pad"].inputs().kwargs()
    with pytest.raises(TypeError, match="split_scores"):
        gdnlab.chunk_gated_delta_rule(**kw, backend="fused_fixed", split_scores=True)
