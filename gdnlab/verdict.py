"""A conformance verdict for any backend: does a kernel compute Gated DeltaNet prefill, on its own terms?

:func:`verdict` runs a registered backend (``gdnlab.backends.chunk_gated_delta_rule(..., backend=name)``) on a small
set of seeded cases and checks, each against the float64 reference (:func:`gdnlab.experiments.reference`):

``runs``
    the call returns ``(o, final_state)`` with the input's shapes and no exception.
``inputs unchanged``
    every input tensor is bit-equal after the call to a copy taken before it.
``output dtype``
    the output has q's dtype (the API contract, docs/design.md §5), or float64 (the reference's).
``call contract``
    the arguments every other case leaves at one value, each set the other way once on a two-chunk case with an
    initial state: an explicit ``scale``; ``use_qk_l2norm_in_kernel=False`` on q and k whose rows are not unit
    length; ``state_v_first=True`` (the initial state given and the final state returned as ``[N, HV, V, K]``);
    ``output_final_state=False`` (None returned in place of the final state). Each compares the backend with its
    own default call by a relation that honouring the argument keeps (the output is linear in scale and, without
    the norm, in q; the V-first call is the K-first one transposed), within a tenth of what ignoring the argument
    changes, so a kernel's accuracy is left to the budget checks (_contract_checks).
``outputs written``
    every valid output row and every final-state element is finite. Backends that take ``poison`` (the lab's own)
    are run with ``poison=True``, so an element no kernel wrote stays NaN; NaN never passes any check.
``padding rows zero``
    the rows of a ragged buffer after ``cu_seqlens[-1]`` are zero in the output.
``output budget`` / ``final-state budget``
    the CuteDSL test's budgets (:data:`gdnlab.metrics.CUTEDSL_OUTPUT`, :data:`gdnlab.metrics.CUTEDSL_STATE`; the
    reference state cast to the returned state's dtype first) on the cases drawn as the conformance matrix draws
    them (:class:`gdnlab.cases.Case`: the "decay" regime with its default gate, initial-state scale 0.05).
``initial state used``
    on one chunk with a slow gate (mean(-g) = 0.01, so the initial state still weighs on the last token and on the
    final state), the output and the final state must each be within a tenth of the initial state's own effect
    (max |ref(h0) - ref(no h0)|) of the reference *with* the initial state. A kernel that drops or mis-reads
    ``initial_state`` lands about one effect away and fails, whatever its rounding.
``error growth``
    rule fixed before any data was looked at: on one sequence without initial state, the max output error of the
    prefixes of 1, 2, 4 (quick) or 1, 2, 4, 8, 16 chunks is fitted as ``log(err) = a + s log(chunks)`` (least
    squares) for the candidate and for the two-kernel path on the same inputs; the candidate fails when its slope
    ``s`` exceeds the two-kernel path's by more than :data:`GROWTH_MARGIN` = 0.5 (its error would grow like
    chunks^0.5 faster: 32x worse than the baseline's at 1024 chunks). The first chunk has no state entering it, so
    the slope measures what the carried state adds.

Nothing here is specific to the lab's kernels: a peer (FlashInfer, FlashQLA, FLA) registered on a CUDA machine is
judged by the same cases with ``device="cuda"``. ``quick=True`` (the CPU default) draws 1 key head, 2 value heads,
K = V = 128 and at most 256 tokens, so the Triton interpreter judges a backend in seconds; ``quick=False`` draws the
CuteDSL shape (4 key heads, 8 value heads) and longer sequences.

From a device script::

    from gdnlab.backends import register_backend
    from gdnlab.verdict import verdict
    register_backend("flashinfer", my_flashinfer_wrapper)       # takes chunk_gated_delta_rule's arguments
    v = verdict("flashinfer", quick=False, device="cuda")
    v.table().to_csv("verdict_flashinfer.csv", index=False)     # one row per check: PASS/FAIL, value, limit, reason
    print(v.summary())
"""
from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import pandas as pd
import torch

from gdnlab import backends as _backends
from gdnlab import metrics
from gdnlab.experiments import poisoned_call, reference
from gdnlab.inputs import GDNInputs, make_inputs
from gdnlab.kernel_params import BT
from gdnlab.reference import l2norm

