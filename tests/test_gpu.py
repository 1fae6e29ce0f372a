"""GPU-only checks (compiled kernels on real tensor cores); skipped without CUDA. Their results on an H200 are
committed under reports/h200/ by benchmarks/h200.py."""
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
