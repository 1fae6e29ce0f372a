"""gdnlab.speed on a small synthetic benchmark (and the committed H200 runs): targets judged by the acceptance rule,
findings, summaries, figures, and runs chosen through RUNS.csv."""
import math

import numpy as np
import pandas as pd
import pytest

from gdnlab import runs, speed
from gdnlab.findings import Summary

ENV = dict(device="GPU-X", torch="t", triton="3.6.0", date="d1", floor_ms=0.01, error="")


def _bench(rows):
    return pd.DataFrame([dict(ENV, backend=b, B=1, T=t, tokens=t, ms=ms, graph_ms=g) for b, t, ms, g in rows])


def _synthetic(fixed=1.01, fast_graph=0.9):
    rows = []
    for t in (512, 8192):
        rows += [("fused_shipped", t, 1.0, 0.5), ("fused_fixed", t, 1.0 * fixed, 0.5 * fixed),
                 ("fla", t, 1.5, 0.4), ("fast", t, 0.5, 0.4 * fast_graph), ("auto", t, 0.52, 0.4 * fast_graph)]
    return speed.load_bench_frame(_bench(rows))


def test_targets_are_computed_row_by_row():
    tg = speed.targets(_synthetic())
    by = tg.set_index(["target", "shape", "timing"])
    assert by.loc[("fused_fixed / fused_shipped", "1x512", "eager"), "met"]
    assert math.isclose(by.loc[("fla / fast", "1x512", "eager"), "ratio"], 3.0)
    assert by.loc[("fast / fla", "1x8192", "graph"), "met"]
    assert math.isclose(by.loc[("auto / fastest", "1x512", "eager"), "ratio"], 0.52 / 0.5)
    assert {"device", "torch", "triton", "seed"} <= set(tg.columns) and set(tg.rule) == {"median"}
    slow = speed.targets(_synthetic(fast_graph=1.2)).set_index(["target", "shape", "timing"])
    assert not slow.loc[("fast / fla", "1x512", "graph"), "met"]


def test_judge_median_rule_and_paired_bootstrap():
    assert speed.judge(1.05, ratio=1.05).met and not speed.judge(1.05, ratio=1.0501).met
    assert speed.judge(1.2, at_most=False, ratio=1.2).met and not speed.judge(1.2, at_most=False, ratio=1.19).met
    rng = np.random.default_rng(1)
    b = rng.uniform(0.2, 0.6, 400)  # drift shared by both backends cancels in the per-sample ratio
    tight = speed.judge(1.05, samples=(b * rng.normal(1.02, 0.005, 400), b))
    assert tight.met and tight.low < tight.ratio < tight.high <= 1.05 and tight.rule == "paired bootstrap 95%"
    spread = 1.03 + 0.4 * np.linspace(-1, 1, 101)  # median 1.03 meets 1.05, the interval does not: a miss
    loose = speed.judge(1.05, samples=(b[:101] * spread, b[:101]))
    assert math.isclose(loose.ratio, 1.03) and loose.high > 1.05 and not loose.met
    assert speed.judge(0.99, at_most=False, samples=(b * 1.02, b)).met
    with pytest.raises(ValueError, match="either"):
        speed.judge(1.05)


def test_meets_target_and_summary_show_misses():
    tg = speed.targets(_synthetic().assign(ms=lambda d: d.ms.where(~((d.backend == "auto") & (d.tokens == 512)), 0.55)))
    assert "met at all 2 sizes" in str(speed.meets_target(tg, "auto / fastest", "graph"))
    with pytest.raises(AssertionError, match=r"not met at every size: 1x512 1.100x \(goal <= 1.05\)"):
        speed.meets_target(tg, "auto / fastest", "eager")
    with pytest.raises(AssertionError, match="no rows"):
        speed.meets_target(tg, "nothing")
    s = speed.target_summary(tg)
    assert isinstance(s, Summary) and s.numbers["auto / fastest (eager)"] == (1, 2)
    assert "auto / fastest <= 1.05 (eager): met at 1 of 2 sizes; not met at 1x512 1.100x (goal <= 1.05)" in s.claim
    assert "not asserted" in s._repr_markdown_()[0]
    gone = speed.target_summary(tg.assign(ratio=float("nan"), rule="not measured", met=False))
    assert "auto / fastest (eager): not measured in this run" in gone.claim and "not met" not in gone.claim


