"""gdnlab.auto: the written rule, and the "auto" backend running what it names."""
import pytest
import torch

import gdnlab
from gdnlab import auto
from gdnlab.inputs import make_inputs


@pytest.mark.parametrize("tokens,varlen,cuda,capturing,fla,want", [
    (512, False, False, False, False, "fast"),       # CPU: the lab's kernels under the interpreter
    (10 ** 6, False, True, False, False, "fast"),    # no fla installed
    (512, False, True, True, True, "fast"),          # captured: fast was ahead of fla at every size
    (2048, False, True, True, True, "fast"),
    (10 ** 6, False, True, True, True, "fast"),
    (512, False, True, False, True, "fast"),         # eager and short: host-bound, fla's Python side dominates
    (10 ** 6, False, True, False, True, "fast"),     # eager and long: fast has the lower device time
    (65536, True, True, True, True, "fast"),         # varlen: fla cannot be captured and is slower eagerly
])
def test_rule(tokens, varlen, cuda, capturing, fla, want):
    assert auto.choose(tokens, varlen, cuda, capturing, fla) == want


def test_a_window_sends_captured_calls_to_fla(monkeypatch):
    """The rule's window of sizes for fla (empty on the H200 now) is honoured where it is set."""
    monkeypatch.setattr(auto, "GRAPH_FLA", (1024, 4096))
    assert auto.choose(1023, False, True, True, True) == "fast"
    assert auto.choose(1024, False, True, True, True) == "fla"
    assert auto.choose(4096, False, True, True, True) == "fast"
    assert auto.choose(2048, False, True, False, True) == "fast"  # eager
    assert auto.choose(2048, True, True, True, True) == "fast"  # varlen


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
