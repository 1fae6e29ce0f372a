"""One device call on a CUDA GPU: check, compare and time every backend; write CSV/JSON under --out.

    python3 benchmarks/h200.py --out $OUT [--parts env,prologue,conformance,mma,bench,breakdown,stages,variants,
                                           fla_tuning,in_situ,host] [--variants STUDY] [--register STUDY]

Each part records its own failures instead of stopping the run, so one call yields everything it can. Results are
committed as one run, data/h200/<run_id>/ listed in data/h200/RUNS.csv, with the device, driver, torch and Triton
versions and the date (env.json).
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import random
import subprocess
import sys
import time
import traceback

import numpy as np
import pandas as pd
import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import gdnlab  # noqa: E402
from gdnlab.backends import get_backend  # noqa: E402
from gdnlab.cases import CASES, ISOLATION  # noqa: E402
from gdnlab.inputs import make_inputs  # noqa: E402
from gdnlab.kernels import ChunkPlan, alloc, fused, l2norm, run_prologue, two_kernel  # noqa: E402
from gdnlab.metrics import CUTEDSL_OUTPUT, CUTEDSL_STATE, valid_rows  # noqa: E402
from gdnlab.reference import recurrent_gated_delta_rule_ref  # noqa: E402
from gdnlab.speed import SYNCED  # noqa: E402

DEV = "cuda"
TRITON_BACKENDS = ("two_kernel", "fused_shipped", "fused_fixed", "fast", "auto")


#: The run's facts every table row carries.
ENV_KEYS = ("device", "torch", "triton", "date")


def _stamp(df: pd.DataFrame, env: dict) -> pd.DataFrame:
    """df with the run's device, torch, Triton and date in every row."""
    return df.assign(**{k: env[k] for k in ENV_KEYS})


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def env_info() -> dict:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,memory.total",
                          "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    try:
        import fla
        fla_version = getattr(fla, "__version__", "?")
    except Exception as e:  # noqa: BLE001
        fla_version = f"unavailable: {e!r}"
    p = torch.cuda.get_device_properties(0)
    return dict(device=torch.cuda.get_device_name(0), nvidia_smi=smi, sms=p.multi_processor_count,
                torch=torch.__version__, triton=triton.__version__, cuda=torch.version.cuda, fla=fla_version,
                python=sys.version.split()[0], date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                backends=list(gdnlab.BACKENDS))


# ---- conformance on real tensor cores --------------------------------------------------------------------------

def conformance(env: dict, backends=None) -> pd.DataFrame:
    rows = []
    backends = backends or [b for b in gdnlab.BACKENDS if b != "reference"]
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
    df = pd.DataFrame(rows)
    return _stamp(df, env)


# ---- the Hopper accumulation model against the tensor cores -------------------------------------------------------

@triton.jit
def _tile_dot(a_ptr, b_ptr, c_ptr, d_ptr, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr):
    i = tl.program_id(0)
    rm, rk, rn = tl.arange(0, M), tl.arange(0, K), tl.arange(0, N)
    a = tl.load(a_ptr + i * M * K + rm[:, None] * K + rk[None, :])
    b = tl.load(b_ptr + i * K * N + rk[:, None] * N + rn[None, :])
    c = tl.load(c_ptr + i * M * N + rm[:, None] * N + rn[None, :])
    tl.store(d_ptr + i * M * N + rm[:, None] * N + rn[None, :], tl.dot(a, b, c))


def mma_hardware(env: dict, n: int = 2000) -> pd.DataFrame:
    from gdnlab import mma
    rows = []
    for m, k, cols, warps in [(64, 64, 64, 4), (16, 16, 16, 1), (64, 16, 8, 4)]:
        a, b, c = mma.hardware_check_tiles(n, seed=m + k + cols, m=m, k=k, cols=cols)
        at = torch.from_numpy(a).to(DEV).to(torch.bfloat16)
        assert torch.equal(at.float().cpu(), torch.from_numpy(a)), "tiles must hold bf16 values"
        bt = torch.from_numpy(b).to(DEV).to(torch.bfloat16)
        ct = torch.from_numpy(c).to(DEV)
        d = torch.full_like(ct, float("nan"))
        kern = _tile_dot[(n,)](at, bt, ct, d, M=m, K=k, N=cols, num_warps=warps)
        ptx = kern.asm.get("ptx", "")
        instr = "wgmma" if "wgmma" in ptx else ("mma.sync" if "mma.sync" in ptx else "none")
        dh = d.cpu().numpy()
        kinds = mma.tile_kinds(n, mma.HARDWARE_KINDS)
        for name in ("hopper", "ideal", "ampere"):
            want = mma.get_model(name).dot(a, b, c)
            per_tile = np.array([mma.bit_exact_fraction(dh[i], want[i]) for i in range(n)])
            rows.append(dict(model=name, shape=f"{m}x{k}x{cols}", instruction=instr, cases=n * m * cols, tiles=n,
                             bit_exact_fraction=float(per_tile.mean()),
                             tiles_all_exact=float((per_tile == 1).mean())))
            for kind in sorted(set(kinds)):
                sel = np.array([x == kind for x in kinds])
                rows.append(dict(model=name, shape=f"{m}x{k}x{cols}", instruction=instr, kind=kind,
                                 cases=int(sel.sum()) * m * cols, tiles=int(sel.sum()),
                                 bit_exact_fraction=float(per_tile[sel].mean())))
        log("mma", m, k, cols, instr)
    df = pd.DataFrame(rows)
    return _stamp(df, env)


