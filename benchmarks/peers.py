"""The field's GDN prefill kernels beside the lab's, in one device call: accuracy against float64 and speed.

    python3 benchmarks/peers.py --out DIR [--parts env,conformance,sweep,bench] [--backends a,b,...]

Parts (each records its own failures instead of stopping the run):
- conformance: the 23 conformance cases, the 3 isolation cases and state_v_first variants, on every backend;
  outputs poisoned, every output element checked written, inputs checked unchanged, float64 per-token reference.
- sweep: error vs chunk count for one sequence of up to --sweep-tokens tokens (1024 chunks at 65536) in the
  report's regimes: CuteDSL's inputs with a slow gate (mean -g = 0.001) and with CuteDSL's own gate, with and
  without an initial state; float64 chunked reference.
- bench: eager and graph time of every backend at every bench shape (benchmarks/h200.py's shapes plus 4 x 8192).
Every row carries the implementation that really ran (gdnlab.peers.implementation). Results go under --out as
CSV and env.json; they are committed as a run of data/<device>/.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
import traceback

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
import gdnlab  # noqa: E402
from gdnlab import peers  # noqa: E402
from gdnlab.cases import CASES, ISOLATION, Case  # noqa: E402
from gdnlab.experiments import Problem, reference  # noqa: E402
from gdnlab.metrics import CUTEDSL_OUTPUT, CUTEDSL_STATE, errors, valid_rows  # noqa: E402
from gdnlab.reference import recurrent_gated_delta_rule_ref  # noqa: E402

DEV = "cuda"
LAB = ("two_kernel", "fused_shipped", "fused_fixed", "fused_fixed[downcast=False]", "fast")
#: Extra cases: the state laid out [V, K] (state_v_first), dense and ragged, both state dtypes.
SVF = (Case("svf_t129", T=129, seed=31), Case("svf_var_pad_bf16", seqlens=(1, 63, 130), pad=6,
                                                  state_dtype=torch.bfloat16, seed=32))


def log(*a) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def env_info() -> dict:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    import triton
    return dict(device=torch.cuda.get_device_name(0), driver=smi.split(",")[-1].strip(), nvidia_smi=smi,
                sms=torch.cuda.get_device_properties(0).multi_processor_count, torch=torch.__version__,
                triton=triton.__version__, cuda=torch.version.cuda, python=sys.version.split()[0],
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                commit=os.environ.get("GDNLAB_COMMIT", "?"), peers=peers.peer_status(),
                backends=list(gdnlab.BACKENDS))


def implementations(backends) -> dict[str, str]:
    """What runs behind each backend name."""
    return {b: (peers.implementation(split(b)[0]) if split(b)[0] in peers.PEERS else f"gdnlab {b}")
            for b in backends}


def split(be: str) -> tuple[str, dict]:
    """"fused_fixed[downcast=False]" -> ("fused_fixed", {"downcast": False}): a backend with fixed options."""
    if "[" not in be:
        return be, {}
    name, opts = be[:-1].split("[", 1)
    return name, {k: {"True": True, "False": False}.get(v, v) for k, v in (o.split("=") for o in opts.split(";"))}


def call(be: str, kw: dict):
    """One poisoned call of backend label `be` (a name, or a name with options in brackets)."""
    name, opts = split(be)
    return gdnlab.chunk_gated_delta_rule(**kw, backend=name, poison=True, **opts)


# ---- conformance ---------------------------------------------------------------------------------------------

def _case_kwargs(case: Case, svf: bool) -> dict:
    kw = case.inputs(DEV).kwargs()
    if svf and kw["initial_state"] is not None:
        kw["initial_state"] = kw["initial_state"].transpose(-1, -2).contiguous()
    return dict(kw, state_v_first=svf)


def conformance(backends, impl: dict) -> pd.DataFrame:
    rows = []
    for case, svf in [(c, False) for c in CASES + ISOLATION] + [(c, True) for c in SVF]:
        kw = _case_kwargs(case, svf)
        ro, rh = recurrent_gated_delta_rule_ref(**kw)
        T = kw["q"].shape[1]
        mask = valid_rows(kw["cu_seqlens"], T).to(DEV)
        sdt = kw["initial_state"].dtype if kw["initial_state"] is not None else torch.float32
        outs = {}
        for be in backends:
            row = dict(case=case.name, state_v_first=svf, backend=be, implementation=impl[be],
                       n_chunks=case.n_chunks, error="")
            try:
                before = {n: x.clone() for n, x in kw.items() if isinstance(x, torch.Tensor)}
                o, ht = call(be, kw)
                torch.cuda.synchronize()
                outs[be] = (o, ht)
                ok_o, eo = CUTEDSL_OUTPUT.check(o[:, mask], ro[:, mask])
                ok_s, es = CUTEDSL_STATE.check(ht.to(sdt), rh.to(sdt))
                row.update(out_max_abs=eo["max_abs"], out_mean_abs=eo["mean_abs"], out_rel_rms=eo["rel_rms"],
                           state_max_abs=es["max_abs"], state_mean_abs=es["mean_abs"], out_ok=ok_o, state_ok=ok_s,
                           all_written=bool(torch.isfinite(o[:, mask]).all() and torch.isfinite(ht).all()),
                           padding_zero=bool((o[:, ~mask] == 0).all()),
                           inputs_unchanged=all(torch.equal(before[n], kw[n]) for n in before))
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            rows.append(row)
        if "two_kernel" in outs:
            o2, h2 = outs["two_kernel"]
            for r in rows[-len(backends):]:
                if r["backend"] in outs:
                    o, h = outs[r["backend"]]
                    r["out_bit_equal_two_kernel"] = bool(torch.equal(o, o2))
                    r["state_bit_equal_two_kernel"] = bool(torch.equal(h, h2))
        log("conformance", case.name, "svf" if svf else "",
            " ".join(f"{r['backend']}={r.get('out_max_abs', 'ERR')!s:.9}" for r in rows[-len(backends):]))
    return pd.DataFrame(rows)


# ---- error vs chunk count ------------------------------------------------------------------------------------

#: The sweep's regimes: (label, Problem).
REGIMES = (("slow_gate", Problem(regime="cutedsl", decay=0.001)), ("cutedsl_gate", Problem(regime="cutedsl")))


def sweep(backends, impl: dict, max_tokens: int) -> pd.DataFrame:
    lens = [64 * 2 ** i for i in range(0, 20) if 64 * 2 ** i <= max_tokens]
    rows = []
    for label, prob in REGIMES:
        for h0 in (True, False):
            inp = prob.inputs(max_tokens, DEV, initial_state=h0)
            kw = inp.kwargs()
            t0 = time.time()
            o_ref, h_ref = reference(inp)
            log("sweep reference", label, h0, f"{time.time() - t0:.1f}s")
            for be in backends:
                base = dict(prob.columns(inp), regime=label, initial_state=h0, backend=be,
                            implementation=impl[be])
                try:
                    o, ht = call(be, kw)
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001
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
                log("sweep", label, h0, be, f"{rows[-1].get('max_abs_err', 'ERR')}")
            del inp, kw, o_ref, h_ref
            torch.cuda.empty_cache()
    return pd.DataFrame(rows)


# ---- speed -----------------------------------------------------------------------------------------------------

def bench(backends, impl: dict, shapes) -> pd.DataFrame:
    import h200  # the lab's timing harness
    bw = h200.copy_bandwidth()
    rows = []
    for B, T in shapes:
        sets = h200._sets(B, T)
        tokens = h200._tokens(B, T)
        calls = {be: h200._calls(split(be)[0], sets, **split(be)[1]) for be in backends}
        eager, errs = h200.eager_paired(calls)
        graphs: dict = {be: [] for be in backends}
        for _ in range(3):
            for be in backends:
                if be not in errs:
                    graphs[be].append(h200._graph_time(calls[be]))
        for be in backends:
            base = dict(backend=be, implementation=impl[be], B=B, T=T if T else tokens, tokens=tokens)
            if be in errs:
                rows.append(dict(base, error=errs[be]))
                continue
            ms = float(np.median(eager[be]))
            g = np.array(graphs[be], dtype=float)
            q1, q3 = np.percentile(eager[be], [25, 75])
            rows.append(dict(base, ms=ms, graph_ms=float(np.median(g)), ms_iqr=float((q3 - q1) / ms),
                             graph_spread=float(np.ptp(g) / np.median(g)), eager_samples=len(eager[be]),
                             eager_method=h200.EAGER_METHOD, rounds=len(g),
                             floor_ms=h200.floor_bytes(sets[0]) / bw * 1e3, error=""))
            log("bench", be, B, T, f"eager {ms:.4f} graph {rows[-1]['graph_ms']:.4f}")
        del sets, calls
        torch.cuda.empty_cache()
    df = pd.DataFrame(rows)
    df["copy_bw_GBps"] = bw / 1e9
    return df


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--parts", default="env,conformance,sweep,bench")
    ap.add_argument("--backends", default=None, help="comma list (default: the lab's paths and every peer here)")
    ap.add_argument("--sweep-tokens", type=int, default=65536)
    ap.add_argument("--shapes", default=None, help="e.g. 1x512,8x2048,varlen (default: all bench shapes)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    backends = a.backends.split(",") if a.backends else [*LAB, *[p for p in peers.PEERS if p in gdnlab.BACKENDS]]
    env = env_info()
    impl = implementations(backends)
    env["implementations"] = impl
    with open(os.path.join(a.out, "env.json"), "w") as f:
        json.dump(env, f, indent=1)
    log("env", json.dumps(env)[:1500])
    import h200
    shape_list = [*h200.SHAPES[:-1], (4, 8192), h200.SHAPES[-1]]
    if a.shapes:
        want = a.shapes.split(",")
        shape_list = [s for s in shape_list if (("varlen" if s[0] == "varlen" else f"{s[0]}x{s[1]}") in want)]
    failed = 0
    for part in a.parts.split(","):
        if part == "env":
            continue
        t0 = time.time()
        try:
            if part == "conformance":
                df = conformance(backends, impl)
            elif part == "sweep":
                df = sweep(backends, impl, a.sweep_tokens)
            elif part == "bench":
                df = bench([b for b in backends if b != "two_kernel"], impl, shape_list)
            else:
                raise ValueError(f"--parts: unknown part {part!r}")
            df = df.assign(device=env["device"], torch=env["torch"], triton=env["triton"], date=env["date"])
            df.to_csv(os.path.join(a.out, f"peers_{part}.csv"), index=False)
            log(part, "done", f"{time.time() - t0:.0f}s", len(df), "rows")
        except Exception:  # noqa: BLE001
            failed += 1
            log(part, "FAILED\n" + traceback.format_exc())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
