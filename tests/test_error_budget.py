"""gdnlab.error_budget: the float64 emulation with no rounding is the reference, with every rounding it errs like the
two-kernel path it models, and it refuses what it does not model."""
from __future__ import annotations

import pytest
import torch

import gdnlab
from gdnlab import error_budget as eb
from gdnlab.reference import recurrent_gated_delta_rule_ref
from tests.conftest import small_inputs


def _inputs(**kw):
    return small_inputs(T=200, dtype=torch.bfloat16, state_dtype=torch.float32, seed=3, **kw)


def test_without_roundings_it_is_the_float64_recurrence():
    inp = _inputs()
    ref, _ = recurrent_gated_delta_rule_ref(**inp.kwargs())
    assert torch.allclose(eb.emulate(inp, ()), ref[0].double(), rtol=0, atol=1e-12)


def test_with_every_rounding_it_errs_like_the_two_kernel_path():
    inp = _inputs()
    ref, _ = recurrent_gated_delta_rule_ref(**inp.kwargs())
    o, _ = gdnlab.chunk_gated_delta_rule(**inp.kwargs(), backend="two_kernel")
    kernel = float((o[0].double() - ref[0].double()).abs().max())
    emulated = float((eb.emulate(inp) - ref[0].double()).abs().max())
    assert 0.5 < emulated / kernel < 2.0
    assert float((eb.emulate(inp, ("output",)) - ref[0].double()).abs().max()) > 0


def test_budget_has_a_row_per_configuration_and_length():
    df = eb.budget(_inputs(), [64, 200], {k: v for k, v in eb.configurations(True).items() if k in ("none", "all")})
    assert len(df) == 4 and set(df.config) == {"none", "all"}
    err = df.set_index(["config", "seq_len"]).max_abs_err
    assert err["none", 200] < 1e-12 < err["all", 200]
    assert len(eb.configurations()) == 2 + len(eb.ROUNDINGS) and "none" in eb.configurations(True)


def test_prologue_roundings_are_modelled_only_when_asked():
    """The prologue's own roundings (T, W's and U's operands) change the emulation only when named; without any
    rounding the explicit-inverse form is still the recurrence; the built configurations nest as documented."""
    inp = _inputs()
    ref, _ = recurrent_gated_delta_rule_ref(**inp.kwargs())
    plain = eb.emulate(inp)
    for point in eb.PROLOGUE_ROUNDINGS:
        assert not torch.equal(eb.emulate(inp, (*eb.ROUNDINGS, point)), plain)
    assert torch.allclose(eb.emulate(inp, ("solve",)), ref[0].double(), rtol=0, atol=1e-2)
    built = eb.built_configurations()
    assert built["fold_norm + split_wu"] < built["fold_norm"] < built["two_kernel"]
    assert set(built["two_kernel"]) == set(eb.ROUNDINGS) | set(eb.PROLOGUE_ROUNDINGS)


def test_the_walk_t_form_is_the_algorithm_and_errs_like_its_kernel():
    """walk_t's form (selected by its bracket rounding) with only T and the bracket rounded stays near the
    recurrence, and with every rounding of its built configuration it errs like fast[walk_t=True] (without the
    fold: q and k normalised and rounded before the prologue, as the emulation's qk_norm rounds them)."""
    inp = _inputs()
    ref = recurrent_gated_delta_rule_ref(**inp.kwargs())[0][0].double()
    assert torch.allclose(eb.emulate(inp, ("bracket",)), ref, rtol=0, atol=1e-2)
    built = eb.built_configurations()["fold_norm + walk_t"]
    assert "bracket" in built and not {"wu", "wu_operands", "qk_norm"} & built
    o, _ = gdnlab.chunk_gated_delta_rule(**inp.kwargs(), backend="fast", walk_t=True, fold_norm=False)
    kernel = float((o[0].double() - ref).abs().max())
    emulated = float((eb.emulate(inp, built | {"qk_norm"}) - ref).abs().max())
    assert 0.5 < emulated / kernel < 2.0


def test_it_refuses_unknown_points_and_batches():
    with pytest.raises(ValueError, match="unknown rounding points"):
        eb.emulate(_inputs(), ("state",))
    with pytest.raises(ValueError, match="one dense sequence"):
        eb.emulate(small_inputs(B=2, dtype=torch.bfloat16), ())


