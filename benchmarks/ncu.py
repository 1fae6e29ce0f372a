"""Hardware counters of each kernel of one call, read by Nsight Compute (ncu): throughput against the card's peaks,
achieved occupancy, registers and shared memory per program, and where warps stall. What the in-situ profile and
gdnlab.traffic cannot say: why a kernel that moves its bytes at a quarter of copy speed (fast's prologue, speed
notes item 46) takes the time it does.

ncu profiles a process it starts, so this part runs itself as that process (``python -m benchmarks.ncu --target
BACKEND B T``): a call warmed twice, then one call between cudaProfilerStart and cudaProfilerStop, each of its
kernels replayed by ncu once per counter pass. The clocks are left as they are (--clock-control none: the device
notes ask not to touch them), so the durations are comparable with the in-situ ones only roughly; the ratios and
counts are the point.
"""
from __future__ import annotations

import glob
import io
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from benchmarks.context import Context
from benchmarks.env import log, stamp
from benchmarks.inputs import bench_inputs, call_kwargs, parse_label, tokens_of

OUTPUT = "ncu.csv"
#: The shapes profiled: one long sequence (fast's state kernel with one program per multiprocessor) and a batch.
SHAPES = [(1, 32768), (8, 2048)]
#: ncu's sections (by identifier): peaks, occupancy, launch resources, warp stalls, memory and issue activity.
SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats", "MemoryWorkloadAnalysis",
            "ComputeWorkloadAnalysis", "SchedulerStats")
TIMEOUT_S = 300
#: The seed of the profiled call's inputs (benchmarks.inputs.bench_inputs), written on every row as `seed`.
SEED = 0
#: Warp stall reasons, each as warps stalled for it per issued instruction: the details page shows WarpStateStats's
#: totals but not its per-reason chart, so these are asked for by name (a run whose ncu lacks one falls back to the
#: sections alone).
STALLS = ("long_scoreboard", "short_scoreboard", "mio_throttle", "math_pipe_throttle", "wait", "barrier",
          "not_selected", "selected", "dispatch_stall", "lg_throttle", "no_instruction", "branch_resolving",
          "membar", "drain", "sleeping", "tex_throttle", "imc_miss", "misc", "gmma")  # gmma: Hopper's wgmma
STALL_METRICS = tuple(f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio" for r in STALLS)


def ncu_path() -> str | None:
    """The ncu executable: on PATH, else the newest under /opt/nvidia/nsight-compute/; None when there is none."""
    return shutil.which("ncu") or next(iter(sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu"), reverse=True)),
                                       None)


def command(ncu: str, backend: str, B: Any, T: Any, *, stalls: bool = True) -> list[str]:
    """The ncu command line that profiles one `backend` call at shape (B, T) in a child process (with the stall
    metrics by name unless `stalls` is False)."""
    sections = [a for s in SECTIONS for a in ("--section", s)]
    metrics = ["--metrics", ",".join(STALL_METRICS)] if stalls else []
    return [ncu, "--clock-control", "none", "--profile-from-start", "off", "--csv", *sections, *metrics,
            sys.executable, "-m", "benchmarks.ncu", "--target", backend, str(B), str(T)]


def metric_errors(text: str) -> list[str]:
    """ncu's error lines about metrics (an unknown name on this card or ncu), which make the part retry without
    the stall metrics."""
    return [ln for ln in text.splitlines() if ln.startswith("==ERROR==") and "metric" in ln.lower()]


def parse(text: str) -> pd.DataFrame:
    """ncu's --csv details page (one row per kernel, section and metric, after any lines ncu prints first) as
    kernel, section, metric, unit, value (float where the text is a number, thousands separators dropped) and the
    text as printed."""
    lines = text.splitlines()
    head = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"') and '"Metric Name"' in ln), None)
    if head is None:
        raise ValueError("ncu output: no CSV header with \"ID\" and \"Metric Name\" (was anything profiled?)")
    rows = [lines[head]] + [ln for ln in lines[head + 1:] if ln.startswith('"')]  # ncu's own lines dropped
    raw = pd.read_csv(io.StringIO("\n".join(rows)), dtype=str, keep_default_na=False)
    out = pd.DataFrame(dict(launch=raw["ID"].astype(int), kernel=raw["Kernel Name"].str.split("(").str[0],
                            section=raw["Section Name"], metric=raw["Metric Name"], unit=raw["Metric Unit"],
                            text=raw["Metric Value"]))
    out["value"] = pd.to_numeric(out.text.str.replace(",", "", regex=False), errors="coerce")
    return out


def run(ctx: Context, backends: tuple[str, ...] = ("fast",)) -> pd.DataFrame:
    """The counters of every kernel of one call of each of `backends` (the run's --backends when given) at SHAPES;
    one row per (shape, backend) with `error` where ncu is missing or fails."""
    backends = tuple(ctx.backends) if ctx.backends else backends
    ncu = ncu_path()
    frames = []
    for B, T in SHAPES:
        for be in backends:
            base = dict(backend=be, B=B, T=T, tokens=tokens_of(B, T), seed=SEED)
            try:
                if ncu is None:
                    raise RuntimeError("ncu not found on PATH or under /opt/nvidia/nsight-compute/")
                done = subprocess.run(command(ncu, be, B, T), capture_output=True, text=True, timeout=TIMEOUT_S)
                refused = metric_errors(done.stdout + done.stderr)
                if refused:
                    log("ncu", be, B, T, "stall metrics refused, sections alone:", refused[0][:200])
                    done = subprocess.run(command(ncu, be, B, T, stalls=False), capture_output=True, text=True,
                                          timeout=TIMEOUT_S)
                if done.returncode != 0:
                    raise RuntimeError(f"ncu exited {done.returncode}: {(done.stderr or done.stdout)[-600:]}")
                try:
                    frames.append(parse(done.stdout).assign(**base))
                except ValueError:  # keep what ncu printed, to read by hand
                    name = re.sub(r"[^A-Za-z0-9._-]", "_", f"ncu_{be}_{B}x{T}.txt")
                    Path(ctx.out, name).write_text(done.stdout[-2_000_000:] + done.stderr[-20_000:])
                    raise
                log("ncu", be, B, T, frames[-1].kernel.nunique(), "kernels")
            except Exception as e:  # noqa: BLE001
                frames.append(pd.DataFrame([dict(base, error=repr(e)[:600])]))
                log("ncu", be, B, T, "failed:", repr(e)[:200])
    return stamp(pd.concat(frames, ignore_index=True), ctx.env)


def target(backend: str, B: Any, T: Any) -> None:
    """The profiled process: two warm calls (compiling, planning), then one call inside the profiler range."""
    import torch

    import gdnlab
    name, opts = parse_label(backend)
    inp = bench_inputs(B, T, SEED)
    kw = call_kwargs(inp, backend)
    for _ in range(2):
        gdnlab.chunk_gated_delta_rule(**kw, backend=name, **opts)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    gdnlab.chunk_gated_delta_rule(**kw, backend=name, **opts)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def _shape_arg(x: str) -> Any:
    return int(x) if x.isdigit() else x


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] != "--target":
        sys.exit("usage: python -m benchmarks.ncu --target BACKEND B T  (run by the ncu part, under ncu)")
    target(sys.argv[2], _shape_arg(sys.argv[3]), _shape_arg(sys.argv[4]))