__all__ = ["GROWTH_MARGIN", "H0_EFFECT_FRACTION", "VerdictCase", "Check", "Verdict", "quick_cases", "full_cases",
           "growth_chunks", "growth_slope", "verdict"]

#: Largest excess of the candidate's log-log error-growth slope over the two-kernel path's (fixed a priori).
GROWTH_MARGIN = 0.5
#: The output and final state must lie within this fraction of the initial state's effect of the h0 reference.
H0_EFFECT_FRACTION = 0.1


@dataclass(frozen=True)
class VerdictCase:
    """One seeded problem of the verdict (arguments of :func:`gdnlab.inputs.make_inputs`) and the checks it feeds:
    ``budget`` (output and final-state budgets), ``h0`` (initial state used)."""

    name: str
    T: int = 64
    B: int = 1
    seqlens: tuple[int, ...] | None = None
    pad: int = 0
    initial_state: bool = True
    state_dtype: torch.dtype = torch.float32
    decay: float | None = None
    seed: int = 0
    purpose: str = "budget"

    def inputs(self, shape: dict[str, int], device: str | torch.device) -> GDNInputs:
        """The case's inputs (regime "decay", bf16 q/k/v/beta) with head shape ``shape`` on ``device``."""
        return make_inputs(B=self.B, T=self.T, seqlens=None if self.seqlens is None else list(self.seqlens),
                           pad=self.pad, regime="decay", decay=self.decay, seed=self.seed,
                           initial_state=self.initial_state, state_dtype=self.state_dtype, device=device, **shape)


_QUICK_SHAPE = dict(H=1, HV=2, K=128, V=128)
_FULL_SHAPE = dict(H=4, HV=8, K=128, V=128)


def quick_cases() -> tuple[VerdictCase, ...]:
    """Seconds on the CPU interpreter: an unaligned dense sequence with initial state, a ragged batch with 1-token
    and chunk-edge sequences, bf16 state and padding rows, a dense batch without initial state, and the slow-gate
    initial-state case."""
    return (
        VerdictCase("dense_t129_h0", T=129, seed=201),
        VerdictCase("ragged_pad_bf16", seqlens=(1, 63, 65), pad=7, state_dtype=torch.bfloat16, seed=202),
        VerdictCase("b2_t65_noh0", B=2, T=65, initial_state=False, seed=203),
        VerdictCase("h0_slow_gate", T=64, decay=0.01, seed=204, purpose="h0"),
    )


def full_cases() -> tuple[VerdictCase, ...]:
    """The quick cases plus single tokens, a long unaligned sequence, many short sequences and padding without
    initial state."""
    return quick_cases() + (
        VerdictCase("t1", T=1, seed=211),
        VerdictCase("t513", T=513, seed=212),
        VerdictCase("var_16short", seqlens=(3, 1, 7, 12, 5, 9, 2, 16, 4, 11, 8, 1, 6, 10, 13, 15), seed=213),
        VerdictCase("var_pad_bf16_noh0", seqlens=(100, 28, 129), pad=7, state_dtype=torch.bfloat16,
                    initial_state=False, seed=214),
    )


def growth_chunks(quick: bool) -> list[int]:
    """Chunk counts of the error-growth fit."""
    return [1, 2, 4] if quick else [1, 2, 4, 8, 16]


#: Order of failed checks in a summary: what is wrong before how large the error is.
_ORDER = {"runs": 0, "inputs unchanged": 1, "output dtype": 2, "outputs written": 3, "padding rows zero": 4,
          "initial state used": 5, "call contract": 6, "error growth": 7, "output budget": 8, "final-state budget": 9}


def _rank(c: Check) -> int:
    name = c.check.split(" (")[0]
    return _ORDER.get("error growth" if name.startswith("error growth") else name, 99)


@dataclass
class Check:
    """One check on one case: pass or fail, the measured value and its limit, and why."""

    check: str
    case: str
    ok: bool
    value: float = math.nan
    limit: float = math.nan
    reason: str = ""


