"""The public entry point: every backend refuses bad input the same way; user backends register and run."""
import pytest
import torch

import gdnlab
from gdnlab.backends import get_backend, register_backend
from gdnlab.inputs import make_inputs


def _kw():
    return make_inputs(B=1, T=8, H=1, HV=2, K=16, V=16, seed=3).kwargs()


@pytest.mark.parametrize("backend", ["reference", "two_kernel", "fused_shipped", "fused_fixed", "user_echo"])
def test_every_backend_refuses_bad_input(backend):
    kw = _kw()
    kw["g"] = kw["g"][..., :1]  # wrong head count
    with pytest.raises(ValueError, match="g"):
        gdnlab.chunk_gated_delta_rule(**kw, backend=backend)
    kw = _kw()
    kw["q"] = kw["q"].float().numpy()
    with pytest.raises(TypeError, match="q"):
        gdnlab.chunk_gated_delta_rule(**kw, backend=backend)


def _echo(q, k, v, g, beta, **kw):
    return gdnlab.chunk_gated_delta_rule(q, k, v, g, beta, backend="reference", **kw)


register_backend("user_echo", _echo, overwrite=True)


def test_user_backend_is_listed_and_runs():
    assert "user_echo" in gdnlab.BACKENDS
    o, ht = gdnlab.chunk_gated_delta_rule(**_kw(), backend="user_echo")
    ro, rh = gdnlab.chunk_gated_delta_rule(**_kw(), backend="reference")
    assert torch.equal(o, ro) and torch.equal(ht, rh)


def test_register_backend_refuses_bad_registrations():
    with pytest.raises(TypeError, match="fn"):
        register_backend("x_not_callable", 3)
    with pytest.raises(TypeError, match="name"):
        register_backend("", _echo)
    with pytest.raises(ValueError, match="already registered"):
        register_backend("two_kernel", _echo)
    with pytest.raises(ValueError, match="unknown backend"):
        get_backend("nope")


def test_fast_configuration_is_bit_equal_on_cpu():
    """fast's kernel configs (state kernel BV 32, output kernel BV 128, and at this size 4 prologue warps and q
    normalised in the output kernel) change tiling and launches, not numbers: with its l2-norm folded or not,
    bit-equal to two_kernel with the same fold_norm and prologue solve ("doubling" at this size) under the
    interpreter, every element written; and the fold changes the numbers."""
    kw = make_inputs(B=1, T=150, H=1, HV=2, K=128, V=128, seed=3, decay=0.1).kwargs()
    assert kw["output_final_state"] and kw["use_qk_l2norm_in_kernel"]
    outs = {}
    for fold in (False, True):
        o, h = gdnlab.chunk_gated_delta_rule(**kw, backend="two_kernel", fold_norm=fold, prologue_solve="doubling")
        of, hf = gdnlab.chunk_gated_delta_rule(**kw, backend="fast", poison=True,
                                               **({} if fold else dict(fold_norm=False)))
        assert not of.isnan().any()
        assert torch.equal(o, of) and torch.equal(h, hf), fold
        outs[fold] = of
    assert not torch.equal(outs[False], outs[True])


def test_q_norm_in_output_kernel_is_bit_equal_on_cpu():
    """q's l2-norm moved into the output kernel changes launches, not numbers: bit-equal to the separate l2norm
    launch, every element written."""
    kw = make_inputs(B=1, T=150, H=1, HV=2, K=128, V=128, seed=5, decay=0.1).kwargs()
    assert kw["use_qk_l2norm_in_kernel"] and kw["output_final_state"]
    o, h = gdnlab.chunk_gated_delta_rule(**kw, backend="two_kernel")
    for opts in (dict(norm_q_in_output=True), dict(norm_q_in_output=True, out_BV=128)):
        of, hf = gdnlab.chunk_gated_delta_rule(**kw, backend="two_kernel", poison=True, **opts)
        assert not of.isnan().any()
        assert torch.equal(o, of) and torch.equal(h, hf), opts


