"""The conformance verdict (gdnlab.verdict, `gdnlab check`): a correct kernel passes, each kind of broken kernel
fails with the check that names what is wrong."""
from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import pytest
import torch

import gdnlab
from gdnlab.backends import register_backend
from gdnlab.compile_matrix import RELEASES, committed
from gdnlab.verdict import GROWTH_MARGIN, growth_slope, verdict

# A plugin as a user would write it: the float64 reference, but the initial state dropped.
FORGETFUL = textwrap.dedent("""
    import gdnlab
    from gdnlab.backends import register_backend

    def forgetful(q, k, v, g, beta, initial_state=None, **kw):
        o, ht = gdnlab.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=None, backend="reference", **kw)
        return o.to(q.dtype), ht

    register_backend("forgetful", forgetful, overwrite=True)
""")


def _ref(q, k, v, g, beta, **kw):
    """The float64 reference as a kernel returns it: the output in q's dtype."""
    o, ht = gdnlab.chunk_gated_delta_rule(q, k, v, g, beta, backend="reference", **kw)
    return o.to(q.dtype), ht


def _mutating(q, k, v, g, beta, **kw):
    o, ht = _ref(q, k, v, g, beta, **kw)
    beta.mul_(0.5)  # writes into its input
    return o, ht


def _holes(q, k, v, g, beta, **kw):
    o, ht = _ref(q, k, v, g, beta, **kw)
    o = o.clone()
    o[:, -1] = float("nan")  # the last row never written
    return o, ht


def _dirty_padding(q, k, v, g, beta, cu_seqlens=None, **kw):
    o, ht = _ref(q, k, v, g, beta, cu_seqlens=cu_seqlens, **kw)
    if cu_seqlens is not None:
        o = o.clone()
        o[:, int(cu_seqlens[-1]):] = 1.0
    return o, ht


def _no_poison(q, k, v, g, beta, *, poison=None, **kw):
    if poison is not None:  # a library behind **kwargs that does not know the lab's option
        raise TypeError("chunk() got an unexpected keyword argument 'poison'")
    return _ref(q, k, v, g, beta, **kw)


def _raises(q, k, v, g, beta, **kw):
    raise RuntimeError("no kernel here")


@pytest.fixture(scope="module", autouse=True)
def _registered():
    for name, fn in (("v_reference", _ref), ("v_mutating", _mutating), ("v_holes", _holes),
                     ("v_dirty_padding", _dirty_padding), ("v_raises", _raises),
                     ("v_no_poison", _no_poison)):
        register_backend(name, fn, overwrite=True)


def _failed(v) -> set[str]:
    return {c.check.split(" (")[0] for c in v.failures}


def test_growth_slope_recovers_a_power_law():
    assert growth_slope([1, 2, 4, 8], [3e-4 * n ** 1.5 for n in [1, 2, 4, 8]]) == pytest.approx(1.5)
    assert math.isnan(growth_slope([1, 2], [1e-3, math.nan]))
    assert math.isnan(growth_slope([1, 2], [0.0, 1e-3]))


def test_reference_passes_and_each_defect_fails_with_its_check():
    assert verdict("v_reference").ok
    assert verdict("v_no_poison").ok  # a peer that refuses the lab's poison option is judged without it
    cases = {"v_mutating": "inputs unchanged", "v_holes": "outputs written", "v_dirty_padding": "padding rows zero",
             "v_raises": "runs"}
    for backend, check in cases.items():
        v = verdict(backend)
        assert not v.ok and check in _failed(v), (backend, v.summary())
        assert v.failures[0].check.startswith(check), v.summary()  # the diagnosis comes first
        assert check in v.summary()


@pytest.mark.xdist_group("verdict_triton")
def test_lab_kernels_two_kernel_and_fixed_pass_shipped_fails():
    for b in ("two_kernel", "fused_fixed"):
        v = verdict(b)
        assert v.ok, v.summary()
    v = verdict("fused_shipped")
    assert not v.ok
    assert {"error growth vs two_kernel", "output budget"} <= _failed(v), v.summary()
    assert not {"call contract", "output dtype"} & _failed(v), v.summary()  # its defect is accuracy, not the call
    growth = next(c for c in v.checks if c.check.startswith("error growth"))
    assert growth.value > GROWTH_MARGIN and growth.limit == GROWTH_MARGIN
    assert "final-state budget" not in _failed(v)  # the state carry is right, as the report says


