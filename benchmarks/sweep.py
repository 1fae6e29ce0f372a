"""Error against float64 vs chunk count, out to 1024 chunks, in the report's regimes, for every backend.

One sequence of up to ``SWEEP_TOKENS`` tokens (Hk = 4, Hv = 8, K = V = 128, bf16, the conformance cases' heads) is
drawn per regime and initial-state setting: CuteDSL's q, k, v, beta with a slow gate (mean -g = 0.001, where the
state carried between chunks matters) and with CuteDSL's own fast gate, each with and without an initial state.
Each backend runs it once (poisoned); the row for ``seq_len`` n measures the first n output rows against the float64
chunked reference (docs/design.md §7), so the error at 1, 2, 4, ... 1024 chunks comes from one call. The final
state's error is recorded on the row of the full length.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from benchmarks.context import Context
from benchmarks.env import implementation, log, stamp
from benchmarks.inputs import DEV, parse_label

OUTPUT = "sweep.csv"
#: Tokens of the longest sequence (1024 chunks of 64).
SWEEP_TOKENS = 65536


def regimes() -> tuple[tuple[str, object], ...]:
    """(label, gdnlab.experiments.Problem) of every regime the sweep draws."""
    from gdnlab.experiments import Problem
    return (("slow_gate", Problem(regime="cutedsl", decay=0.001)), ("cutedsl_gate", Problem(regime="cutedsl")))


def run(ctx: Context, max_tokens: int = SWEEP_TOKENS) -> pd.DataFrame:
    import torch

    from gdnlab.experiments import poisoned_call, reference
    from gdnlab.metrics import errors
    lens = [64 * 2 ** i for i in range(20) if 64 * 2 ** i <= max_tokens]
    rows = []
    for label, prob in regimes():
        for h0 in (True, False):
            inp = prob.inputs(max_tokens, DEV, initial_state=h0)
            kw = inp.kwargs()
            o_ref, h_ref = reference(inp)
            for be in ctx.conformance_backends or ctx.timed():
                name, opts = parse_label(be)
                base = dict(prob.columns(inp), regime=label, initial_state=h0, backend=be,
                            implementation=implementation(be))
                try:
                    o, ht = poisoned_call(kw, name, **opts)
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001 - a failing backend is a result
                    rows.append(dict(base, error=f"{type(e).__name__}: {str(e)[:300]}"))
                    continue
                written = bool(torch.isfinite(o).all())
                state = errors(ht, h_ref)
                for n in lens:
                    e = errors(o[:, :n], o_ref[:, :n])
                    last = (n - 1) // 64 * 64
                    rows.append(dict(base, seq_len=n, n_chunks=n // 64, max_abs_err=e["max_abs"],
                                     mean_abs_err=e["mean_abs"], rel_rms=e["rel_rms"],
                                     last_chunk_max_abs_err=errors(o[:, last:n], o_ref[:, last:n])["max_abs"],
                                     final_state_max_abs=state["max_abs"] if n == max_tokens else np.nan,
                                     all_written=written, error=""))
                log("sweep", label, h0, be, rows[-1].get("max_abs_err", "ERR"))
            del inp, kw, o_ref, h_ref
            torch.cuda.empty_cache()
    return stamp(pd.DataFrame(rows), ctx.env)