@pytest.mark.parametrize("programs,warps,nq", [(1, 4, True), (264, 4, True), (265, 2, True), (528, 2, True),
                                               (529, 2, False), (1056, 2, False), (1057, 2, False),
                                               (4224, 2, False), (4225, 2, False), (10 ** 5, 2, False)])
@pytest.mark.parametrize("walkers,deep", [(1, True), (132, True), (133, False), (1280, False)])
def test_fast_size_rule(programs, warps, nq, walkers, deep):
    """fast's options by size: 4 prologue warps and the doubling solve up to two programs per multiprocessor, the
    output kernel looping (2 stages) above 32 where the walk is pipelined, q normalised in the output
    kernel up to four, the walk pipelined 4 deep up to one state-kernel program per multiprocessor (132 here), from
    T stored by the prologue and solved by "moves" there above two and up to eight prologue programs, and past that the output written by the state kernel at V tile 64, from T stored by the prologue (walk_t), loading
    K once at 2 stages and, above two prologue programs per multiprocessor, the "moves" solve."""
    from gdnlab.backends import fast_by_size
    want = dict(prologue_warps=warps, norm_q_in_output=nq, **(dict(prologue_solve="doubling") if warps == 4 else {}),
                **(dict(num_stages=4, out_stages=3) if deep else {}))
    if deep and 2 * 132 < programs <= 8 * 132:
        want.update(walk_t=True, prologue_solve="moves")
    if deep and programs > 32 * 132:
        want.update(out_programs=4, out_tma=True, out_stages=2)
    if not deep:
        want.update(fused_output=True, BV=64, walk_t=True, walk_k_once=True, num_stages=2,
                    **(dict(prologue_solve="moves") if warps == 2 else {}))
    assert fast_by_size(programs, walkers, 132) == want


def test_fast_passes_its_size_rule_to_the_kernels(monkeypatch):
    """The rule is applied per call and overridable by the caller's options."""
    import gdnlab.kernels.pipeline as kernels
    seen = []
    real = kernels.run_prologue
    monkeypatch.setattr(kernels, "run_prologue", lambda *a, **kw: seen.append(kw) or real(*a, **kw))
    walks = []
    real_walk = kernels.two_kernel
    monkeypatch.setattr(kernels, "two_kernel", lambda *a, **kw: walks.append(kw) or real_walk(*a, **kw))
    kw = make_inputs(B=1, T=70, H=1, HV=2, K=32, V=32, seed=7).kwargs()
    gdnlab.chunk_gated_delta_rule(**kw, backend="fast")
    gdnlab.chunk_gated_delta_rule(**kw, backend="fast", fold_norm=False)
    gdnlab.chunk_gated_delta_rule(**kw, backend="fast", prologue_warps=2, norm_q_in_output=False, num_stages=3,
                                  fold_norm=False)
    got = [(s["num_warps"], s["norm_q_in_output"], s["fold_norm"]) for s in seen]
    assert got == [(4, False, True), (4, True, False), (2, False, False)]  # a folded norm is placed nowhere
    gdnlab.chunk_gated_delta_rule(**kw, backend="fast", fuse_norm=True)  # an explicit placement turns the fold off
    assert (seen[3]["fuse_norm"], seen[3]["fold_norm"]) == (True, False)
    with pytest.raises(ValueError, match="fold_norm"):  # both asked for: refused
        gdnlab.chunk_gated_delta_rule(**kw, backend="fast", fuse_norm=True, fold_norm=True)
    assert (walks[0]["num_stages"], walks[0]["out_stages"], walks[2]["num_stages"]) == (4, 3, 3)
    gdnlab.chunk_gated_delta_rule(**kw, backend="fast", out_programs=1)  # looping: its own depth, not the rule's
    gdnlab.chunk_gated_delta_rule(**kw, backend="fast", out_programs=1, out_stages=3)
    assert [w["out_stages"] for w in walks[-2:]] == [2, 3]


