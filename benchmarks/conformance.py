"""Conformance on the device: every conformance and isolation case on every backend, against the float64 reference
and the CuteDSL budgets, with poisoned outputs (every element written) and bit-for-bit comparison with two_kernel."""
from __future__ import annotations

import pandas as pd

from benchmarks.context import Context
from benchmarks.env import log, stamp
from benchmarks.inputs import DEV, TRITON_BACKENDS

OUTPUT = "conformance.csv"


def run(ctx: Context) -> pd.DataFrame:
    import torch

    import gdnlab
    from gdnlab.cases import CASES, ISOLATION
    from gdnlab.metrics import CUTEDSL_OUTPUT, CUTEDSL_STATE, valid_rows
    from gdnlab.reference import recurrent_gated_delta_rule_ref
    rows = []
    backends = ctx.conformance_backends or ctx.timed()
    for case in CASES + ISOLATION:
        inp = case.inputs(DEV)
        kw = inp.kwargs()
        ro, rh = recurrent_gated_delta_rule_ref(**kw)
        mask = valid_rows(inp.cu_seqlens, inp.q.shape[1]).to(DEV)
        sdt = inp.initial_state.dtype if inp.initial_state is not None else torch.float32
        outs = {}
        for be in backends:
            try:
                extra = dict(poison=True) if be in TRITON_BACKENDS else {}
                o, ht = gdnlab.chunk_gated_delta_rule(**kw, backend=be, **extra)
                torch.cuda.synchronize()
                outs[be] = (o, ht)
                ok_o, eo = CUTEDSL_OUTPUT.check(o[:, mask], ro[:, mask])
                ok_s, es = CUTEDSL_STATE.check(ht.to(sdt), rh.to(sdt))
                row = dict(case=case.name, backend=be, out_max_abs=eo["max_abs"], out_mean_abs=eo["mean_abs"],
                           out_rel_rms=eo["rel_rms"], state_max_abs=es["max_abs"], state_mean_abs=es["mean_abs"],
                           out_ok=ok_o, state_ok=ok_s, all_written=bool(torch.isfinite(o).all()),
                           padding_zero=bool((o[:, ~mask] == 0).all()), error="")
            except Exception as e:  # noqa: BLE001
                row = dict(case=case.name, backend=be, error=repr(e)[:300])
            rows.append(row)
        if "two_kernel" in outs:
            o2, h2 = outs["two_kernel"]
            for r in rows[-len(backends):]:
                if r["backend"] in outs:
                    o, h = outs[r["backend"]]
                    r["out_bit_equal_two_kernel"] = bool(torch.equal(o, o2))
                    r["state_bit_equal_two_kernel"] = bool(torch.equal(h, h2))
                    r["out_maxdiff_two_kernel"] = float((o.float() - o2.float()).abs().max())
        log("conformance", case.name)
    return stamp(pd.DataFrame(rows), ctx.env)
