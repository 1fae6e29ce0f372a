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
