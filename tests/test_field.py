"""gdnlab.field: the peers table and findings on the committed H200 peers runs, and that each finding fails when the
data stops supporting it."""
import math

import pandas as pd
import pytest

from gdnlab import field, runs
from gdnlab.speed import load_bench_frame


@pytest.fixture(scope="module")
def tables():
    return field.load("h200")


def test_table_has_a_row_per_implementation_with_what_ran(tables):
    t = field.field_table(tables["conformance"], tables["sweep"], tables["bench"]).set_index("backend")
    assert set(field.PEER_NAMES) <= set(t.index) and "fast" in t.index
    assert t.loc["flashinfer", "implementation"].startswith("flashinfer-python ")
    assert t.loc["fla", "implementation"].endswith("(triton)")          # FLA's own path, not FlashQLA
    assert t.loc["fused_shipped", "growth_slope"] > t.loc["two_kernel", "growth_slope"] + field.GROWTH_MARGIN
    assert t.loc["fused_shipped", "cases_in_budget"] != "28/28" and t.loc["fast", "cases_in_budget"] == "28/28"


def test_peers_conform_fails_naming_the_case(tables):
    conf = tables["conformance"].copy()
    assert "flashqla" in str(field.peers_conform(conf))
    i = conf.index[(conf.backend == "flashqla") & (conf.case == "t65")][0]
    conf.loc[i, "padding_zero"] = False
    with pytest.raises(AssertionError, match="flashqla/t65"):
        field.peers_conform(conf)
    conf.loc[i, ["padding_zero", "out_max_abs"]] = [True, math.nan]   # NaN never passes, even marked ok
    with pytest.raises(AssertionError, match="1 peer case"):
        field.peers_conform(conf)


def test_growth_rule_fails_for_the_shipped_kernel(tables):
    field.growth_like_two_kernel(tables["sweep"], field.PEER_NAMES)
    with pytest.raises(AssertionError, match="fused_shipped in"):
        field.growth_like_two_kernel(tables["sweep"], ("fused_shipped",))


def test_most_accurate_is_computed_not_named(tables):
    sweep = tables["sweep"].copy()
    best = field.most_accurate(sweep, field.PEER_NAMES).numbers["best"]
    other = next(p for p in field.PEER_NAMES if p != best)
    sweep.loc[sweep.backend == other, "max_abs_err"] /= 100
    assert field.most_accurate(sweep, field.PEER_NAMES).numbers["best"] == other


def test_fast_targets_judge_every_shape_and_count_a_missing_backend_as_a_miss(tables):
    tg = field.fast_targets(tables["bench"], tables["sweep"])
    shapes = tables["bench"]["shape"].nunique()
    assert (tg.target == "fast / flashqla (graph)").sum() == shapes
    assert set(tg.timing) == {"graph", "eager", "accuracy"}
    bench = tables["bench"][~((tables["bench"].backend == "flashqla") & (tables["bench"]["shape"] == "1x512"))]
    row = field.fast_targets(bench, tables["sweep"]).query("target == 'fast / flashqla (graph)' and shape == '1x512'")
    assert row.rule.item() == "not measured" and not row.met.item()


def test_speed_vs_fastest_is_one_at_the_fastest():
    bench = load_bench_frame(pd.DataFrame(dict(B=[1] * 4, T=[512, 512, 1024, 1024], tokens=[512, 512, 1024, 1024],
                                               backend=["x", "y", "x", "y"], graph_ms=[1.0, 2.0, 3.0, 1.5])))
    rel = field.speed_vs_fastest(bench, "graph_ms")
    assert rel.loc["1x512"].tolist() == [1.0, 2.0] and rel.loc["1x1024"].tolist() == [2.0, 1.0]


def test_host_targets_judge_both_measures_from_the_run_and_miss_without_fast():
    h = field.load_host("h200")
    tg = field.host_targets(h["bench"], h["host"]).set_index("timing")
    e, g = (h["bench"].query("backend == 'fast' and shape == '1x512'")[c].item() for c in ("ms", "graph_ms"))
    assert tg.loc["eager", "ratio"] == pytest.approx((e - g) * 1e3 / 60)
    wall = h["host"].query("backend == 'fast' and tokens == 512").us_per_call.median()
    assert tg.loc["host", "ratio"] == pytest.approx(wall / 60)
    assert tg.loc["host", "met"] == (wall <= 60)
    none = field.host_targets(h["bench"], h["host"][h["host"].backend != "fast"]).set_index("timing")
    assert none.loc["host", "rule"] == "not measured" and not none.loc["host", "met"]


def test_a_cards_field_run_reads_a_bench_cut_short_from_its_log():
    d = field.load_card("h100", "2026-12-07T1552-field")
    assert set(d["bench"].run_id) == set(d["sweep"].run_id) == {"2026-12-07T1552-field"}
    assert "4x8192" not in set(d["bench"]["shape"]) and {"fast", *field.PEER_NAMES} <= set(d["bench"].backend)
    tg = field.fast_targets(d["bench"], d["sweep"])
    assert set(tg.device) == {"NVIDIA H100 80GB HBM3"}
    start = field.load_card("h200", "2026-12-07T2029-field")  # a start of four calls: conformance, two benches, sweep
    assert set(start["bench"].run_id) == {"2026-12-07T2019-field", "2026-12-07T2024-field"}
    assert set(start["sweep"].run_id) == {"2026-12-07T2029-field"}


def test_the_latest_field_start_is_read_whole_with_a_conformance_table():
    d = field.load("h200", purpose="field")
    bench_run = runs.latest("h200", purpose="field", has="bench.csv")
    assert bench_run in set(d["bench"].run_id) <= set(runs.continued(bench_run, "h200"))
    assert d["bench"].groupby("shape").backend.nunique().min() == d["bench"].backend.nunique()
    assert {"fast", *field.PEER_NAMES} <= set(d["conformance"].backend)


