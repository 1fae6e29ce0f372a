"""GPU-only checks (compiled kernels on real tensor cores); skipped without CUDA. Their results on an H200 are
committed as runs under data/h200/ (RUNS.csv) by benchmarks/h200.py."""
import pytest
import torch

import gdnlab
from gdnlab.cases import CASES, ISOLATION
from gdnlab.metrics import CUTEDSL_OUTPUT, CUTEDSL_STATE, valid_rows
from gdnlab.reference import recurrent_gated_delta_rule_ref

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("case", CASES + ISOLATION, ids=lambda c: c.name)
def test_gpu_conformance_and_bit_equality(case):
    inp = case.inputs("cuda")
    kw = inp.kwargs()
    ro, rh = recurrent_gated_delta_rule_ref(**kw)
    rows = valid_rows(inp.cu_seqlens, inp.q.shape[1]).cuda()
    o2, h2 = gdnlab.chunk_gated_delta_rule(**kw, backend="two_kernel", poison=True)
    of, hf = gdnlab.chunk_gated_delta_rule(**kw, backend="fused_fixed", poison=True)
    _, hs = gdnlab.chunk_gated_delta_rule(**kw, backend="fused_shipped", poison=True)
    assert torch.isfinite(o2).all() and torch.isfinite(of).all()
    assert CUTEDSL_OUTPUT.check(o2[:, rows], ro[:, rows])[0]
    assert CUTEDSL_STATE.check(h2, rh)[0]
    assert torch.equal(of, o2) and torch.equal(hf, h2) and torch.equal(hs, h2)


@pytest.mark.parametrize("backend, opts", [("fast", {}), ("auto", {}), ("fast", dict(walk_t=True)),
                                           ("fast", dict(out_chunks=2, out_warps=8)), ("fast", dict(fused_output=True)),
                                           ("fast", dict(fused_output=True, BV=64, walk_t=True)),
                                           ("fast", dict(fused_output=True, BV=64, walk_t=True, walk_k_once=True,
                                                         num_stages=2)),
                                           ("fast", dict(fused_output=True, BV=64, walk_t=True, walk_k_once=True,
                                                         num_stages=2, prologue_solve="moves")),
                                           ("fast", dict(wu_apart=True)), ("fast", dict(walk_ws=True)),
                                           ("fast", dict(split_scores=True)),
                                           ("fast", dict(fused_output=True, BV=64, walk_t=True, walk_k_once=True,
                                                         num_stages=2, prologue_solve="moves", split_scores=True))],
                         ids=["fast", "auto", "fast-walk_t", "fast-blocks", "fast-fused-output", "fast-batch-layout",
                              "fast-k-once", "fast-k-once-moves", "fast-wu-apart", "fast-walk-ws",
                              "fast-split-scores", "fast-k-once-moves-split-scores"])
@pytest.mark.parametrize("case", CASES + ISOLATION, ids=lambda c: c.name)
def test_gpu_fast_and_auto_within_budgets(case, backend, opts):
    inp = case.inputs("cuda")
    kw = inp.kwargs()
    ro, rh = recurrent_gated_delta_rule_ref(**kw)
    rows = valid_rows(inp.cu_seqlens, inp.q.shape[1]).cuda()
    o, h = gdnlab.chunk_gated_delta_rule(**kw, backend=backend, poison=True, **opts)
    assert torch.isfinite(o).all() and torch.isfinite(h).all()
    assert CUTEDSL_OUTPUT.check(o[:, rows], ro[:, rows])[0]
    assert CUTEDSL_STATE.check(h.to(rh.dtype), rh)[0]


@pytest.mark.parametrize("case", CASES + ISOLATION, ids=lambda c: c.name)
def test_gpu_walk_ws_is_the_w_and_u_walk_bit_for_bit(case):
    """walk_ws reads the same tiles through descriptors in a warp-specialised loop: speed notes item 73 predicts
    fast's numbers exactly, against fast on the walk walk_ws settles to (W and U, its output kernel apart)."""
    kw = case.inputs("cuda").kwargs()
    want = gdnlab.chunk_gated_delta_rule(**kw, backend="fast", walk_t=False, fused_output=False)
    got = gdnlab.chunk_gated_delta_rule(**kw, backend="fast", poison=True, walk_ws=True)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("warps", [2, 4])
def test_gpu_moves_stores_the_blocks_t(warps):
    """The prologue that stores T only (walk_t's) gives the same T bits with the "moves" solve as with "blocks" on
    the GPU, as in the interpreter (tests/test_prologue.py), at fast's batch fold; speed notes item 61 rests on it.
    (Where the prologue forms W and U, item 34 found the two differ by a bf16 step on the GPU.)"""
    from gdnlab.inputs import make_inputs
    from gdnlab.kernels.prologue import ChunkPlan, run_prologue
    inp = make_inputs(seqlens=[300, 17, 129, 64], H=2, HV=4, K=128, V=128, regime="correlated", seed=21,
                      device="cuda")
    flat = [x.reshape(-1, *x.shape[2:]) for x in (inp.q, inp.k, inp.v)]
    g, beta = inp.g.reshape(-1, inp.g.shape[-1]).float(), inp.beta.reshape(-1, inp.beta.shape[-1])
    bounds = list(zip(inp.cu_seqlens[:-1].tolist(), inp.cu_seqlens[1:].tolist()))
    plan = ChunkPlan.build(bounds, flat[0].device)
    a = run_prologue(*flat, g, beta, plan, True, num_warps=warps, fold_norm=True, store_t=True)
    b = run_prologue(*flat, g, beta, plan, True, poison=True, num_warps=warps, fold_norm=True, store_t=True,
                     solve="moves")
    assert not b.t.isnan().any() and torch.equal(a.t, b.t)


