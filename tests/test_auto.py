"""gdnlab.auto: the written rule, and the "auto" backend running what it names."""
import pytest
import torch

import gdnlab
from gdnlab import auto
from gdnlab.inputs import make_inputs


PEER_SET = ("fla", "flashqla", "flashinfer")


@pytest.mark.parametrize("on_cuda,available,regime", [
    (False, PEER_SET, True),   # CPU: the lab's kernels under the interpreter
    (True, (), True),          # no peer installed
    (True, PEER_SET, False),   # outside the timed regime (not bf16 with K = V = 128)
])
def test_outside_the_rule_everything_runs_fast(on_cuda, available, regime):
    for tokens in (1, 512, 3000, 10 ** 6):
        for kind in auto.KINDS:
            for capturing in (False, True):
                assert auto.choose(tokens, kind, on_cuda, capturing, available, regime) == auto.LAB


@pytest.mark.parametrize("capturing", [False, True])
@pytest.mark.parametrize("available", [PEER_SET, ("flashqla",), ("fla",), ("flashinfer", "fla")])
def test_each_bench_shape_goes_to_its_fastest_available_backend(capturing, available):
    """At every shape of the rule's run, auto names the first backend of that shape's ranking that is here."""
    for kind, shapes in auto.rankings("graph_ms" if capturing else "ms").items():
        assert shapes, kind
        for tokens, order in shapes:
            allowed = [b for b in order if b == auto.LAB or (
                b in available and not (b == "fla" and capturing and kind == "ragged"))]
            assert auto.choose(tokens, kind, True, capturing, available, True) == allowed[0]


def test_rankings_hold_the_lab_and_the_peers_only():
    names = {b for shapes in auto.rankings("ms").values() for _, order in shapes for b in order}
    assert auto.LAB in names and names <= {auto.LAB, *PEER_SET}


def test_between_shapes_the_nearest_on_a_log_scale_decides():
    shapes = auto.rankings("graph_ms")["sequence"]
    (t0, o0), (t1, o1) = next((a, b) for a, b in zip(shapes, shapes[1:]) if a[1][0] != b[1][0])
    mid = (t0 * t1) ** 0.5
    assert auto.choose(int(mid) - 1, "sequence", True, True, PEER_SET, True) == o0[0]
    assert auto.choose(int(mid) + 1, "sequence", True, True, PEER_SET, True) == o1[0]


def test_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="^kind"):
        auto.choose(512, "dense", True, False, PEER_SET, True)


@pytest.mark.parametrize("tokens,cuda,capturing,want", [
    (2047, True, False, {"fuse_norm": True}),  # eager and host-bound: one launch fewer
    (2048, True, False, {}),                   # from here the fused prologue's device time costs more
    (512, True, True, {}),                     # captured: only device time counts
    (512, False, False, {}),                   # CPU: no launches to save
])
def test_options(tokens, cuda, capturing, want):
    assert auto.options(tokens, cuda, capturing) == want


def test_auto_runs_the_backend_it_names_on_cpu():
    kw = make_inputs(B=2, T=70, H=1, HV=2, K=32, V=32, seed=6).kwargs()
    o, h = gdnlab.chunk_gated_delta_rule(**kw, backend="auto", poison=True)
    of, hf = gdnlab.chunk_gated_delta_rule(**kw, backend="fast")
    assert torch.equal(o, of) and torch.equal(h, hf)


def test_auto_validates_its_inputs():
    kw = make_inputs(B=1, T=8, H=1, HV=1, K=16, V=16, seed=1).kwargs()
    kw["beta"] = kw["beta"][:, :4]
    with pytest.raises(ValueError, match="^beta"):
        gdnlab.chunk_gated_delta_rule(**kw, backend="auto")
