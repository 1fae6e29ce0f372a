"""gdnlab.traffic: the byte model held against the launches a fast call really makes (CPU, launches recorded, not
run), and the table, findings and figure on a synthetic in-situ profile."""
import pandas as pd
import pytest
import torch

import gdnlab
from gdnlab import traffic
from gdnlab.inputs import make_inputs
from gdnlab.interp import recorded_launches

HEADS = dict(H=2, HV=4, K=32, V=16)


def _launches(lengths, **options):
    inp = make_inputs(seqlens=lengths, seed=3, dtype=torch.bfloat16, **HEADS)
    with recorded_launches() as got:
        gdnlab.chunk_gated_delta_rule(**inp.kwargs(), backend="fast", **options)
    return {c.kernel.__name__: c for c in got}, [c.kernel.__name__ for c in got]


def _arg(call, name):
    return call.args[call.kernel.arg_names.index(name)]


@pytest.mark.parametrize("lengths, fused, walk_t", [([70, 5, 128], False, False), ([64], False, False),
                                                    ([70, 5, 128], True, False), ([70, 5, 128], True, True)])
def test_the_model_is_the_tensors_fast_launches_with(lengths, fused, walk_t):
    calls, order = _launches(lengths, fused_output=fused, walk_t=walk_t)
    assert tuple(order) == traffic.FAST_KERNELS[:3 if fused else 4]
    assert calls["prologue_kernel"].kwargs["FOLD"] and calls["fwd_h_kernel"].kwargs["FOLD"]
    assert calls["fwd_h_kernel"].kwargs["OUTPUT"] == fused and calls["fwd_h_kernel"].kwargs["T_FORM"] == walk_t
    for x in traffic.fast_tensors(traffic.Shape.of(lengths, **HEADS), fused_output=fused, walk_t=walk_t):
        where = ([x.written_by] if x.written_by else []) + list(x.read_by)
        tensors = [_arg(calls[k], a) for k, a in where]
        assert all(isinstance(t, torch.Tensor) for t in tensors), x.name
        sizes = {t.numel() * t.element_size() for t in tensors}
        assert sizes == {x.nbytes}, (x.name, sizes, x.nbytes)
        assert len({t.data_ptr() for t in tensors}) == 1, f"{x.name}: its writer and readers get different tensors"


def test_kernel_bytes_add_up_and_count_each_read():
    s = traffic.Shape.of([128], **HEADS)
    tensors = traffic.fast_tensors(s)
    kb = traffic.kernel_bytes(tensors)
    assert list(kb.index) == list(traffic.FAST_KERNELS)
    assert kb.written.sum() == sum(x.nbytes for x in tensors if x.written_by)
    assert kb.read.sum() == sum(x.nbytes * len(x.read_by) for x in tensors)
    h = next(x for x in tensors if x.name == "h")
    assert h.nbytes == 2 * HEADS["HV"] * HEADS["K"] * HEADS["V"] * 2  # two chunks of bf16 state


def test_shape_refuses_empty_or_nonpositive_lengths():
    for bad in ([], [0], [5, -1]):
        with pytest.raises(ValueError, match="lengths"):
            traffic.Shape.of(bad)


def _in_situ(prologue_us=100.0):
    rows = []
    for B, T in ((1, 512), (1, 8192), (8, 2048), ("varlen", 700)):
        for k, us in zip(traffic.FAST_KERNELS, (2.0, prologue_us, 20.0, 10.0)):
            rows.append(dict(backend="fast", B=B, T=T, tokens=0, kernel=k, us_per_call=us * (1 + (T or 0) / 512)))
    rows.append(dict(backend="fla", B=1, T=512, tokens=512, kernel="prologue_kernel", us_per_call=1.0))
    return pd.DataFrame(rows)


def test_stage_traffic_rates_and_ragged_rows():
    t = traffic.stage_traffic(_in_situ(), 1000.0)
    assert set(t["T"]) == {512, 8192, 2048}  # the ragged row is left out without its lengths
    r = t[(t["T"] == 512) & (t.kernel == "fwd_h_kernel")].iloc[0]
    mb = traffic.kernel_bytes(traffic.fast_tensors(traffic.Shape.of([512]))).total["fwd_h_kernel"] / 1e6
    assert r.MB == pytest.approx(mb) and r.GBps == pytest.approx(mb / r.us * 1e3)
    assert r.of_copy_bw == pytest.approx(r.GBps / 1000.0)
    with_ragged = traffic.stage_traffic(_in_situ(), 1000.0, lengths={"varlen": [600, 100]})
    assert with_ragged[with_ragged.B == "varlen"].tokens.unique().tolist() == [700]
    with pytest.raises(ValueError, match="copy_bw"):
        traffic.stage_traffic(_in_situ(), 0.0)
    with pytest.raises(ValueError, match="no rows"):
        traffic.stage_traffic(_in_situ(), 1000.0, backend="nobody")


def test_slowest_mover_is_asserted():
    slow = traffic.stage_traffic(_in_situ(prologue_us=500.0), 1000.0)
    assert "prologue_kernel" in str(traffic.slowest_mover(slow))
    quick = traffic.stage_traffic(_in_situ(prologue_us=0.01), 1000.0)
    with pytest.raises(AssertionError, match="slowest mover"):
        traffic.slowest_mover(quick)


