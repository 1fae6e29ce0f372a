"""Conformance on the device: every conformance and isolation case, and state_v_first variants, on every backend
(the lab's and the peers'), against the float64 per-token reference and the CuteDSL budgets. Outputs are poisoned
(NaN) where the backend takes ``poison``, every valid output element and the final state must be finite, padding
rows zero and every input unchanged after the call; each output is compared bit for bit with two_kernel's."""
from __future__ import annotations

from typing import Any

import pandas as pd

from benchmarks.context import Context
from benchmarks.env import implementation, log, stamp
from benchmarks.inputs import DEV, parse_label

OUTPUT = "conformance.csv"


def state_v_first_cases() -> tuple[Any, ...]:
    """Cases run with the state laid out [V, K]: dense with an fp32 state, ragged with padding and a bf16 state."""
    import torch

    from gdnlab.cases import Case
    return (Case("svf_t129", T=129, seed=31),
            Case("svf_var_pad_bf16", seqlens=(1, 63, 130), pad=6, state_dtype=torch.bfloat16, seed=32))


def cases() -> list[tuple[Any, bool]]:
    """Every conformance case as (case, state_v_first), in the order the part runs them."""
    from gdnlab.cases import CASES, ISOLATION
    return [(c, False) for c in CASES + ISOLATION] + [(c, True) for c in state_v_first_cases()]


def case_kwargs(case: Any, state_v_first: bool, device: str = DEV) -> dict[str, Any]:
    """The case's call arguments on the device, the initial state transposed to [V, K] for state_v_first."""
    kw = case.inputs(device).kwargs()
    if state_v_first and kw["initial_state"] is not None:
        kw["initial_state"] = kw["initial_state"].transpose(-1, -2).contiguous()
    return dict(kw, state_v_first=state_v_first)


def check_one(label: str, kw: dict[str, Any], ref: tuple[Any, Any]) -> tuple[dict[str, Any], Any]:
    """One poisoned call of backend `label` judged against the reference: (row, (o, ht)) or (row with error, None)."""
    import torch

    from gdnlab.experiments import poisoned_call
    from gdnlab.metrics import CUTEDSL_OUTPUT, CUTEDSL_STATE, valid_rows
    name, opts = parse_label(label)
    mask = valid_rows(kw["cu_seqlens"], kw["q"].shape[1]).to(DEV)
    sdt = kw["initial_state"].dtype if kw["initial_state"] is not None else torch.float32
    ro, rh = ref
    try:
        before = {n: x.clone() for n, x in kw.items() if isinstance(x, torch.Tensor)}
        o, ht = poisoned_call(kw, name, **opts)
        torch.cuda.synchronize()
        ok_o, eo = CUTEDSL_OUTPUT.check(o[:, mask], ro[:, mask])
        ok_s, es = CUTEDSL_STATE.check(ht.to(sdt), rh.to(sdt))
    except Exception as e:  # noqa: BLE001 - a failing backend is a result, not a crash
        return dict(error=f"{type(e).__name__}: {str(e)[:300]}"), None
    return dict(out_max_abs=eo["max_abs"], out_mean_abs=eo["mean_abs"], out_rel_rms=eo["rel_rms"],
                state_max_abs=es["max_abs"], state_mean_abs=es["mean_abs"], out_ok=ok_o, state_ok=ok_s,
                all_written=bool(torch.isfinite(o[:, mask]).all() and torch.isfinite(ht).all()),
                padding_zero=bool((o[:, ~mask] == 0).all()),
                inputs_unchanged=all(torch.equal(before[n], kw[n]) for n in before), error=""), (o, ht)


def run(ctx: Context) -> pd.DataFrame:
    import torch

    from gdnlab.reference import recurrent_gated_delta_rule_ref
    rows = []
    backends = ctx.conformance_backends or ctx.timed()
    for case, svf in cases():
        kw = case_kwargs(case, svf)
        ref = recurrent_gated_delta_rule_ref(**kw)
        outs = {}
        for be in backends:
            row, out = check_one(be, kw, ref)
            rows.append(dict(case=case.name, state_v_first=svf, n_chunks=case.n_chunks, backend=be,
                             implementation=implementation(be), **row))
            if out is not None:
                outs[be] = out
        if "two_kernel" in outs:
            o2, h2 = outs["two_kernel"]
            for r in rows[-len(backends):]:
                if r["backend"] in outs:
                    o, h = outs[r["backend"]]
                    r["out_bit_equal_two_kernel"] = bool(torch.equal(o, o2))
                    r["state_bit_equal_two_kernel"] = bool(torch.equal(h, h2))
        log("conformance", case.name, " ".join(f"{r['backend']}={r.get('out_max_abs', 'ERR')!s:.9}"
                                               for r in rows[-len(backends):]))
    return stamp(pd.DataFrame(rows), ctx.env)