def test_savings_and_summaries_are_computed_from_the_table():
    import pandas as pd
    rows = [dict(config=c, seq_len=n, n_chunks=n // 64, max_abs_err=e) for c, n, e in (
        ("all", 64, 1.0), ("all", 128, 2.0), ("all but wu", 128, 1.0), ("all but qk_norm", 128, 1.5),
        ("all but output", 128, 0.5), ("all but state_for_output", 128, 2.0), ("only output", 128, 0.8))]
    df = pd.DataFrame(rows)
    s = eb.savings(df)
    assert s.index[0] == "all but output" and s.loc["all but wu", "vs_all"] == 0.5
    assert eb.largest_saving(df).numbers["best"] == "wu"        # the output's own rounding is not a choice
    df.loc[df.config == "all but qk_norm", "max_abs_err"] = 0.1
    assert eb.largest_saving(df).numbers["best"] == "qk_norm"
    assert eb.state_in_fp32(df).numbers == dict(state_for_output=1.0, only_output=0.4)
    with pytest.raises(ValueError, match="no 'all' row"):
        eb.savings(df[df.config != "all"])


def test_the_exactness_finding_fails_when_the_emulation_drifts():
    import pandas as pd
    df = pd.DataFrame(dict(config=["none", "none", "all"], seq_len=[64, 128, 128], n_chunks=[1, 2, 2],
                           max_abs_err=[1e-16, 2e-16, 1e-3]))
    assert eb.exact_without_roundings(df).numbers["worst"] == 2e-16
    df.loc[1, "max_abs_err"] = 1e-6
    with pytest.raises(AssertionError, match="from the float64 recurrence"):
        eb.exact_without_roundings(df)
    df.loc[1, "max_abs_err"] = float("nan")  # NaN never passes
    with pytest.raises(AssertionError):
        eb.exact_without_roundings(df)
    with pytest.raises(AssertionError, match="no 'none' rows"):
        eb.exact_without_roundings(df[df.config == "all"])


def test_split_scores_form_replaces_the_scores_rounding_and_lowers_the_error_at_cutedsl_s_gate():
    """scores_split (split_scores's form) is refused beside scores, and on a short draw at CuteDSL's own gate it
    brings fold_norm's max and mean error below 0.9x (its rounding is the largest there, below the output's)."""
    from gdnlab import experiments as ex
    inp = ex.Problem(regime="cutedsl").inputs(256, "cpu")
    with pytest.raises(ValueError, match="scores_split"):
        eb.emulate(inp, {"scores", "scores_split"})
    built = eb.built_configurations()
    df = eb.budget(inp, [256], {k: built[k] for k in ("fold_norm", "fold_norm + split_scores")})
    assert eb.lowers(df, "fold_norm + split_scores", "fold_norm", at_most=0.9).numbers["max_abs_err"] < 0.9
    with pytest.raises(AssertionError, match="lowers"):
        eb.lowers(df, "fold_norm", "fold_norm + split_scores", at_most=1.0)


def test_a_prefix_is_the_start_of_the_long_draw_and_fast_s_savings_are_ranked_within_its_own_roundings():
    """GDNInputs.prefix cuts the first n tokens (what a sweep measures at n tokens of one long draw); a fresh draw
    of n tokens is another draw. largest_saving ranks the points of the set it is given."""
    from gdnlab import experiments as ex
    long = ex.Problem(regime="cutedsl").inputs(256, "cpu")
    cut = long.prefix(128)
    assert torch.equal(cut.q, long.q[:, :128]) and torch.equal(cut.g, long.g[:, :128])
    assert not torch.equal(ex.Problem(regime="cutedsl").inputs(128, "cpu").g, cut.g)
    with pytest.raises(ValueError, match="prefix"):
        long.prefix(0)
    configs = eb.fold_configurations()
    assert "fold_norm but qk_norm" not in configs and "fold_norm but scores" in configs  # fast rounds no norm
    df = eb.budget(cut, [128], configs)
    best = eb.largest_saving(df, "fold_norm", "mean_abs_err")
    assert best.numbers["best"] in {x[len("fold_norm but "):] for x in configs if x.startswith("fold_norm but ")}
    assert best.numbers[best.numbers["best"]] == min(v for k, v in best.numbers.items() if k != "best")