def test_floor_and_figure():
    t = traffic.stage_traffic(_in_situ(), 2000.0)
    fl = traffic.design_floor(t, 2000.0)
    assert fl["1x512"] == pytest.approx(t[t["T"] == 512].MB.sum() / 2000.0)
    assert list(fl.index) == ["1x512", "1x8192", "8x2048"]
    assert "MB per call" in str(traffic.floor_summary(t, 2000.0))
    fig = traffic.traffic_figure(t)
    assert len(fig.axes[0].lines) == len(traffic.FAST_KERNELS) + 1


def test_floor_beaten_names_the_shapes_below_the_floor():
    t = traffic.stage_traffic(_in_situ(), 2000.0, lengths={"varlen": [600, 100]})
    fl = traffic.design_floor(t, 2000.0)
    assert "varlen" in fl.index
    bench = pd.DataFrame(dict(backend="peer", shape=list(fl.index), graph_ms=list(fl * [0.5, 2.0, 2.0, 0.9])))
    f = traffic.floor_beaten(fl, bench, "peer")
    assert "2 of 4 shapes (1x512, varlen)" in str(f)
    slow = bench.assign(graph_ms=fl.to_numpy() * 3)
    with pytest.raises(AssertionError, match="above fast's design floor"):
        traffic.floor_beaten(fl, slow, "peer")
    with pytest.raises(AssertionError, match="no shape"):
        traffic.floor_beaten(fl, bench.assign(shape=["9x9", "9x10", "9x11", "9x12"]), "peer")


def test_from_run_is_load_then_stage_traffic_with_provenance():
    lengths = {"varlen": [3000, 17, 512, 1, 4096, 700, 64, 129, 2048, 333]}
    run, t, bw = traffic.from_run("h200", lengths=lengths)
    at, in_situ, bw_loaded = traffic.load("h200", run)
    assert (at, bw) == (run, bw_loaded)
    pd.testing.assert_frame_equal(t.drop(columns=["device", "torch", "triton", "seed"]),
                                  traffic.stage_traffic(in_situ, bw, lengths=lengths))
    assert (t.device == in_situ.device.iloc[0]).all()


def test_output_blocks_store_one_state_a_block():
    """With output blocks of two chunks the state kernel stores one h per block and the output kernel runs one
    program per block (and V tile): the model's h is that many states, its buffer still a slot per chunk."""
    lengths = [70, 5, 128, 200]  # 2 + 1 + 2 + 4 chunks: 1 + 1 + 1 + 2 blocks
    inp = make_inputs(seqlens=lengths, seed=3, dtype=torch.bfloat16, **HEADS)
    with recorded_launches() as got:
        gdnlab.chunk_gated_delta_rule(**inp.kwargs(), backend="fast", out_chunks=2)
    calls = {c.kernel.__name__: c for c in got}
    s = traffic.Shape.of(lengths, **HEADS)
    assert calls["fwd_h_kernel"].kwargs["H_EVERY"] == 2 and calls["fwd_o_kernel"].kwargs["OUT_M"] == 2
    assert s.states(2) == 5 and s.states() == s.chunks == 9
    assert calls["fwd_o_kernel"].grid[1] == s.states(2)
    per_state = HEADS["HV"] * HEADS["K"] * HEADS["V"] * 2
    assert _arg(calls["fwd_h_kernel"], "h_ptr").numel() * 2 == s.chunks * per_state
    h = {n: next(x for x in traffic.fast_tensors(s, out_chunks=n) if x.name == "h").nbytes for n in (1, 2)}
    assert h == {1: 9 * per_state, 2: 5 * per_state}


def test_stage_traffic_counts_the_blocks_an_in_situ_row_names():
    plain = traffic.stage_traffic(_in_situ(), 1000.0)
    blocks = traffic.stage_traffic(_in_situ().assign(out_chunks=2), 1000.0)
    d = (plain.set_index(["T", "kernel"]).MB - blocks.set_index(["T", "kernel"]).MB)
    h_saved = traffic.Shape.of([2048] * 8).states() // 2 * 32 * 128 * 128 * 2 / 1e6
    assert d[(2048, "fwd_h_kernel")] == pytest.approx(h_saved) and d[(2048, "fwd_o_kernel")] == pytest.approx(h_saved)
    assert d[(2048, "prologue_kernel")] == 0


def test_fused_output_saves_the_round_trips_of_h_and_v_new():
    """An in-situ row that names fused_output counts the state kernel's q, gq and o instead of its h and V_new, and
    nothing for the output kernel: the call moves two passes over h and V_new fewer and the output kernel's second
    reads of k and of k's gates, and the prologue the same."""
    fused = traffic.stage_traffic(_in_situ()[lambda d: d.kernel != "fwd_o_kernel"].assign(fused_output=True), 1000.0)
    plain = traffic.stage_traffic(_in_situ(), 1000.0)
    s = traffic.Shape.of([2048] * 8)
    trip = (2 * (s.states() * 32 * 128 * 128 * 2 + s.tokens * 32 * 128 * 2) + s.tokens * (16 * 128 * 2 + 32 * 4)) / 1e6
    total = {n: t[t["T"] == 2048].groupby("kernel").MB.sum() for n, t in (("fused", fused), ("plain", plain))}
    assert total["plain"].sum() - total["fused"].sum() == pytest.approx(trip)
    assert total["fused"]["prologue_kernel"] == total["plain"]["prologue_kernel"]
    assert "fwd_o_kernel" not in total["fused"]