def test_fused_path_does_not_take_the_two_kernel_options():
    kw = make_inputs(B=1, T=70, H=1, HV=2, K=64, V=64, seed=6).kwargs()
    with pytest.raises(TypeError, match="norm_q_in_output"):
        gdnlab.chunk_gated_delta_rule(**kw, backend="fused_fixed", norm_q_in_output=True)


@pytest.mark.parametrize("opt,val", [("out_BV", 96), ("prologue_solve", "rows")])
def test_bad_kernel_options_name_the_option(opt, val):
    kw = _kw()
    with pytest.raises(ValueError, match=f"^{opt}"):
        gdnlab.chunk_gated_delta_rule(**kw, backend="two_kernel", **{opt: val})


def test_fast_options_are_what_a_fast_call_runs_with(monkeypatch):
    """fast_options (for tools that did not run the call) gives the options the backend passes its pipeline: the
    output written by the state kernel for a batch whose state kernel has more programs than multiprocessors, not
    for one sequence, and the caller's options over both (an output-kernel option named turns the fusion off).
    On 4 multiprocessors, so that small calls fall on both sides of the size rule."""
    import gdnlab.backends as backends
    import gdnlab.kernels.pipeline as kernels
    from gdnlab import plans
    from gdnlab.backends import fast_options
    from gdnlab.kernels.prologue import SOLVE
    sms = 4
    monkeypatch.setattr(backends, "multiprocessors", lambda device: sms)
    # no plan recorded under another multiprocessor count is replayed here, and none recorded here is kept
    monkeypatch.setattr(plans, "_PLANS", type(plans._PLANS)())
    seen, prologues = [], []
    real = kernels.walk
    monkeypatch.setattr(kernels, "walk", lambda *a, **kw: (seen.append(kw), real(*a, **kw))[1])
    real_prologue = kernels.run_prologue
    monkeypatch.setattr(kernels, "run_prologue", lambda *a, **kw: prologues.append(kw) or real_prologue(*a, **kw))
    for lengths, opts in (([100, 30, 64, 5, 70], {}), ([300], {}), ([100, 30, 64, 5, 70], dict(out_chunks=1)),
                          ([100, 30, 64, 5, 70], dict(fused_output=False)),
                          ([100, 30, 64, 5, 70], dict(prologue_tma=True))):  # the rule's walk_t gives way
        inp = make_inputs(seqlens=lengths, H=1, HV=2, K=32, V=64, seed=4)
        gdnlab.chunk_gated_delta_rule(**inp.kwargs(), backend="fast", **opts)
        want = fast_options(lengths, HV=2, V=64, sms=sms, **opts)
        assert {n: seen[-1].get(n) for n in ("fused_output", "out_chunks", "out_warps")} == {
            n: want.get(n) for n in ("fused_output", "out_chunks", "out_warps")}
        assert seen[-1]["BV"] == want["BV"]
        assert bool(prologues[-1]["store_t"]) == bool(want.get("walk_t"))
        assert prologues[-1]["solve"] == want.get("prologue_solve", SOLVE)
        assert (seen[-1].get("walk_k_once", False), seen[-1].get("num_stages")) == (
            want.get("walk_k_once", False), want.get("num_stages"))
    assert [(kw.get("fused_output", False), kw["BV"]) for kw in seen] == [(True, 64), (False, 32), (False, 32),
                                                                          (False, 32), (True, 64)]
    # one sequence of 5 chunks at 2 value heads: 10 prologue programs on 4 multiprocessors, walk_t and moves
    assert [p["store_t"] for p in prologues] == [True, True, False, False, False]
    # moves only where the prologue stores T only (the caller's prologue_tma gives the batch back its W and U)
    assert [p["solve"] for p in prologues] == ["moves", "moves", SOLVE, SOLVE, SOLVE]
    # the batch's walk loads K once at 2 stages; without its fused walk or walk_t, neither (the walk's own depth)
    assert [(kw.get("walk_k_once", False), kw.get("num_stages")) for kw in seen] == [
        (True, 2), (False, 4), (False, None), (False, None), (False, None)]