@dataclass
class Verdict:
    """The checks of one backend. ``ok`` only when every check passed (and there was at least one)."""

    backend: str
    device: str
    quick: bool
    checks: list[Check] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """True when every check passed."""
        return bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def failures(self) -> list[Check]:
        """The checks that failed, the diagnostic ones (which say *what* is wrong) before the budgets."""
        return sorted((c for c in self.checks if not c.ok), key=_rank)

    def table(self) -> pd.DataFrame:
        """One row per check: check, case, PASS/FAIL, value, limit, reason."""
        df = pd.DataFrame([asdict(c) for c in self.checks])
        if df.empty:
            return df
        df.insert(0, "backend", self.backend)
        df["result"] = df.pop("ok").map({True: "PASS", False: "FAIL"})
        return df[["backend", "check", "case", "result", "value", "limit", "reason"]]

    def summary(self) -> str:
        """One line: PASS, or FAIL with the failed checks named."""
        if self.ok:
            return f"{self.backend}: PASS ({len(self.checks)} checks)"
        failed = list(dict.fromkeys(c.check for c in self.failures))
        return (f"{self.backend}: FAIL ({len(self.failures)} of {len(self.checks)} checks: {', '.join(failed)}); "
                + "; ".join(f"{c.check} [{c.case}]: {c.reason}" for c in self.failures[:4]))

    def assert_ok(self) -> Verdict:
        """Raise AssertionError naming every failed check; returns self when all passed."""
        if not self.ok:
            raise AssertionError(self.summary())
        return self

    def _repr_markdown_(self) -> str:
        word = "passes" if self.ok else "**fails**"
        lines = [f"**Verdict.** `{self.backend}` {word} the conformance checks ({len(self.checks)} checks, "
                 f"{'quick' if self.quick else 'full'} set, {self.device})."]
        for c in self.failures:
            lines.append(f"- {c.check} [{c.case}]: {c.reason}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


# ------------------------------------------------------------------------------------------------------- running

def _call(backend: str, inp: GDNInputs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One call with ``output_final_state=True``, poisoned where the backend takes it (experiments.poisoned_call)."""
    return poisoned_call(inp.kwargs(), backend)


def _tensors(inp: GDNInputs) -> dict[str, torch.Tensor]:
    return {k: v for k, v in inp.kwargs().items() if isinstance(v, torch.Tensor)}


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool(
        torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)))


def _fmt(x: float) -> str:
    return f"{x:.3g}" if math.isfinite(x) else str(x)


def _run_case(backend: str, case: VerdictCase, inp: GDNInputs) -> tuple[list[Check], Any]:
    """The generic checks of one call; returns them and (o, ht) or None when the call failed."""
    before = {k: v.clone() for k, v in _tensors(inp).items()}
    try:
        got = _call(backend, inp)
    except Exception as e:  # noqa: BLE001 - a backend that raises fails its verdict, with the error as the reason
        return [Check("runs", case.name, False, reason=f"{type(e).__name__}: {str(e)[:300]}")], None
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        what = f"a {type(got).__name__} of {len(got)}" if isinstance(got, (tuple, list)) else type(got).__name__
        return [Check("runs", case.name, False, reason=f"returned {what}; a backend returns (o, final_state), "
                                                        "final_state None when output_final_state=False")], None
    o, ht = got
    checks = []
    changed = [k for k, v in _tensors(inp).items() if not _same_bits(v, before[k])]
    checks.append(Check("inputs unchanged", case.name, not changed, float(len(changed)), 0.0,
                        f"modified: {', '.join(changed)}" if changed else ""))
    want_o = (*inp.v.shape[:3], inp.v.shape[3])
    want_h = (inp.n_seqs, inp.v.shape[2], inp.q.shape[3], inp.v.shape[3])
    bad_shape = []
    if not isinstance(o, torch.Tensor) or tuple(o.shape) != want_o:
        bad_shape.append(f"o shape {tuple(o.shape) if isinstance(o, torch.Tensor) else type(o).__name__}, "
                         f"expected {want_o}")
    if not isinstance(ht, torch.Tensor) or tuple(ht.shape) != want_h:
        bad_shape.append(f"final state {tuple(ht.shape) if isinstance(ht, torch.Tensor) else ht!r}, expected "
                         f"{want_h} (output_final_state=True)")
    checks.append(Check("runs", case.name, not bad_shape, reason="; ".join(bad_shape)))
    if bad_shape:
        return checks, None
    good_dtype = o.dtype in (inp.q.dtype, torch.float64)  # float64: the reference's, lossless
    checks.append(Check("output dtype", case.name, good_dtype,
                        reason="" if good_dtype else f"o is {o.dtype}, q is {inp.q.dtype}"))
    mask = metrics.valid_rows(inp.cu_seqlens.cpu() if inp.cu_seqlens is not None else None, o.shape[1], o.shape[0])
    valid = o[0][mask.to(o.device)] if inp.cu_seqlens is not None else o
    nonfinite = int((~torch.isfinite(valid.float())).sum()) + int((~torch.isfinite(ht.float())).sum())
    checks.append(Check("outputs written", case.name, nonfinite == 0, float(nonfinite), 0.0,
                        f"{nonfinite} output or final-state elements not finite (NaN: never written)"
                        if nonfinite else ""))
    if inp.cu_seqlens is not None and not bool(mask.all()):
        pad = o[0][~mask.to(o.device)]
        nz = int((pad != 0).sum()) if bool(torch.isfinite(pad.float()).all()) else pad.numel()
        checks.append(Check("padding rows zero", case.name, nz == 0, float(nz), 0.0,
                            f"{nz} of {pad.numel()} padding-row elements are not zero" if nz else ""))
    return checks, (o, ht, mask if inp.cu_seqlens is not None else None)


def _budget(name: str, case: str, budget: metrics.Budget, out: torch.Tensor, ref: torch.Tensor,
            mask: torch.Tensor | None) -> list[Check]:
    ok, errs = budget.check(out, ref, mask)
    rows = []
    for measure, lim in budget.limits().items():
        v = errs[measure]
        good = v < lim  # False for NaN
        rows.append(Check(f"{name} ({measure})", case, good, v, lim,
                          "" if good else f"{measure} {_fmt(v)} not below the {budget.name} limit {lim:g}"))
    return rows


def _h0_checks(case: VerdictCase, inp: GDNInputs, o: torch.Tensor, ht: torch.Tensor,
               refs: tuple[torch.Tensor, torch.Tensor]) -> list[Check]:
    o_ref, s_ref = refs
    o_0, s_0 = reference(replace(inp, initial_state=None))
    rows = []
    for what, out, ref, ref0 in (("output", o, o_ref, o_0), ("final state", ht, s_ref, s_0)):
        effect = metrics.errors(ref0, ref)["max_abs"]
        err = metrics.errors(out, ref.to(out.dtype) if what == "final state" else ref)["max_abs"]
        err0 = metrics.errors(out, ref0)["max_abs"]
        lim = H0_EFFECT_FRACTION * effect
        good = err < lim
        why = ""
        if not good:
            why = (f"{what} error {_fmt(err)} against the reference with initial_state is not below "
                   f"{H0_EFFECT_FRACTION:g} x the initial state's effect {_fmt(effect)}")
            if err0 < err:
                why += f"; it is closer to the reference without initial_state ({_fmt(err0)}): initial_state ignored?"
        rows.append(Check(f"initial state used ({what})", case.name, good, err, lim, why))
    return rows


def _contract_checks(backend: str, shape: dict[str, int], device: str | torch.device) -> list[Check]:
    """The call-contract checks of this module's docstring, one per argument. Each compares the backend with its
    own default call on the same case (decay 0.01, so that the initial state weighs), by a relation a kernel that
    honours the argument keeps exactly or to its output's rounding, within a tenth (H0_EFFECT_FRACTION) of what
    ignoring the argument changes; the kernel's own error cancels, and stays the budget checks' to judge:

    - ``scale``: the output is linear in it: the call at 0.37 times the default scale against 0.37 times the
      default call;
    - ``use_qk_l2norm_in_kernel=False`` (q and k rows of length 1.3 and 0.7): the output is linear in q, which a
      kernel that normalises anyway breaks: the call with 2 q (exact in bf16) against twice the call with q;
    - ``state_v_first=True``: the output and the final state (transposed back) against the K-first call's, within
      a tenth of what reading the V-first state as K-first does to the reference's output and of the final
      state's own transposition;
    - ``output_final_state=False``: None in place of the final state."""
    inp = VerdictCase("contract", T=BT + 33, decay=0.01, seed=231).inputs(shape, device)
    K = inp.q.shape[-1]
    frac = H0_EFFECT_FRACTION
    rows = []

    def call(kw: dict[str, Any], name: str) -> tuple[Any, Any] | None:
        try:
            o, ht = poisoned_call(kw, backend)
        except Exception as e:  # noqa: BLE001 - refusing a documented argument fails the check
            rows.append(Check(name, "contract", False, reason=f"{type(e).__name__}: {str(e)[:200]}"))
            return None
        if not (isinstance(o, torch.Tensor) and o.shape == inp.v.shape):
            rows.append(Check(name, "contract", False, reason=f"o is {tuple(getattr(o, 'shape', ())) or o!r}, "
                                                              f"expected {tuple(inp.v.shape)}"))
            return None
        return o, ht

    def judge(name: str, err: float, lim: float, why: str) -> None:
        rows.append(Check(name, "contract", err < lim, err, lim, "" if err < lim else why))  # NaN fails

    default = call(inp.kwargs(), "call contract (default call)")
    if default is None:
        return rows
    o_d, ht_d = default
    ratio = 0.37
    got = call({**inp.kwargs(), "scale": ratio * K ** -0.5}, "call contract (scale)")
    if got is not None:
        err = metrics.errors(got[0], ratio * o_d.double())["max_abs"]
        judge("call contract (scale)", err, frac * (1 - ratio) * float(o_d.double().abs().max()),
              f"output {_fmt(err)} from {ratio} times the default call's (the output is linear in scale): scale "
              f"ignored or misapplied?")
    raw = replace(inp, q=(1.3 * l2norm(inp.q.float())).to(inp.q.dtype),
                  k=(0.7 * l2norm(inp.k.float())).to(inp.k.dtype), use_qk_l2norm_in_kernel=False)
    one = call(raw.kwargs(), "call contract (use_qk_l2norm_in_kernel=False)")
    two = call({**raw.kwargs(), "q": 2 * raw.q}, "call contract (use_qk_l2norm_in_kernel=False)") if one else None
    if one is not None and two is not None:
        err = metrics.errors(two[0], 2 * one[0].double())["max_abs"]
        judge("call contract (use_qk_l2norm_in_kernel=False)", err, frac * float(one[0].double().abs().max()),
              f"the output with 2 q is {_fmt(err)} from twice the output with q: q normalised anyway?")
    v_first = inp.initial_state.transpose(-1, -2).contiguous()
    got = call({**inp.kwargs(), "initial_state": v_first, "state_v_first": True}, "call contract (state_v_first)")
    if got is not None:
        o, ht = got
        name = "call contract (state_v_first)"
        if not (isinstance(ht, torch.Tensor) and ht.shape == ht_d.transpose(-1, -2).shape):
            rows.append(Check(name, "contract", False, reason=(
                f"final state {tuple(ht.shape) if isinstance(ht, torch.Tensor) else ht!r}, expected "
                f"{tuple(ht_d.transpose(-1, -2).shape)} (V-first)")))
        else:
            misread = metrics.errors(reference(inp)[0], reference(replace(inp, initial_state=v_first))[0])["max_abs"]
            e_o, e_h = metrics.errors(o, o_d)["max_abs"], metrics.errors(ht.transpose(-1, -2), ht_d)["max_abs"]
            lim_o, lim_h = frac * misread, frac * metrics.errors(ht_d, ht_d.transpose(-1, -2))["max_abs"]
            err = max(e_o / lim_o, e_h / lim_h) if lim_o > 0 and lim_h > 0 else math.nan
            judge(name, err, 1.0, f"output {_fmt(e_o)} and final state {_fmt(e_h)} from the K-first call's "
                                  f"(limits {_fmt(lim_o)}, {_fmt(lim_h)}): state_v_first ignored?")
    got = call({**inp.kwargs(), "output_final_state": False}, "call contract (output_final_state=False)")
    if got is not None:
        rows.append(Check("call contract (output_final_state=False)", "contract", got[1] is None, reason=(
            "" if got[1] is None else f"returned a final state ({type(got[1]).__name__}) where none was asked "
                                      f"for; expected None")))
    return rows


def growth_slope(chunks: Sequence[int], errs: Sequence[float]) -> float:
    """Least-squares slope of log(err) against log(chunks); NaN when an error is not finite and positive."""
    if any(not (math.isfinite(e) and e > 0) for e in errs) or len(chunks) < 2:
        return math.nan
    x = [math.log(c) for c in chunks]
    y = [math.log(e) for e in errs]
    mx, my = sum(x) / len(x), sum(y) / len(y)
    return sum((a - mx) * (b - my) for a, b in zip(x, y)) / sum((a - mx) ** 2 for a in x)


#: The baseline's growth errors, by (name, callable id, quick, device): the same seeded run for every candidate.
_BASELINE_GROWTH: dict[tuple[str, int, bool, str], list[float]] = {}


def _growth(backend: str, baseline: str, quick: bool, shape: dict[str, int],
            device: str | torch.device) -> tuple[list[Check], dict[str, Any]]:
    """The error-growth check (prefixes of one sequence: the kernels are causal, so the first n rows of a run are
    the run of the first n tokens)."""
    chunks = growth_chunks(quick)
    inp = VerdictCase("growth", T=BT * max(chunks), initial_state=False, seed=221).inputs(shape, device)
    o_ref, _ = reference(inp)
    errs: dict[str, list[float]] = {}
    for b in dict.fromkeys([baseline, backend]):
        key = (b, id(_backends.get_backend(b)), quick, str(device))
        if b == baseline and key in _BASELINE_GROWTH:
            errs[b] = _BASELINE_GROWTH[key]
            continue
        try:
            o, _ = _call(b, inp)
        except Exception as e:  # noqa: BLE001
            return [Check(f"error growth vs {baseline}", "growth", False,
                          reason=f"{b} raised {type(e).__name__}: {str(e)[:200]}")], {}
        errs[b] = [metrics.errors(o[:, :BT * n], o_ref[:, :BT * n])["max_abs"] for n in chunks]
        if b == baseline:
            _BASELINE_GROWTH[key] = errs[b]
    s_c, s_b = growth_slope(chunks, errs[backend]), growth_slope(chunks, errs[baseline])
    excess = s_c - s_b
    good = excess <= GROWTH_MARGIN  # False for NaN
    detail = ", ".join(f"{n}: {_fmt(e)}" for n, e in zip(chunks, errs[backend]))
    why = "" if good else (f"log-log slope of max error vs chunks {_fmt(s_c)} exceeds {baseline}'s {_fmt(s_b)} by "
                           f"{_fmt(excess)} (margin {GROWTH_MARGIN:g}); max error by chunks {detail}")
    return [Check("error growth vs " + baseline, "growth", good, excess, GROWTH_MARGIN, why)], dict(
        chunks=chunks, errors=errs, slopes={backend: s_c, baseline: s_b})


def verdict(backend: str, *, quick: bool = True, device: str | torch.device = "cpu", baseline: str = "two_kernel",
            cases: Sequence[VerdictCase] | None = None) -> Verdict:
    """Run every check of this module's docstring on ``backend`` and return its :class:`Verdict` (never raises for
    a misbehaving backend: a raised error is a failed ``runs`` check). ``quick``: the quick case set and shape (CPU
    seconds); else the full set at the CuteDSL shape. ``baseline``: the path the error growth is compared with."""
    _backends.get_backend(backend)  # ValueError naming the known backends
    t0 = time.time()
    shape = _QUICK_SHAPE if quick else _FULL_SHAPE
    cases = list(cases) if cases is not None else list(quick_cases() if quick else full_cases())
    v = Verdict(backend=backend, device=str(device), quick=quick)
    for case in cases:
        inp = case.inputs(shape, device)
        o_ref, s_ref = reference(inp)  # before the call: a backend that writes into its inputs is judged on the truth
        rows, res = _run_case(backend, case, inp)
        v.checks += rows
        if res is None:
            continue
        o, ht, mask = res
        if case.purpose == "h0":
            v.checks += _h0_checks(case, case.inputs(shape, device), o, ht, (o_ref, s_ref))
        else:
            v.checks += _budget("output budget", case.name, metrics.CUTEDSL_OUTPUT, o, o_ref, mask)
            v.checks += _budget("final-state budget", case.name, metrics.CUTEDSL_STATE, ht, s_ref.to(ht.dtype), None)
    v.checks += _contract_checks(backend, shape, device)
    rows, _ = _growth(backend, baseline, quick, shape, device)
    v.checks += rows
    v.seconds = round(time.time() - t0, 1)
    return v
