"""gdnlab.plans on the CPU (the interpreter runs the recorded launches): a replayed call equals a call that runs the
pipeline, takes no value from its first call or from stale workspace memory, and is used only where it may be."""
from __future__ import annotations

import pytest
import torch

import gdnlab
from gdnlab import plans
from tests.conftest import small_inputs


@pytest.fixture(autouse=True)
def fresh_plans():
    plans.clear()
    yield
    plans.clear()


def _call(inp, backend: str = "fast", **options):
    return gdnlab.chunk_gated_delta_rule(**inp.kwargs(), backend=backend, **options)


def _inputs(seed: int, **kw):
    return small_inputs(T=70, dtype=torch.bfloat16, state_dtype=torch.float32, seed=seed, **kw)


def _stale_workspaces() -> None:
    """Fill every workspace with all-ones bytes: NaN in bf16 and fp32, so a read of an unwritten element shows."""
    assert plans._POOLS
    for pool in plans._POOLS.values():
        pool.fill_(255)


@pytest.mark.parametrize("backend, options", [("fast", {}), ("fused_fixed", {}),
                                             ("fast", dict(prologue_programs=1, out_programs=1)),
                                             ("fast", dict(walk_t=True))])
def test_a_replayed_call_equals_the_pipeline_on_new_values(backend, options):
    # the looping kernels (programs=1: one run of both chunks) take the chunk plan's segments as they are
    _call(_inputs(0), backend, **options)  # records the plan
    assert plans.cached_plans() == 1 and plans.lookup(next(iter(plans._PLANS))) is not None
    _call(_inputs(0), backend, **options)  # first replay: creates the workspace
    _stale_workspaces()
    inp = _inputs(1)  # same signature, other values
    o, ht = _call(inp, backend, **options)
    plans.clear()
    o_ref, ht_ref = _call(inp, backend, poison=True, **options)  # the pipeline itself (never planned when poisoned)
    assert plans.cached_plans() == 0
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    assert torch.equal(o, o_ref) and torch.equal(ht, ht_ref)


def test_a_ragged_replay_zeroes_the_padding_and_follows_the_pipeline():
    kw = dict(seqlens=(30, 50), pad=5)
    _call(_inputs(0, **kw))
    _call(_inputs(0, **kw))
    _stale_workspaces()
    inp = _inputs(2, **kw)
    o, ht = _call(inp)
    plans.clear()
    o_ref, ht_ref = _call(inp)
    assert (o[0, 80:] == 0).all()
    assert torch.equal(o, o_ref) and torch.equal(ht, ht_ref)


def test_plans_are_keyed_by_backend_options_signature_and_alignment():
    inp = _inputs(0)
    _call(inp)
    _call(inp, BV=16)
    _call(inp, backend="two_kernel")
    _call(_inputs(0, initial_state=False))
    assert plans.cached_plans() == 4
    _call(inp)
    assert plans.cached_plans() == 4
    kw = inp.kwargs()
    q = torch.empty(kw["q"].numel() + 1, dtype=kw["q"].dtype)[1:].view(kw["q"].shape)  # 2 bytes off 16
    q.copy_(kw["q"])
    kw["q"] = q
    o, _ = gdnlab.chunk_gated_delta_rule(**kw, backend="fast")
    assert plans.cached_plans() == 5
    assert torch.equal(o, _call(inp)[0])


def test_a_bad_option_is_refused_on_every_call_and_leaves_no_plan():
    for _ in range(2):
        with pytest.raises(ValueError, match="BV"):
            _call(_inputs(0), BV=48)
    assert plans.cached_plans() == 0


def test_a_call_without_a_plan_is_remembered_and_still_runs(monkeypatch):
    monkeypatch.setattr(plans, "_whole", lambda t: False)  # no buffer counts as the pipeline's own: no plan
    inp = _inputs(0)
    want = _call(inp)
    k = next(iter(plans._PLANS))
    assert plans.cached_plans() == 1 and plans.lookup(k) is None
    recordings = []
    real = plans.interp.recorded_launches
    monkeypatch.setattr(plans.interp, "recorded_launches", lambda run=False: recordings.append(run) or real(run))
    got = _call(inp)
    assert recordings == [] and torch.equal(got[0], want[0])  # ran the pipeline without recording it again


def test_a_tensor_the_plan_cannot_account_for_stops_the_plan(monkeypatch):
    """A launch argument that is neither an input, nor the chunk plan's, nor made by the call (here: the looping
    kernels' segment tables, hidden from ChunkPlan.tensors) leaves the call without a plan instead of being
    replaced by workspace memory on replay."""
    from gdnlab.kernels.prologue import ChunkPlan
    monkeypatch.setattr(ChunkPlan, "tensors", lambda self: (self.cu_seqlens, self.chunks, self.chunk_offsets))
    opts = dict(prologue_programs=1, out_programs=1)
    _call(_inputs(0), **opts)
    assert plans.cached_plans() == 1 and plans.lookup(next(iter(plans._PLANS))) is None
    o, ht = _call(_inputs(1), **opts)
    o_ref, ht_ref = _call(_inputs(1), poison=True, **opts)
    assert torch.equal(o, o_ref) and torch.equal(ht, ht_ref)