def test_between_starts_tells_a_changed_computation_from_a_changed_speed():
    def start(ms, err):
        bench = load_bench_frame(pd.DataFrame(dict(B=[1, 1], T=[512, 512], tokens=[512, 512], backend=["x", "y"],
                                                   graph_ms=ms)))
        sweep = pd.DataFrame(dict(backend=["x", "y"], regime="slow_gate", initial_state=True, n_chunks=1024,
                                  max_abs_err=err))
        return dict(bench=bench, sweep=sweep)

    d = field.between_starts(start([1.0, 2.0], [1e-3, 2e-3]), start([1.5, 2.0], [1e-3, 3e-3]))
    assert d["time"].loc["x", "1x512"] == 1.5 and d["time"].loc["y", "1x512"] == 1.0
    assert d["outputs"].rows_differ.to_dict() == {"x": 0, "y": 1}
    later = start([1.5, 2.0], [1e-3, 2e-3])  # a sweep row only the later start holds counts as differing
    later["sweep"] = pd.concat([later["sweep"], later["sweep"].iloc[:1].assign(n_chunks=512)], ignore_index=True)
    later["bench"] = pd.concat([later["bench"], load_bench_frame(pd.DataFrame(dict(B=[1], T=[1024], tokens=[1024],
                                                                                   backend=["z"], graph_ms=[1.0])))])
    d2 = field.between_starts(start([1.0, 2.0], [1e-3, 2e-3]), later)
    assert d2["outputs"].to_dict("index") == {"x": {"rows": 2, "rows_differ": 1}, "y": {"rows": 1, "rows_differ": 0}}
    assert "z" not in d2["time"].index  # a backend only one start timed has no ratio
    assert "y a different error in 1 of 1" in field.outputs_changed_between_starts(d["outputs"], ("y",)).claim
    with pytest.raises(AssertionError, match=r"differ are \['y'\], not \['x'\]"):
        field.outputs_changed_between_starts(d["outputs"], ("x",))


def test_by_start_reads_a_start_whole_and_two_modes_fails_when_the_data_stop_supporting_it():
    t = field.by_start("flashqla").set_index("start")
    # the H100 start of 2026-12-07T2227: its bench and sweep are later calls of the chain (runs.continued)
    row = t.loc["2026-12-07T2227-check"]
    last = runs.load("2026-12-07T2246-check", "sweep.csv", "h100")  # the start's last sweep and bench
    want = last[(last.backend == "flashqla") & (last.regime == "slow_gate") & (last.n_chunks == 1024)
                & last.initial_state.astype(bool)].max_abs_err
    bench = load_bench_frame(runs.load("2026-12-07T2246-check", "bench.csv", "h100"))
    assert row.device == "h100" and row.card.startswith("NVIDIA H100") and len(want) == 1
    assert row.error == want.iloc[0] and row.graph_ms == bench[(bench.backend == "flashqla")
                                                                & (bench["shape"] == "1x32768")].graph_ms.median()
    assert not t.index.duplicated().any() and "2026-12-07T2238-check" not in t.index
    def mk(err, ms):
        return pd.DataFrame(dict(device="h200", start=[f"s{i}" for i in range(len(err))], card="c", error=err,
                                 graph_ms=ms))

    found = field.two_modes(mk([1.469e-3, 1.551e-3, 1.46912e-3, math.nan], [1.3, 0.8, math.nan, 1.2]))
    assert "two values" in found.claim and "0.800-0.800 ms" in found.claim
    with pytest.raises(AssertionError, match="took 3 values"):
        field.two_modes(mk([1.469e-3, 1.551e-3, 1.6e-3], [1.3, 0.8, 0.7]))
    with pytest.raises(AssertionError, match="was not faster"):
        field.two_modes(mk([1.469e-3, 1.551e-3, 1.551e-3], [1.3, 0.8, 1.4]))
    with pytest.raises(AssertionError, match="was not faster"):  # no start timed the lower-error computation
        field.two_modes(mk([1.469e-3, 1.551e-3], [math.nan, 0.8]))


def test_by_start_names_the_card_a_start_recorded(tmp_path, monkeypatch):
    """card_id is the uuid the start's latest run recorded in env.json (benchmarks.env.card_info), "" before."""
    import json
    import shutil
    shutil.copytree(runs.data_dir("h100"), tmp_path / "h100")
    env_path = tmp_path / "h100" / "2026-12-07T2246-check" / "env.json"
    env = json.loads(env_path.read_text())
    env_path.write_text(json.dumps({**env, "card": {"uuid": "GPU-test-1"}}))
    monkeypatch.setattr(runs, "data_dir", lambda device="h200": tmp_path / device)
    t = field.by_start("flashqla", devices=("h100",)).set_index("start")
    assert t.loc["2026-12-07T2227-check", "card_id"] == "GPU-test-1"
    assert (t.drop(index="2026-12-07T2227-check").card_id == "").all() and len(t) > 1


def test_modes_by_start_draws_each_timed_start_and_refuses_none():
    from gdnlab import plots
    t = pd.DataFrame(dict(device="h200", start=["2026-12-01T0000-x", "2026-12-02T0000-y"], card="c",
                          error=[1e-3, math.nan], graph_ms=[1.0, 2.0]))
    fig = plots.modes_by_start(t, "x")
    assert len(fig.axes[0].collections[0].get_offsets()) == 2
    with pytest.raises(ValueError, match="no start"):
        plots.modes_by_start(t.assign(graph_ms=math.nan), "x")