# ---- speed ---------------------------------------------------------------------------------------------------

QWEN = dict(H=16, HV=32, K=128, V=128)
SHAPES = [(1, 512), (1, 1024), (1, 2048), (1, 4096), (1, 8192), (1, 32768), (1, 65536), (8, 2048), ("varlen", None)]
VARLEN = [3000, 17, 512, 1, 4096, 700, 64, 129, 2048, 333]


def _tokens(B, T) -> int:
    """Tokens of a bench shape (B x T, or the ragged batch's total)."""
    return sum(VARLEN) if B == "varlen" else B * T


def copy_bandwidth() -> float:
    x = torch.empty(2 * 1024 ** 3 // 2, dtype=torch.bfloat16, device=DEV).normal_()
    y = torch.empty_like(x)
    ms = triton.testing.do_bench(lambda: y.copy_(x), warmup=50, rep=200, return_mode="median")
    return 2 * x.numel() * 2 / (ms * 1e-3)  # bytes read + written per second


def _inputs(B, T, seed):
    if B == "varlen":
        return make_inputs(seqlens=VARLEN, seed=seed, device=DEV, **QWEN)
    return make_inputs(B=B, T=T, seed=seed, device=DEV, **QWEN)


def floor_bytes(inp) -> int:
    q = inp.q
    toks = q.shape[0] * q.shape[1]
    H, K, HV, V = q.shape[2], q.shape[3], inp.v.shape[2], inp.v.shape[3]
    n = inp.n_seqs if hasattr(inp, "n_seqs") else q.shape[0]
    return toks * (2 * H * K * 2 + HV * V * 2 + HV * 4 + HV * 2 + HV * V * 2) + 2 * n * HV * K * V * 4


def _sets(B, T, set_bytes_target=512 * 1024 ** 2):
    one = _inputs(B, T, 0)
    size = sum(x.numel() * x.element_size() for x in (one.q, one.k, one.v, one.g, one.beta))
    n = int(min(8, max(2, -(-set_bytes_target // max(size, 1)))))
    return [one] + [_inputs(B, T, s) for s in range(1, n)]


def _kwargs(inp, be: str) -> dict:
    """A call's arguments; the lab's backends get cu_seqlens on the host, which makes a varlen call capturable."""
    kw = inp.kwargs()
    if kw.get("cu_seqlens") is not None and be != "fla":
        kw["cu_seqlens"] = kw["cu_seqlens"].cpu()
    return kw


def _capture(calls) -> list:
    """One CUDA graph per call, each captured after a warm-up call."""
    graphs = []
    for c in calls:
        c()
        torch.cuda.synchronize()
        gr = torch.cuda.CUDAGraph()
        with torch.cuda.graph(gr):
            c()
        graphs.append(gr)
    return graphs


def _calls(be, sets, **opts) -> list:
    """One call per input set, on backend `be`."""
    return [lambda kw=_kwargs(x, be): gdnlab.chunk_gated_delta_rule(**kw, backend=be, **opts) for x in sets]


def _graph_time(calls) -> float:
    """Median time of replaying the calls' CUDA graphs in turn (nan when a call cannot be captured)."""
    try:
        git = itertools.cycle(_capture(calls))
        return triton.testing.do_bench(lambda: next(git).replay(), warmup=25, rep=100, return_mode="median")
    except Exception as e:  # noqa: BLE001
        log("graph capture failed", repr(e)[:200])
        return float("nan")


def time_backend(be, sets, **opts) -> tuple[float, float]:
    calls = _calls(be, sets, **opts)
    it = itertools.cycle(calls)
    eager = triton.testing.do_bench(lambda: next(it)(), warmup=25, rep=100, return_mode="median")
    return eager, _graph_time(calls)


#: How eager_paired samples, written into bench.csv (data/<device>/RUNS.csv's timing_method records it per run).
EAGER_METHOD = SYNCED


def eager_paired(calls: dict, reps: int = 200, warmup: int = 5) -> tuple[dict, dict]:
    """Eager time of every backend's call, sampled call by call with the backends in a fresh shuffled order each
    repetition, so that host drift (seconds long, up to 2x on this machine) hits every backend alike. Each sample
    is what do_bench times: L2 flushed, then the GPU time from an event before the call to one after it, which for
    a host-bound call is the host's launch span. Each sample starts from an idle GPU (synchronised first), as a
    lone call does: data/h200/2026-12-03T0607-bench and 0755-bench (sixth and seventh sessions) were sampled
    without it, and there a host-bound call (FLA at 4096-8192 tokens) queued behind the other backends'
    device-bound calls had its host work hidden (benchmarks/NOTES.md item 18). Returns (samples in ms by backend,
    error by backend)."""
    flush = torch.empty(256 * 1024 ** 2 // 4, dtype=torch.int32, device=DEV)
    its = {be: itertools.cycle(c) for be, c in calls.items()}
    errors = {}
    for be in list(its):
        try:
            for _ in range(warmup):
                next(its[be])()
        except Exception as e:  # noqa: BLE001
            errors[be] = repr(e)[:300]
            del its[be]
    torch.cuda.synchronize()
    names, events = list(its), {be: [] for be in its}
    rng = random.Random(0)
    for _ in range(reps):
        rng.shuffle(names)
        for be in names:
            torch.cuda.synchronize()
            flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            next(its[be])()
            end.record()
            events[be].append((start, end))
    torch.cuda.synchronize()
    return {be: np.array([a.elapsed_time(b) for a, b in ev]) for be, ev in events.items()}, errors


def _against_fast(kw: dict, backends) -> dict:
    """Each lab backend's poisoned output on one input compared with fast's: bit_equal_fast, maxdiff_fast,
    all_written (or the error it raised)."""
    o_ref, h_ref = gdnlab.chunk_gated_delta_rule(**kw, backend="fast", poison=True)
    checks = {}
    for be in backends:
        if be == "fla":
            continue
        try:
            o, h = gdnlab.chunk_gated_delta_rule(**kw, backend=be, poison=True)
            torch.cuda.synchronize()
            checks[be] = dict(bit_equal_fast=bool(torch.equal(o, o_ref) and torch.equal(h, h_ref)),
                              maxdiff_fast=float((o.float() - o_ref.float()).abs().max()),
                              all_written=bool(torch.isfinite(o).all()))
        except Exception as e:  # noqa: BLE001
            checks[be] = dict(error=repr(e)[:300])
    return checks


def bench(env: dict, bw: float, backends, rounds: int = 3) -> pd.DataFrame:
    """Every backend at every bench shape. Eager: eager_paired, ms its median and ms_iqr the interquartile range
    over the median. Graph: `rounds` interleaved rounds of do_bench, graph_ms their median and graph_spread
    (max - min) / median. Each lab backend's output on the first set is compared bit for bit with fast's
    (bit_equal_fast)."""
    rows = []
    for B, T in SHAPES:
        sets = _sets(B, T)
        tokens = _tokens(B, T)
        floor_ms = floor_bytes(sets[0]) / bw * 1e3
        equal = _against_fast(_kwargs(sets[0], "fast"), backends)
        calls = {be: _calls(be, sets) for be in backends}
        eager, errors = eager_paired(calls)
        graphs: dict = {be: [] for be in backends}
        for _ in range(rounds):
            for be in backends:
                if be not in errors:
                    graphs[be].append(_graph_time(calls[be]))
        for be in backends:
            if be in errors:
                rows.append(dict(backend=be, B=B, T=T, tokens=tokens, error=errors[be]))
                continue
            ms = float(np.median(eager[be]))
            g = np.array(graphs[be], dtype=float)
            gms = float(np.median(g))
            q1, q3 = np.percentile(eager[be], [25, 75])
            rows.append(dict(backend=be, B=B, T=T if T else tokens, tokens=tokens, ms=ms, graph_ms=gms,
                             ms_iqr=float((q3 - q1) / ms), graph_spread=float(np.ptp(g) / gms),
                             eager_samples=len(eager[be]), eager_method=EAGER_METHOD, rounds=len(g),
                             seed=f"0..{len(sets) - 1} (rotated sets)",
                             tokens_per_s=tokens / (min(ms, gms if gms == gms else ms) * 1e-3),
                             floor_ms=floor_ms, bit_equal_fast=equal.get(be, {}).get("bit_equal_fast"),
                             error=""))
            log("bench", be, B, T, round(ms, 4), round(gms, 4), "iqr", round(rows[-1]["ms_iqr"], 3))
        del sets, calls
        torch.cuda.empty_cache()
    df = pd.DataFrame(rows)
    df["copy_bw_GBps"] = bw / 1e9
    return _stamp(df, env)


def prologue_variants(env: dict) -> pd.DataFrame:
    """The prologue alone, per way of finishing the solve (SOLVE), num_warps, and l2-norm inside or not: time,
    and the largest difference of W and U from the default configuration (0: bit-equal)."""
    rows = []
    H, HV, K, V = QWEN["H"], QWEN["HV"], QWEN["K"], QWEN["V"]
    for T in (512, 8192, 32768):
        inp = _inputs(1, T, 0)
        q, k, v = inp.q.reshape(T, H, K), inp.k.reshape(T, H, K), inp.v.reshape(T, HV, V)
        g, beta = inp.g.reshape(T, HV), inp.beta.reshape(T, HV)
        plan = ChunkPlan.build([(0, T)], q.device)
        base = run_prologue(q, k, v, g, beta, plan, True)
        for solve, nw, fuse in [(s, w, False) for s in ("blocks", "tf32x3", "ieee") for w in (2, 4, 8)] + \
                               [("blocks", w, True) for w in (2, 4, 8)]:
            f = lambda: run_prologue(q, k, v, g, beta, plan, True, fuse_norm=fuse, num_warps=nw, solve=solve)
            try:
                p2 = f()
                t = triton.testing.do_bench(f, return_mode="median")
                diff = max(float((getattr(p2, n).float() - getattr(base, n).float()).abs().max())
                           for n in ("q", "k", "g_cum", "w", "u"))
                finite = bool(torch.isfinite(p2.w).all() and torch.isfinite(p2.u).all())
                rows.append(dict(T=T, solve=solve, num_warps=nw, l2norm_inside=fuse, ms=t, programs=plan.n_chunks * HV,
                                 maxdiff_default=diff, finite=finite))
            except Exception as e:  # noqa: BLE001
                rows.append(dict(T=T, solve=solve, num_warps=nw, l2norm_inside=fuse, error=repr(e)[:300]))
            log("prologue", T, solve, nw, fuse, rows[-1].get("ms"), rows[-1].get("maxdiff_default"))
    df = pd.DataFrame(rows)
    return _stamp(df, env)


def breakdown(env: dict, ok_configs: set | None = None) -> pd.DataFrame:
    """Kernel-level times: prologue, two-kernel, fused per BV/warps; per-chunk cost and programs vs SMs. Only the
    (path, BV, num_warps) configs in ok_configs (those the crash-isolated probe ran correctly) are timed."""
    rows = []
    sms = env["sms"]
    allowed = lambda path, bv, nw: ok_configs is None or (path, bv, nw) in ok_configs
    for T in (2048, 8192, 32768):
        inp = _inputs(1, T, 0)
        tok = T
        H, HV, K, V = QWEN["H"], QWEN["HV"], QWEN["K"], QWEN["V"]
        q, k, v = inp.q.reshape(tok, H, K), inp.k.reshape(tok, H, K), inp.v.reshape(tok, HV, V)
        g, beta = inp.g.reshape(tok, HV), inp.beta.reshape(tok, HV)
        h0 = inp.initial_state
        plan = ChunkPlan.build([(0, T)], q.device)
        pro = run_prologue(q, k, v, g, beta, plan, True)
        o = alloc((tok, HV, V), q.dtype, q.device, False)
        ht = alloc((1, HV, K, V), torch.float32, q.device, False)
        nt = plan.n_chunks
        t = triton.testing.do_bench(lambda: run_prologue(q, k, v, g, beta, plan, True), return_mode="median")
        rows.append(dict(T=T, stage="prologue (l2norm x2 + cumsum/kkt/solve/wy)", ms=t, programs=nt * HV))
        for bv in (32, 64):
            for nw in (4, 8):
                if not allowed("two_kernel", bv, nw):
                    continue
                t = triton.testing.do_bench(lambda: two_kernel(pro, v, o, plan, h0, ht, 0.1, False, BV=bv,
                                                               num_warps=nw), return_mode="median")
                rows.append(dict(T=T, stage="two_kernel (fwd_h + fwd_o)", BV=bv, num_warps=nw, ms=t,
                                 programs=(V // bv) * HV))
        for bv in (16, 32, 64):
            for nw in (4, 8):
                if not allowed("fused", bv, nw):
                    continue
                for intra in (False, True):
                    t = triton.testing.do_bench(lambda: fused(pro, v, o, plan, h0, ht, 0.1, False, BV=bv,
                                                              num_warps=nw, intra_vnew=intra), return_mode="median")
                    rows.append(dict(T=T, stage="fused_fixed" if intra else "fused_shipped", BV=bv, num_warps=nw,
                                     ms=t, programs=(V // bv) * HV, us_per_chunk=t * 1e3 / nt))
        log("breakdown", T)
    df = pd.DataFrame(rows)
    df["sms"] = sms
    df["programs_per_sm"] = df["programs"] / sms
    return _stamp(df, env)


def graph_ms(fn) -> float:
    """Device time of one call of fn, replayed from a CUDA graph (median of triton.testing.do_bench)."""
    return triton.testing.do_bench(_capture([fn])[0].replay, warmup=25, rep=100, return_mode="median")


#: Kernel configs the stage study times: prologue (solve, warps); state kernel (BV, warps, stages); output kernel
#: (BV, warps, stages). Configs once seen to fail (BV < 64 at 4 warps) come last in their list. (The committed
#: stages.csv also holds a 16-row prologue form since removed: benchmarks/NOTES.md item 10.)
PROLOGUES = [("blocks", 4), ("blocks", 2), ("tf32x3", 4)]
STATE_CFGS = [(64, 4, None), (64, 4, 2), (64, 4, 4), (64, 2, None), (64, 8, None), (32, 8, None), (32, 8, 2),
              (32, 2, None), (32, 2, 2), (32, 4, None), (32, 4, 2)]
OUT_CFGS = [(64, 4, None), (64, 4, 2), (64, 8, None), (128, 8, None), (128, 8, 2), (128, 4, None), (128, 4, 2)]


def stages(env: dict, out_dir: str) -> pd.DataFrame:
    """Every stage of the lab's pipeline and of FLA's, each timed alone in graph replay; each lab config checked
    bit for bit against the default config on the same inputs (a config that differs is not eligible); then the
    whole call with the fastest eligible config of each stage, against FLA. Rows are appended to stages.csv as they
    come, so that a crash keeps what ran before it."""
    H, HV, K, V = QWEN["H"], QWEN["HV"], QWEN["K"], QWEN["V"]
    path = os.path.join(out_dir, "stages.csv")
    rows: list[dict] = []

    def add(**r):
        r.update({k: env[k] for k in ENV_KEYS})
        rows.append(r)
        pd.DataFrame(rows).to_csv(path, index=False)
        log("stage", {k: v for k, v in r.items() if k not in ENV_KEYS})

    for T in (512, 2048, 8192, 32768):
        inp = _inputs(1, T, 0)
        q, k, v = inp.q.reshape(T, H, K), inp.k.reshape(T, H, K), inp.v.reshape(T, HV, V)
        g, beta = inp.g.reshape(T, HV).float(), inp.beta.reshape(T, HV)
        h0 = inp.initial_state
        plan = ChunkPlan.build([(0, T)], q.device)
        qn, kn = l2norm(q), l2norm(k)
        add(T=T, stage="l2norm q+k", config="", ms=graph_ms(lambda: (l2norm(q), l2norm(k))))
        base = run_prologue(qn, kn, v, g, beta, plan, False)
        best_pro = None
        for form, nw in PROLOGUES:
            try:
                p2 = run_prologue(qn, kn, v, g, beta, plan, False, num_warps=nw, solve=form)
                torch.cuda.synchronize()
                same = all(torch.equal(getattr(p2, n), getattr(base, n)) for n in ("g_cum", "w", "u"))
                diff = max(float((getattr(p2, n).float() - getattr(base, n).float()).abs().max()) for n in ("w", "u"))
                t = graph_ms(lambda: run_prologue(qn, kn, v, g, beta, plan, False, num_warps=nw, solve=form))
                add(T=T, stage="prologue", config=f"{form} w{nw}", form=form, num_warps=nw, ms=t, bit_equal=same,
                    maxdiff=diff, programs=plan.n_chunks * HV)
                if best_pro is None or t < best_pro[0]:
                    best_pro = (t, form, nw)
            except Exception as e:  # noqa: BLE001
                add(T=T, stage="prologue", config=f"{form} w{nw}", error=repr(e)[:300])
        o = alloc((T, HV, V), q.dtype, q.device, False)
        ht = alloc((1, HV, K, V), torch.float32, q.device, False)
        two_kernel(base, v, o, plan, h0, ht, 0.1, False)
        o_ref, ht_ref = o.clone(), ht.clone()

        def trial(stage: str, cfg: tuple, programs: int, **opts) -> float | None:
            """Run two_kernel with opts, compare with the default bit for bit, time it; its ms if bit-equal."""
            label = "BV{} w{} s{}".format(*cfg)
            try:
                o.fill_(float("nan"))
                two_kernel(base, v, o, plan, h0, ht, 0.1, False, **opts)
                torch.cuda.synchronize()
                same = torch.equal(o, o_ref) and torch.equal(ht, ht_ref)
                t = graph_ms(lambda: two_kernel(base, v, o, plan, h0, ht, 0.1, False, **opts))
                add(T=T, stage=stage, config=label, BV=cfg[0], num_warps=cfg[1], num_stages=cfg[2], ms=t,
                    bit_equal=same, maxdiff=float((o.float() - o_ref.float()).abs().max()), programs=programs)
                return t if same else None
            except Exception as e:  # noqa: BLE001
                add(T=T, stage=stage, config=label, error=repr(e)[:300])
                return None

        # the state kernel's configs, the output kernel fixed; then the output kernel's, with the best state config
        timed = {c: trial("fwd_h + fwd_o(64, w4)", c, (V // c[0]) * HV, BV=c[0], num_warps=c[1], num_stages=c[2],
                          out_BV=64, out_warps=4) for c in STATE_CFGS}
        hbv, hnw, hns = min((c for c in timed if timed[c] is not None), key=timed.get)
        timed = {c: trial(f"fwd_h(BV{hbv} w{hnw} s{hns}) + fwd_o", c, (V // c[0]) * plan.n_chunks * HV, BV=hbv,
                          num_warps=hnw, num_stages=hns, out_BV=c[0], out_warps=c[1], out_stages=c[2])
                 for c in OUT_CFGS}
        obv, onw, ons = min((c for c in timed if timed[c] is not None), key=timed.get)
        # FLA's stages, each alone
        try:
            from fla.modules.norm.l2norm import l2norm_fwd
            from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_h
            from fla.ops.common.chunk_o import chunk_fwd_o
            from fla.ops.gated_delta_rule.chunk_fwd import chunk_gated_delta_rule_fwd_intra
            from fla.ops.utils import chunk_local_cumsum
            from fla.ops.utils.constant import RCP_LN2
            q4, k4, v4, g4, b4 = inp.q, inp.k, inp.v, inp.g.float(), inp.beta
            add(T=T, stage="fla l2norm q+k", ms=graph_ms(lambda: (l2norm_fwd(q4), l2norm_fwd(k4))))
            qf, kf = l2norm_fwd(q4)[0], l2norm_fwd(k4)[0]
            add(T=T, stage="fla cumsum", ms=graph_ms(lambda: chunk_local_cumsum(g4, chunk_size=64, scale=RCP_LN2)))
            gc = chunk_local_cumsum(g4, chunk_size=64, scale=RCP_LN2)
            add(T=T, stage="fla intra (kkt+solve, w/u)",
                ms=graph_ms(lambda: chunk_gated_delta_rule_fwd_intra(k=kf, v=v4, g=gc, beta=b4)))
            w, u, _ = chunk_gated_delta_rule_fwd_intra(k=kf, v=v4, g=gc, beta=b4)
            add(T=T, stage="fla fwd_h", ms=graph_ms(lambda: chunk_gated_delta_rule_fwd_h(
                k=kf, w=w, u=u, g=gc, initial_state=h0, output_final_state=True)))
            hh, vn, _ = chunk_gated_delta_rule_fwd_h(k=kf, w=w, u=u, g=gc, initial_state=h0, output_final_state=True)
            add(T=T, stage="fla fwd_o", ms=graph_ms(lambda: chunk_fwd_o(q=qf, k=kf, v=vn, h=hh, g=gc, scale=0.1)))
        except Exception as e:  # noqa: BLE001
            add(T=T, stage="fla stages", error=repr(e)[:300])
        # whole calls: the default, and the fastest eligible config of every stage
        kw = inp.kwargs()
        _, pform, pnw = best_pro
        best = dict(prologue_solve=pform, prologue_warps=pnw, BV=hbv, num_warps=hnw, num_stages=hns, out_BV=obv,
                    out_warps=onw, out_stages=ons)
        for name, be, opts in [("two_kernel", "two_kernel", {}), ("fast (current)", "fast", {}),
                               ("best stages", "two_kernel", best), ("fla", "fla", {})]:
            try:
                add(T=T, stage="whole call", config=name, options=json.dumps(opts),
                    ms=graph_ms(lambda: gdnlab.chunk_gated_delta_rule(**kw, backend=be, **opts)))
            except Exception as e:  # noqa: BLE001
                add(T=T, stage="whole call", config=name, error=repr(e)[:300])
        del inp, base
        torch.cuda.empty_cache()
    return pd.DataFrame(rows)


#: Candidate changes to "fast" (fourth session), by study: name -> (base backend, options on top of it). Each
#: study is timed against "fast" and FLA in rounds (`--variants STUDY`; variants_STUDY.csv). The studies "pdl_nq"
#: (programmatic dependent launch) and "early_v" (v loaded before the prologue's solve; state kernel BV 16) ran
#: with options since removed as slower; their code is commit 6f46325 (benchmarks/NOTES.md item 12). So did
#: "overlap" (the state walk and the outputs in one launch; commit 5a7e3ed, NOTES item 16), and "depth_pf" (the
#: walk's tiles loaded a chunk ahead by hand; commit 2f9beb8, NOTES item 17).
STUDIES = {
    # int32 indices in the kernels (the default where no buffer needs int64) against int64 everywhere
    "index": {
        "fast+i64": ("fast", dict(index64=True)),
    },
    # configs for short prefills, where every input is read cold once (rotated sets); when it ran, "fast" had 2
    # prologue warps at every size and q normalised by its own launch
    "small": {
        "fast+pw4": ("fast", dict(prologue_warps=4)),
        "fast+pw4+nq": ("fast", dict(prologue_warps=4, norm_q_in_output=True)),
        "fast+nq": ("fast", dict(norm_q_in_output=True)),
        "pw4+bv64+o64": ("two_kernel", {}),
        "pw4+bv64+o64+nq": ("two_kernel", dict(norm_q_in_output=True)),
        "pw4+bv32+o64": ("two_kernel", dict(BV=32, out_BV=64)),
        "pw4+bv64+o128": ("two_kernel", dict(out_BV=128)),
        "pw2+bv64+o128": ("two_kernel", dict(prologue_warps=2, out_BV=128)),
    },
    # host work per eager call (sixth session): q's and k's l2-norm inside the prologue, one launch fewer
    "eager": {
        "fast+fn": ("fast", dict(fuse_norm=True)),
        "fast+nq": ("fast", dict(norm_q_in_output=True)),
    },
    # the state kernel's software-pipelining depth (Triton's default is 3; the output kernel kept at 3), and the
    # prologue at one warp (FLA's re-tuned kkt/solve runs one; seventh session)
    "depth": {
        "fast+hs2": ("fast", dict(num_stages=2, out_stages=3)),
        "fast+hs4": ("fast", dict(num_stages=4, out_stages=3)),
        "fast+pw1": ("fast", dict(prologue_warps=1)),
    },
    # the latest bench: auto's eager pick below 4096 tokens, and fast as it was before the depth rule (the walk at
    # Triton's 3 stages at every size)
    "final": {
        "fast+fn": ("fast", dict(fuse_norm=True)),
        "fast+hs3": ("fast", dict(num_stages=3)),
    },
}


def _register_variants(study: dict) -> None:
    for name, (base, opts) in study.items():
        if name == base or name in ("fast", "fla", "two_kernel"):
            raise ValueError(f"variant {name!r} would replace the backend it compares with")

        def run(q, k, v, g, beta, _base=base, _opts=opts, **kw):
            return get_backend(_base)(q, k, v, g, beta, **{**_opts, **kw})
        run.validates_itself = True
        gdnlab.register_backend(name, run, overwrite=True)


def variants(env: dict, bw: float, study: str, shapes=None, rounds: int = 3) -> pd.DataFrame:
    """Each candidate of STUDIES[study], "fast" and FLA at every bench shape (or `shapes`): first checked bit for
    bit against "fast" (poisoned outputs), then timed (eager and graph) in `rounds` interleaved rounds, so that
    drift between the backends' measurements is shared."""
    cands = STUDIES[study]
    _register_variants(cands)
    names = ["fast", *cands, "fla"]
    rows = []
    for B, T in shapes or SHAPES:
        sets = _sets(B, T)
        tokens = _tokens(B, T)
        floor_ms = floor_bytes(sets[0]) / bw * 1e3
        checks = _against_fast(_kwargs(sets[0], "fast"), cands)
        log("variant check", B, T, checks)
        for r in range(rounds):
            for be in names:
                try:
                    ms, gms = time_backend(be, sets)
                    rows.append(dict(backend=be, B=B, T=T if T else tokens, tokens=tokens, round=r, ms=ms,
                                     graph_ms=gms, floor_ms=floor_ms, **checks.get(be, {})))
                except Exception as e:  # noqa: BLE001
                    rows.append(dict(backend=be, B=B, T=T, tokens=tokens, round=r, error=repr(e)[:300]))
                log("variant", be, B, T, r, rows[-1].get("ms"), rows[-1].get("graph_ms"))
        del sets
        torch.cuda.empty_cache()
    df = pd.DataFrame(rows)
    df["study"] = study
    med = df.groupby(["B", "T", "backend"], sort=False)["graph_ms"].median().unstack()
    print((med.div(med["fla"], axis=0)).round(3).to_string(), flush=True)
    df["copy_bw_GBps"] = bw / 1e9
    return _stamp(df, env)


def _fla_autotuners() -> dict:
    """Every triton Autotuner object in the loaded fla modules, by qualified name."""
    from triton.runtime.autotuner import Autotuner
    found = {}
    for mname, mod in list(sys.modules.items()):
        if mname.startswith("fla.") and mod is not None:
            for aname, obj in list(vars(mod).items()):
                for _ in range(4):  # through heuristics and other wrappers, to the autotuner
                    if isinstance(obj, Autotuner):
                        found[f"{mname}.{aname}"] = obj
                        break
                    obj = getattr(obj, "fn", None)
    return found


def fla_tuning(env: dict, tokens=(2048, 32768), draws: int = 4) -> pd.DataFrame:
    """Is FLA's run-to-run spread its autotuner? Per size, `draws` times: clear every FLA autotuner's cache (and
    its on-disk results, so that it times its configs again), call FLA once (it re-tunes), time it in graph replay
    (rotated sets), record the configs it picked."""
    rows = []
    for T in tokens:
        sets = _sets(1, T)
        for d in range(draws):
            for tuner in _fla_autotuners().values():
                tuner.cache.clear()
                if hasattr(tuner, "cache_results"):
                    tuner.cache_results = False
            gdnlab.chunk_gated_delta_rule(**_kwargs(sets[0], "fla"), backend="fla")
            torch.cuda.synchronize()
            _, gms = time_backend("fla", sets)
            picked = {n.split(".")[-1]: str(c) for n, t in _fla_autotuners().items() for c in t.cache.values()}
            _, fast_gms = time_backend("fast", sets)
            rows.append(dict(T=T, draw=d, fla_graph_ms=gms, fast_graph_ms=fast_gms, configs=json.dumps(picked)))
            log("fla tuning", T, d, gms, fast_gms, picked)
        del sets
        torch.cuda.empty_cache()
    df = pd.DataFrame(rows)
    return _stamp(df, env)


def in_situ(env: dict, backends=("fast", "fla")) -> pd.DataFrame:
    """Device time of every kernel inside one whole call, replayed from a CUDA graph under torch.profiler (CUPTI
    traces the graph's kernels), per bench shape and backend: what each stage costs where it runs cold, next to
    the graph time of the same replays (the rest is gaps between kernels)."""
    from torch.profiler import ProfilerActivity, profile
    rows = []
    reps = 20
    for B, T in SHAPES:
        sets = _sets(B, T)
        tokens = _tokens(B, T)
        for be in backends:
            try:
                graphs = _capture([lambda kw=_kwargs(st, be): gdnlab.chunk_gated_delta_rule(**kw, backend=be)
                                   for st in sets])
                for gr in graphs:
                    gr.replay()
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    start.record()
                    for i in range(reps):
                        graphs[i % len(graphs)].replay()
                    end.record()
                    torch.cuda.synchronize()
                span = start.elapsed_time(end) / reps
                for ev in prof.key_averages():
                    t = getattr(ev, "self_device_time_total", None)
                    t = getattr(ev, "self_cuda_time_total", 0) if t is None else t
                    if t:
                        rows.append(dict(backend=be, B=B, T=T if T else tokens, tokens=tokens, kernel=ev.key[:120],
                                         calls_per_call=ev.count / reps, us_per_call=t / reps,
                                         call_ms_profiled=span))
            except Exception as e:  # noqa: BLE001
                rows.append(dict(backend=be, B=B, T=T, tokens=tokens, error=repr(e)[:300]))
            log("in situ", be, B, T, sum(r.get("us_per_call", 0) for r in rows if r["backend"] == be
                                         and r["B"] == B and r["tokens"] == tokens))
        del sets
        torch.cuda.empty_cache()
    df = pd.DataFrame(rows)
    return _stamp(df, env)


def host_walls(call, n: int, windows: int = 5, warmup: int = 20) -> list[float]:
    """Host us per call in each of `windows` windows: the wall time of `n` back-to-back calls, synchronised at the
    end of the window, over n (after `warmup` calls)."""
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    walls = []
    for _ in range(windows):
        t0 = time.perf_counter()
        for _ in range(n):
            call()
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t0) / n * 1e6)
    return walls


def host(env: dict, out_dir: str, backends, tokens=(512, 2048), n: int = 300) -> pd.DataFrame:
    """Host time per eager call: the wall time of `n` back-to-back calls on one input, synchronised once at the
    end (at these sizes the host, not the GPU, sets the pace), per backend and size; fast's call at the smallest
    size is profiled with cProfile into host_profile.txt (where the host time goes)."""
    import cProfile
    import io
    import pstats
    rows = []
    kws = {T: _kwargs(_inputs(1, T, 0), "fast") for T in tokens}
    for T, kw in kws.items():
        for be in backends:
            walls = host_walls(lambda: gdnlab.chunk_gated_delta_rule(**kw, backend=be), n)
            rows.append(dict(backend=be, B=1, T=T, tokens=T, us_per_call=float(np.median(walls)),
                             us_min=float(min(walls)), us_max=float(max(walls)), calls=n))
            log("host", be, T, round(rows[-1]["us_per_call"], 1))
    kw = kws[tokens[0]]
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        gdnlab.chunk_gated_delta_rule(**kw, backend="fast")
    torch.cuda.synchronize()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(30)
    with open(os.path.join(out_dir, "host_profile.txt"), "w") as f:
        f.write(f"fast, B=1 T={tokens[0]}, {n} eager calls, cProfile sorted by tottime\n{json.dumps(env)}\n")
        f.write(buf.getvalue())
    return _stamp(pd.DataFrame(rows), env)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--parts", default="env,prologue,conformance,mma,bench,breakdown")
    ap.add_argument("--backends", default="", help="comma list for conformance and bench (default: all but reference)")
    ap.add_argument("--conformance-backends", default="", help="comma list for conformance (default: --backends)")
    ap.add_argument("--variants", default="small", choices=sorted(STUDIES), help="study of the variants part")
    ap.add_argument("--register", default="", choices=["", *sorted(STUDIES)],
                    help="register this study's candidates first, so that conformance and bench include them")
    ap.add_argument("--fla-tokens", default="2048,32768", help="sizes (one sequence) of the fla_tuning part")
    ap.add_argument("--probe", default="", help="probe CSV: path,BV,num_warps,status,... (breakdown times ok ones)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    parts = args.parts.split(",")
    env = env_info()
    log(json.dumps(env))
    with open(os.path.join(args.out, "env.json"), "w") as f:
        json.dump(env, f, indent=1)
    torch.manual_seed(0)
    ok = None
    if args.probe and os.path.exists(args.probe):
        with open(args.probe) as f:
            cells = [line.strip().split(",", 5) for line in f if line.count(",") >= 4]
        # Timed only where the config ran and matched the two-kernel path at BV=64 bit for bit.
        ok = {(c[0], int(c[1]), int(c[2])) for c in cells if c[3] == "ok" and c[4] == "True" and c[5].startswith("True")}
        ok |= {("two_kernel", 64, 4), ("fused", 64, 4)}  # the defaults: checked by the conformance part
    if args.register:
        _register_variants(STUDIES[args.register])
    chosen = args.backends.split(",") if args.backends else None

    def timed() -> list:
        """The backends registered when the part runs (a variants part before it adds its candidates)."""
        return chosen or [b for b in gdnlab.BACKENDS if b != "reference"]
    conf = args.conformance_backends.split(",") if args.conformance_backends else chosen
    jobs = dict(conformance=lambda: conformance(env, conf), mma=lambda: mma_hardware(env),
                prologue=lambda: prologue_variants(env),
                breakdown=lambda: breakdown(env, ok), stages=lambda: stages(env, args.out),
                fla_tuning=lambda: fla_tuning(env, tuple(int(t) for t in args.fla_tokens.split(","))),
                in_situ=lambda: in_situ(env))
    if "bench" in parts or "variants" in parts:
        bw = copy_bandwidth()
        log("copy bandwidth GB/s", bw / 1e9)
        shapes = dict(small=[(1, 512), (1, 1024), (1, 2048), (1, 8192)]).get(args.variants)
        jobs["variants"] = lambda: variants(env, bw, args.variants, shapes)
        jobs["bench"] = lambda: bench(env, bw, timed())
    jobs["host"] = lambda: host(env, args.out, timed())
    status = 0
    for part in parts:
        if part not in jobs:
            continue
        t0 = time.time()
        try:
            df = jobs[part]()
            name = {"mma": "mma_model_vs_hardware", "prologue": "prologue_variants",
                    "variants": f"variants_{args.variants}"}.get(part, part)
            df.to_csv(os.path.join(args.out, f"{name}.csv"), index=False)
            log(part, f"done in {time.time() - t0:.0f}s")
            print(df.to_string(max_rows=60, max_colwidth=40), flush=True)
        except Exception:  # noqa: BLE001
            status = 1
            log(part, "FAILED")
            traceback.print_exc()
    return status


if __name__ == "__main__":
    sys.exit(main())