def test_gpu_varlen_call_is_graph_capturable_with_host_cu_seqlens():
    """cu_seqlens on the host: validation reads it without a device sync, so the call can be captured."""
    from gdnlab.inputs import make_inputs
    kw = make_inputs(seqlens=[100, 1, 64, 200], H=2, HV=4, K=64, V=64, seed=4, device="cuda").kwargs()
    want, _ = gdnlab.chunk_gated_delta_rule(**kw, backend="two_kernel")
    kw["cu_seqlens"] = kw["cu_seqlens"].cpu()
    gdnlab.chunk_gated_delta_rule(**kw, backend="fast")  # compile and cache the chunk plan first
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o, _ = gdnlab.chunk_gated_delta_rule(**kw, backend="fast")
    o.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.isfinite(o).all()
    assert CUTEDSL_OUTPUT.check(o, want)[0]


def test_gpu_launches_through_handles_equal_tritons_path(monkeypatch):
    """The direct launches (gdnlab.handles) engage on a repeated call and give bit for bit Triton's own path."""
    from gdnlab import handles
    from gdnlab.inputs import make_inputs
    kw = make_inputs(seqlens=[100, 1, 64, 200], H=2, HV=4, K=64, V=64, seed=5, device="cuda").kwargs()
    monkeypatch.setattr(handles, "_DIRECT", False)
    want = gdnlab.chunk_gated_delta_rule(**kw, backend="fast")
    monkeypatch.setattr(handles, "_DIRECT", handles.direct_supported())
    for _ in range(2):  # the first call fills the handle cache, the second launches through it
        got = gdnlab.chunk_gated_delta_rule(**kw, backend="fast")
    assert handles.cached_handles() > 0 or not handles.direct_supported()
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("cap", [192, 128])
def test_gpu_capped_prologue_registers_equal_fast(cap):
    """prologue_maxnreg (speed notes item 50) only makes the compiler spill: the same bits as fast."""
    from gdnlab.inputs import make_inputs
    kw = make_inputs(seqlens=[300, 1, 64, 200], H=2, HV=4, K=128, V=128, seed=9, device="cuda").kwargs()
    want = gdnlab.chunk_gated_delta_rule(**kw, backend="fast", prologue_warps=2)
    got = gdnlab.chunk_gated_delta_rule(**kw, backend="fast", prologue_warps=2, prologue_maxnreg=cap, poison=True)
    assert torch.isfinite(got[0]).all() and torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("opts", [{}, dict(prologue_programs=2, prologue_tma=True, out_programs=2, out_tma=True),
                                  dict(walk_t=True)], ids=["fast", "looping", "walk_t"])
def test_gpu_plan_replay_equals_the_pipeline_eagerly_and_captured(opts):
    """A replayed call (gdnlab.plans) on new values, with stale NaN workspace memory, equals the pipeline bit for
    bit; captured into a CUDA graph it allocates its own buffers and replays right on values copied in later. Also
    with the looping kernels (their segment tables are the chunk plan's, not workspace memory) and with walk_t."""
    from gdnlab import plans
    from gdnlab.inputs import make_inputs

    def inputs(seed):
        return make_inputs(T=300, H=2, HV=4, K=128, V=128, seed=seed, device="cuda").kwargs()

    plans.clear()
    for _ in range(2):  # record, then replay (creates the workspace)
        gdnlab.chunk_gated_delta_rule(**inputs(0), backend="fast", **opts)
    for pool in plans._POOLS.values():
        pool.fill_(255)
    kw = inputs(1)
    got = gdnlab.chunk_gated_delta_rule(**kw, backend="fast", **opts)
    want = gdnlab.chunk_gated_delta_rule(**kw, backend="fast", poison=True, **opts)
    assert torch.isfinite(got[0]).all() and torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])

    static = inputs(0)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        out = gdnlab.chunk_gated_delta_rule(**static, backend="fast", **opts)
    torch.cuda.current_stream().wait_stream(stream)
    for name, t in kw.items():
        if isinstance(t, torch.Tensor):
            static[name].copy_(t)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out[0], want[0]) and torch.equal(out[1], want[1])
    plans.clear()


def test_gpu_calls_on_two_streams_equal_the_same_calls_alone():
    """Two replayed eager fast calls issued side by side on two streams (each stream has its own workspace,
    gdnlab.plans) give what each gives alone, for any caller that splits work across streams. Large enough (1024
    programs per launch) that the two streams' kernels run at the same time."""
    from gdnlab import plans
    from gdnlab.inputs import make_inputs

    sets = [make_inputs(T=8192, H=4, HV=8, K=128, V=128, seed=s, device="cuda").kwargs() for s in (3, 4)]
    plans.clear()
    alone = [gdnlab.chunk_gated_delta_rule(**kw, backend="fast") for kw in sets]
    streams = torch.cuda.Stream(), torch.cuda.Stream()
    main = torch.cuda.current_stream()
    for _ in range(3):
        got = []
        for s, kw in zip(streams, sets):
            s.wait_stream(main)
            with torch.cuda.stream(s):
                got.append(gdnlab.chunk_gated_delta_rule(**kw, backend="fast"))
        for s in streams:
            main.wait_stream(s)
        torch.cuda.synchronize()
        for (o, h), (wo, wh) in zip(got, alone):
            assert torch.equal(o, wo) and torch.equal(h, wh)
    plans.clear()