def test_findings_hold_or_fail_with_numbers():
    assert "1.010x" in str(speed.fix_is_free(_synthetic()))
    with pytest.raises(AssertionError, match="costs more"):
        speed.fix_is_free(_synthetic(fixed=1.2))
    assert "3.00-3.00x faster" in str(speed.faster_eager(_synthetic()))
    assert isinstance(speed.versus(_synthetic(), "fast", "fla"), Summary)
    assert "at 2 of 2 sizes" in str(speed.versus(_synthetic(), "fast", "fla"))
    assert "0 of 2" in str(speed.versus(_synthetic(fast_graph=1.2), "fast", "fla"))
    with pytest.raises(AssertionError, match="memory floor"):
        speed.far_from_floor(_synthetic(), at_most=0.01)


def test_committed_runs_are_chosen_through_the_registry():
    reg = runs.runs("h200")
    bench_runs = reg[runs.kind(reg.purpose) == "bench"]
    assert speed.default_bench().parent.name == bench_runs.run_id.iloc[-1]
    every = speed.timed_runs()
    assert set(runs.kind(every.purpose)) <= set(speed.TIMED_KINDS) and all(f.exists() for f in every.file)
    first, mid = every.run_id.iloc[0], every.run_id.iloc[len(every) // 2]
    assert list(speed.timed_runs(since=mid).run_id) == list(every.run_id.iloc[len(every) // 2:])
    assert list(speed.timed_runs(since=first, before=mid).run_id) == list(every.run_id.iloc[:len(every) // 2])


def test_committed_h200_bench_renders():
    b = speed.load_bench()
    assert {"fla", "two_kernel", "fused_shipped", "fused_fixed", "fast", "auto"} <= set(b.backend)
    assert speed.speed_table(b).index[0] == "1x512" and speed.speed_table(b).index[-1] == "varlen"
    speed.time_vs_tokens(b)


def test_stage_breakdown_groups_kernels_by_stage():
    rows = [dict(backend=be, B=1, T=2048, tokens=2048, kernel=k, calls_per_call=c, us_per_call=us,
                 call_ms_profiled=span)
            for be, span, ks in [("fast", 0.2, [("log_norm_kernel", 1, 9.5), ("prologue_kernel", 1, 70.25),
                                                ("fwd_h_kernel", 1, 48.0), ("fwd_o_kernel", 1, 33.5)]),
                                 ("fla", 0.19, [("l2norm_fwd_kernel", 2, 10.0), ("chunk_local_cumsum_kernel", 1, 3.5),
                                                ("chunk_gated_delta_rule_fwd_kkt_solve_kernel", 1, 38.0),
                                                ("recompute_w_u_fwd_kernel", 1, 20.0),
                                                ("void at::native::vectorized_elementwise_kernel", 1, 3.0),
                                                ("chunk_gated_delta_rule_fwd_kernel_h_blockdim64", 1, 44.5),
                                                ("chunk_fwd_kernel_o", 1, 37.75)])]
            for k, c, us in ks]
    t = speed.stage_breakdown(pd.DataFrame(rows))
    assert t.loc[("1x2048", "fla"), "prologue"] == 3.5 + 38.0 + 20.0
    assert t.loc[("1x2048", "fla"), "other (torch)"] == 3.0
    assert t.loc[("1x2048", "fast"), "state kernel"] == 48.0
    assert t.loc[("1x2048", "fast"), "l2-norm"] == 9.5 and t.loc[("1x2048", "fast"), "other (torch)"] == 0.0
    assert t.loc[("1x2048", "fast"), "kernels"] == 9.5 + 70.25 + 48.0 + 33.5
    assert math.isclose(t.loc[("1x2048", "fast"), "call (profiled)"], 200.0)
    assert speed.stage_figure(t).axes


def test_run_to_run_spread(tmp_path):
    paths = {}
    for i, scale in enumerate((1.0, 1.08, 1.02)):
        p = tmp_path / f"run{i}.csv"
        _bench([("fla", 4096, 0.7, 0.3 * scale), ("fast", 4096, 0.3, 0.31 + 0.001 * i),
                ("fla", 512, 0.6, 0.06)]).to_csv(p, index=False)
        paths[f"run{i}"] = p
    t = speed.run_to_run(paths, min_tokens=1024)
    assert math.isclose(t.loc[("fla", "1x4096"), "spread"], 1.08)
    assert math.isclose(t.loc[("fast", "1x4096"), "spread"], 0.312 / 0.31)
    assert ("fla", "1x512") not in t.index


def test_ratio_by_run_and_held_in_runs(tmp_path):
    paths = {}
    for i, fla_ms in enumerate((0.7, 0.33, 0.9)):
        p = tmp_path / f"run{i}.csv"
        rows = [("fla", 4096, fla_ms, 0.33), ("fast", 4096, 0.3, 0.3), ("fla", 512, 0.8, 0.06),
                ("fast", 512, 0.2, 0.05), ("fla", 8192, 0.66, 0.6), ("fast", 8192, 0.6, 0.55)]
        df = _bench(rows)
        if i == 2:  # a second round: medians over rounds
            df = pd.concat([df, _bench([("fast", 4096, 0.5, 0.3), ("fast", 4096, 0.4, 0.3)])])
        df.to_csv(p, index=False)
        paths[f"run{i}"] = p
    t = speed.ratio_by_run(paths, "fast", "fla", "ms", max_tokens=4096)
    assert list(t.index) == ["1x512", "1x4096"] and list(t.columns) == ["run0", "run1", "run2"]
    assert math.isclose(t.loc["1x4096", "run1"], 0.33 / 0.3) and math.isclose(t.loc["1x4096", "run2"], 0.9 / 0.4)
    f = speed.held_in_runs(t, 1.2, "fast 1.2x FLA")
    assert isinstance(f, Summary) and f.numbers["every"] == 2 and f.numbers["per_shape"] == {"1x512": 3, "1x4096": 2}
    assert "2 of 3" in f.claim
    with pytest.raises(AssertionError, match="lacks"):
        speed.held_in_runs(t.assign(run3=[4.0, float("nan")]), 1.2, "x")


def test_eager_over_graph_and_paired_hides_host(tmp_path):
    rows = []
    for name, fla_ms, method in (("w1", 0.9, "windows"), ("w2", 0.6, "windows"), ("p1", 0.32, "paired"),
                                 ("s1", 0.81, "synced"), ("r1", 0.75, "rounds")):
        _bench([("fla", 4096, fla_ms, 0.3), ("fast", 4096, 0.3, 0.29)]).to_csv(tmp_path / f"{name}.csv", index=False)
        rows.append(dict(run_id=name, file=tmp_path / f"{name}.csv", timing_method=method))
    t = speed.eager_over_graph(pd.DataFrame(rows), "fla", "1x4096")
    assert list(t.method) == ["windows", "windows", "paired", "synced", "rounds"]
    assert math.isclose(t.loc["w2", "ratio"], 2.0)
    f = speed.paired_hides_host(t, "fla", "1x4096")
    assert math.isclose(f.numbers["paired_max"], 0.32 / 0.3) and math.isclose(f.numbers["others_min"], 2.0)
    assert "1 run sampled paired, each call from an idle GPU" in f.claim
    assert "2.50x in the 1 run timed in interleaved do_bench rounds" in f.claim
    assert "2.70x in the 1 run" in f.claim and "2.00-3.00x in the 2 runs timed in do_bench windows" in f.claim
    t.loc["p1", "ratio"] = 2.5  # a paired run no closer to graph time than a windowed one
    with pytest.raises(AssertionError, match="separate"):
        speed.paired_hides_host(t, "fla", "1x4096")
    with pytest.raises(AssertionError, match="otherwise"):
        speed.paired_hides_host(t[t.method == "paired"], "fla", "1x4096")
    with pytest.raises(AssertionError, match="otherwise"):
        speed.paired_hides_host(t[t.method == "windows"], "fla", "1x4096")


def test_dispatch_cost():
    rows = [dict(what="capture query", us=0.7), dict(what="entry -> noop", us=5.0),
            dict(what="entry -> auto -> noop", us=11.5)]
    rows += [dict(what=f"eager auto / fast+fn, 1x{t}", T=t, median_paired_ratio=r, samples=1000)
             for t, r in ((512, 1.018), (1024, 1.021))]
    df = pd.DataFrame(rows)
    f = speed.dispatch_cost(df)
    assert math.isclose(f.numbers["layer_us"], 6.5) and "1.021x (1024 tokens)" in f.claim
    with pytest.raises(AssertionError, match="within"):
        speed.dispatch_cost(df.assign(median_paired_ratio=df.median_paired_ratio * 1.04))
    with pytest.raises(AssertionError, match="lacks"):
        speed.dispatch_cost(df[df.what != "entry -> noop"])


def test_ratio_table_is_each_candidate_over_the_baseline():
    t = speed.ratio_table(_synthetic(fast_graph=0.8), ["fla", "auto"], "fast")
    assert list(t.columns) == ["fla / fast", "auto / fast"] and list(t.index) == ["1x512", "1x8192"]
    assert t["fla / fast"].tolist() == pytest.approx([1.25, 1.25]) and t["auto / fast"].tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="no graph_ms of nope"):
        speed.ratio_table(_synthetic(), ["nope"])


def test_gives_back_holds_only_where_the_cost_exceeds_the_saving():
    def profile(cand_prologue, cand_walk):
        return pd.DataFrame([dict(backend=be, B=1, T=T, tokens=T, kernel=k, us_per_call=us)
                             for T in (8192, 32768)
                             for be, p, w in (("fast", 200.0, 100.0), ("cand", cand_prologue, cand_walk))
                             for k, us in (("prologue_kernel", p), ("fwd_h_kernel", w))])

    t = speed.kernel_times(profile(120.0, 190.0), "prologue_kernel")
    assert list(t.index) == ["1x8192", "1x32768"] and t.loc["1x8192", "cand"] == 120.0
    f = speed.gives_back(profile(120.0, 190.0), "cand", ["1x8192", "1x32768"])
    assert f.numbers["1x8192"] == {"saved_us": 80.0, "cost_us": 90.0}
    for p, w in ((120.0, 170.0), (210.0, 190.0)):  # the walk costs less than the saving; the prologue saves nothing
        with pytest.raises(AssertionError, match="gives_back: cand does not lose"):
            speed.gives_back(profile(p, w), "cand", ["1x8192", "1x32768"])
    with pytest.raises(AssertionError, match="no prologue_kernel time of 8x2048"):
        speed.gives_back(profile(120.0, 190.0), "cand", ["8x2048"])
    with pytest.raises(AssertionError, match="no prologue_kernel time of other"):
        speed.gives_back(profile(120.0, 190.0), "other", ["1x8192"])
    walkless = profile(120.0, 190.0)
    walkless = walkless[~((walkless.backend == "cand") & (walkless.kernel == "fwd_h_kernel"))]
    with pytest.raises(AssertionError, match="no fwd_h_kernel time of cand"):
        speed.gives_back(walkless, "cand", ["1x8192"])
    with pytest.raises(AssertionError, match="no 'fwd_o_kernel'"):
        speed.gives_back(profile(120.0, 190.0), "cand", ["1x8192"], costs="fwd_o_kernel")
    with pytest.raises(ValueError, match="kernel_times: no 'fwd_o_kernel'"):
        speed.kernel_times(profile(120.0, 190.0), "fwd_o_kernel")
