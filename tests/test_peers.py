"""gdnlab.peers: unavailable peers are named with their reason, and each adapter's layout conversion is right.

The adapters are checked on the CPU against stand-ins for the peers' packages that compute the float64 recurrence
in the peer's own layout (FlashInfer: packed tokens, linear gate, state [N, HV, V, K]); a wrong transposition, gate
or padding rule in an adapter then shows as a large error against the lab's reference.
"""
import sys
import types

import pytest
import torch

import gdnlab
from gdnlab import peers
from gdnlab.inputs import make_inputs
from gdnlab.metrics import errors, valid_rows
from gdnlab.reference import recurrent_gated_delta_rule_ref
from gdnlab.registry import UNAVAILABLE


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_peers_without_a_gpu_are_listed_unavailable_with_the_reason():
    assert not set(peers.PEERS) & set(gdnlab.BACKENDS) and set(peers.PEERS) <= set(UNAVAILABLE)
    with pytest.raises(ValueError, match="'flashinfer' is not available here: needs a CUDA GPU"):
        gdnlab.chunk_gated_delta_rule(*[torch.zeros(1)] * 5, backend="flashinfer")
    assert all(s.startswith("unavailable: ") for s in peers.peer_status().values())
    deps = peers.dependency_versions()
    assert list(deps) == list(peers.PEER_DEPENDENCIES)
    assert all(v.startswith("not installed (") or v[0].isdigit() for v in deps.values()), deps


def _fake_flashinfer(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
                     use_qk_l2norm_in_kernel=False, output=None, output_state=None, gate_domain="linear", **_):
    """FlashInfer's contract, computed by the lab's float64 recurrence."""
    assert q.dim() == 3 and cu_seqlens is not None and beta.dtype == torch.float32
    logg = g.log() if gate_domain == "linear" else g
    h0 = initial_state.transpose(-1, -2) if initial_state is not None else None
    o, ht = recurrent_gated_delta_rule_ref(q[None], k[None], v[None], logg[None], beta[None], scale=scale,
                                           initial_state=h0, output_final_state=True, cu_seqlens=cu_seqlens,
                                           use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
    output.copy_(o[0])
    if output_state is not None:
        output_state.copy_(ht.transpose(-1, -2))
    return (output, output_state) if output_final_state else output


def _fake_flashqla(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                   use_qk_l2norm_in_kernel=False, cu_seqlens=None, state_v_first=False, auto_cp=True):
    h0 = initial_state.transpose(-1, -2) if (initial_state is not None and state_v_first) else initial_state
    o, ht = recurrent_gated_delta_rule_ref(q, k, v, g, beta, scale=scale, initial_state=h0, output_final_state=True,
                                           cu_seqlens=cu_seqlens, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
    o = o.to(q.dtype)
    o[:, int(cu_seqlens[-1]) if cu_seqlens is not None else o.shape[1]:] = float("nan")  # the peer leaves padding
    return o, (ht.transpose(-1, -2) if state_v_first else ht)


@pytest.fixture
def fake_peers(monkeypatch):
    fi, fi_gdn, qla = (types.ModuleType(n) for n in ("flashinfer", "flashinfer.gdn_prefill", "flash_qla"))
    fi_gdn.chunk_gated_delta_rule, qla.chunk_gated_delta_rule = _fake_flashinfer, _fake_flashqla
    for name, mod in (("flashinfer", fi), ("flashinfer.gdn_prefill", fi_gdn), ("flash_qla", qla)):
        monkeypatch.setitem(sys.modules, name, mod)


@pytest.mark.parametrize("peer", ["flashinfer", "flashqla"])
@pytest.mark.parametrize("layout", ["dense", "varlen_pad_bf16_state", "state_v_first"])
def test_adapter_matches_the_reference_in_the_labs_layout(fake_peers, peer, layout):
    kw = dict(H=1, HV=2, K=128, V=128, regime="decay", seed=7)
    if layout == "dense":
        inp = make_inputs(B=2, T=9, **kw)
    else:
        inp = make_inputs(seqlens=[1, 5, 3], pad=3, state_dtype=torch.bfloat16 if "bf16" in layout else torch.float32,
                          **kw)
    args = inp.kwargs()
    svf = layout == "state_v_first"
    ro, rh = recurrent_gated_delta_rule_ref(**args)
    if svf:
        args["initial_state"] = args["initial_state"].transpose(-1, -2).contiguous()
    o, ht = peers.PEERS[peer].run(**args, state_v_first=svf, poison=True)
    if svf:
        ht = ht.transpose(-1, -2)
    mask = valid_rows(inp.cu_seqlens, o.shape[1])
    assert errors(o[:, mask], ro[:, mask])["rel_rms"] < 1e-2     # bf16 output rounding; a layout slip is O(1)
    assert errors(ht, rh)["rel_rms"] < 1e-5
    assert bool((o[:, ~mask] == 0).all())                          # padding rows zero, whatever the peer left


def test_adapters_refuse_head_sizes_the_peers_do_not_build(fake_peers):
    args = make_inputs(T=4, H=1, HV=1, K=64, V=64, seed=1).kwargs()
    for peer in ("flashinfer", "flashqla"):
        with pytest.raises(ValueError, match=f"backend '{peer}': q/k head size K must be one of"):
            peers.PEERS[peer].run(**args)