def test_forgetful_plugin_fails_on_the_initial_state_check(tmp_path):
    (tmp_path / "forgetful.py").write_text(FORGETFUL)
    r = subprocess.run([sys.executable, "-m", "gdnlab.cli", "check", "--plugin", "forgetful", "--backend",
                        "forgetful", "--csv", str(tmp_path / "v.csv")], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    fails = [ln for ln in r.stdout.splitlines() if ln.startswith("FAIL ")]
    assert fails and fails[0].startswith("FAIL initial state used"), r.stdout[-3000:]
    assert "initial_state ignored" in fails[0]
    assert "forgetful: FAIL" in r.stdout


def _sloppy(q, k, v, g, beta, scale=None, use_qk_l2norm_in_kernel=False, output_final_state=False,
            state_v_first=False, **kw):
    """A kernel that ignores four of the call's arguments (always the default scale, always normalising, always
    returning the final state, K-first) and returns fp32."""
    o, ht = gdnlab.chunk_gated_delta_rule(q, k, v, g, beta, backend="reference", use_qk_l2norm_in_kernel=True,
                                          output_final_state=True, **kw)
    return o.float(), ht


def test_the_call_contract_catches_ignored_arguments_and_the_output_dtype():
    register_backend("v_sloppy", _sloppy, overwrite=True)
    v = verdict("v_sloppy")
    failed = {c.check for c in v.failures}
    assert {f"call contract ({a})" for a in ("scale", "use_qk_l2norm_in_kernel=False", "state_v_first",
                                            "output_final_state=False")} <= failed, v.summary()
    assert "output dtype" in failed and v.failures[0].check == "output dtype"
    assert not any(c.check.startswith("output budget") for c in v.failures)  # the default call is right
    reasons = {c.check: c.reason for c in v.failures}
    assert "expected None" in reasons["call contract (output_final_state=False)"]
    assert "torch.float32" in reasons["output dtype"]


def test_check_cli_refuses_an_unknown_backend(capsys):
    from gdnlab.cli import main
    assert main(["check", "--backend", "nope"]) == 2
    assert "--backend 'nope' is not registered" in capsys.readouterr().err


def test_nan_never_passes():
    """A NaN-producing backend fails, and NaN never passes a budget (every comparison with NaN is False)."""
    register_backend("v_nan", lambda q, k, v, g, beta, **kw: tuple(
        None if x is None else torch.full_like(x, float("nan")) for x in _ref(q, k, v, g, beta, **kw)),
        overwrite=True)
    v = verdict("v_nan")
    assert not v.ok
    budgets = [c for c in v.checks if c.check.startswith("output budget")]
    assert budgets and not any(c.ok for c in budgets)


def test_candidate_verdict_asserts_the_expected_outcome():
    """findings.candidate_verdict: the lab's known-defective kernel must fail, any other candidate must pass; the
    sentence (or the AssertionError) names the failed checks."""
    from gdnlab import findings
    from gdnlab.verdict import Check, Verdict
    good = Verdict("mine", "cpu", True, [Check("runs", "c", True), Check("output budget (max_abs)", "c", True)])
    bad = Verdict("mine", "cpu", True, [Check("runs", "c", True),
                                        Check("initial state used (output)", "h0", False, 0.1, 0.01, "ignored?")])
    assert ": PASS" in findings.candidate_verdict(good).claim
    with pytest.raises(AssertionError, match="expected to pass.*initial state used"):
        findings.candidate_verdict(bad)
    shipped_bad = Verdict("fused_shipped", "cpu", True, bad.checks)
    assert "FAIL, as expected" in findings.candidate_verdict(shipped_bad).claim
    with pytest.raises(AssertionError, match="expected to fail"):
        findings.candidate_verdict(Verdict("fused_shipped", "cpu", True, good.checks))
    assert not Verdict("x", "cpu", True).ok  # no checks is no verdict


def test_bv8_answer_from_the_committed_release_sweep():
    """The BV = 8 answer is computed from the release sweep: it names a rejecting release, and refuses a sweep in which
    no release rejects BV = 8 on gfx1151."""
    import pandas as pd

    from gdnlab import findings
    rel = pd.read_csv(committed(RELEASES))
    f = findings.bv8_by_release(rel)
    assert "rejected at build" in f.claim and f.source == "bv8_by_release"
    assert "REJECTED" in f.numbers["bv8"].values()
    ok = rel[~((rel.target == "hip:gfx1151") & (rel.BV == 8) & (rel.status != "ok"))]
    with pytest.raises(AssertionError, match="expected some release to reject BV=8"):
        findings.bv8_by_release(ok)


def test_check_cli_tells_a_broken_plugin_and_an_unwritable_csv_from_a_fail(tmp_path, monkeypatch, capsys):
    from gdnlab.cli import main
    (tmp_path / "broken_plugin_v.py").write_text("raise ValueError('backend name taken')\n")
    monkeypatch.chdir(tmp_path)
    assert main(["check", "--plugin", "broken_plugin_v", "--backend", "two_kernel"]) == 2
    assert "ValueError: backend name taken" in capsys.readouterr().err
    assert main(["check", "--plugin", "broken_plugin_v.py", "--backend", "two_kernel"]) == 2
    assert "name the module: 'broken_plugin_v'" in capsys.readouterr().err
    register_backend("v_reference", _ref, overwrite=True)
    assert main(["check", "--backend", "v_reference", "--csv", str(tmp_path / "no" / "such" / "v.csv")]) == 2
    out = capsys.readouterr()
    assert "v_reference: PASS" in out.out and "cannot write" in out.err


def test_a_backend_returning_only_the_output_is_told_what_to_return():
    register_backend("v_only_o", lambda q, k, v, g, beta, **kw: _ref(q, k, v, g, beta, **kw)[0], overwrite=True)
    v = verdict("v_only_o")
    assert not v.ok and v.failures[0].check == "runs"
    assert "returns (o, final_state)" in v.failures[0].reason
