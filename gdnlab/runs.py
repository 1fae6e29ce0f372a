"""The registry of device runs: ``data/<device>/RUNS.csv`` and one folder per run.

Every device call (one machine start, or one call of a benchmark script on it) writes its files into its own folder
``data/<device>/<run_id>/`` with that call's ``env.json``; ``RUNS.csv`` lists each run once with the facts a reader
needs to compare runs (time, the commit that added its files, device, driver, torch, Triton, peer versions, how its
timings were sampled, what it was for). Code and notebooks choose a run by querying this table, not by file names,
so that adding a run never changes what an older file name means (docs/runs.md describes the registry).

``purpose`` starts with a kind and a colon (``"bench: ..."``, ``"variants: ..."``, ``"conformance: ..."``): the
kind is what :func:`latest` and :func:`select` filter on; the rest says what the run measured and which note cites it.
"""
from __future__ import annotations

import datetime
import json
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

__all__ = ["COLUMNS", "TIMING_METHODS", "RunError", "data_dir", "runs", "kind", "select", "latest", "path", "load",
           "file_run", "continued", "load_chain"]

#: RUNS.csv's columns, in order.
COLUMNS = ("run_id", "utc_time", "commit", "device", "driver", "torch", "triton", "peers", "timing_method", "purpose")

#: How a run sampled its timings (the eager ones where it has both): one do_bench window per backend ("windows"),
#: three interleaved do_bench rounds ("rounds"), benchmarks/h200.py's eager_paired with no synchronisation between
#: samples ("paired") or with each sample started from an idle GPU ("synced"), graph replay only ("graph"), or no
#: timings ("none").
TIMING_METHODS = ("windows", "rounds", "paired", "synced", "graph", "none")


class RunError(LookupError):
    """A run or a file that the registry does not hold; the message names what was asked for."""


def data_dir(device: str = "h200") -> Path:
    """``data/<device>/`` of this checkout."""
    return Path(__file__).resolve().parents[1] / "data" / device


def runs(device: str = "h200") -> pd.DataFrame:
    """RUNS.csv of `device`, one row per run, in time order, ``utc_time`` parsed (UTC), empty fields as ""."""
    f = data_dir(device) / "RUNS.csv"
    if not f.exists():
        raise RunError(f"no run registry for device {device!r}: {f} does not exist")
    df = pd.read_csv(f, dtype=str, keep_default_na=False)
    if tuple(df.columns) != COLUMNS:
        raise RunError(f"{f}: columns {list(df.columns)}, expected {list(COLUMNS)}")
    df["utc_time"] = pd.to_datetime(df.utc_time, utc=True)
    return df.sort_values("utc_time", kind="stable").reset_index(drop=True)


def kind(purpose: str | pd.Series) -> str | pd.Series:
    """The kind of a purpose: the text before its first colon (``"bench: fifth run"`` -> ``"bench"``)."""
    if isinstance(purpose, pd.Series):
        return purpose.str.split(":", n=1).str[0].str.strip()
    return purpose.split(":", 1)[0].strip()


def select(device: str = "h200", purpose: str | tuple[str, ...] | None = None,
           timing_method: str | tuple[str, ...] | None = None, has: str | None = None,
           since: str | None = None, before: str | None = None) -> pd.DataFrame:
    """The runs of `device` whose purpose kind is (one of) `purpose`, whose timing method is (one of)
    `timing_method`, that hold a file matching `has` (a name or a glob such as ``"variants_*.csv"``), and whose
    time is at or after run `since` and before run `before` (run ids), in time order."""
    df = runs(device)
    if purpose is not None:
        df = df[kind(df.purpose).isin([purpose] if isinstance(purpose, str) else list(purpose))]
    if timing_method is not None:
        df = df[df.timing_method.isin([timing_method] if isinstance(timing_method, str) else list(timing_method))]
    if has is not None:
        df = df[[any((data_dir(device) / r).glob(has)) for r in df.run_id]]
    for bound, keep in ((since, lambda t, b: t >= b), (before, lambda t, b: t < b)):
        if bound is not None:
            df = df[keep(df.utc_time, _row(device, bound).utc_time)]
    return df.reset_index(drop=True)


def _row(device: str, run_id: str) -> pd.Series:
    df = runs(device)
    hit = df[df.run_id == run_id]
    if hit.empty:
        raise RunError(f"run {run_id!r} is not in {data_dir(device) / 'RUNS.csv'}")
    return hit.iloc[0]


def latest(device: str = "h200", purpose: str | tuple[str, ...] | None = None, has: str | None = None,
           timing_method: str | tuple[str, ...] | None = None) -> str:
    """The id of the most recent run (by utc_time) that :func:`select` finds with these filters."""
    df = select(device, purpose=purpose, timing_method=timing_method, has=has)
    if df.empty:
        raise RunError(f"no {device} run with purpose {purpose!r}, timing method {timing_method!r} and a file "
                       f"{has!r} in {data_dir(device) / 'RUNS.csv'}")
    return str(df.run_id.iloc[-1])


def continued(run_id: str, device: str = "h200") -> list[str]:
    """`run_id` and the runs it carries on (each env.json's ``continues``: an earlier call of the same machine start,
    such as a bench split over calls by their time limit), earliest first."""
    chain = [run_id]
    while (prev := json.loads(path(chain[0], "env.json", device).read_text()).get("continues")):
        if prev in chain:
            raise RunError(f"run {run_id!r}: its continues chain loops at {prev!r}")
        chain.insert(0, prev)
    return chain


def load_chain(run_id: str, filename: str | Sequence[str], device: str = "h200") -> pd.DataFrame:
    """`filename` of `run_id` and of each run it carries on (:func:`continued`) that holds it (one start's calls
    need not all write it: its conformance, bench and sweep may be separate calls), one table, its rows tagged
    with their run in column ``run_id``; several names: each run's first that it holds (a bench.csv, or the
    bench_log.csv of a bench the call's time limit cut). RunError when no run of the chain holds one."""
    names = (filename,) if isinstance(filename, str) else tuple(filename)
    chain = continued(run_id, device)
    held = [(r, f) for r in chain for f in [next((n for n in names if (data_dir(device) / r / n).exists()), None)]
            if f]
    if not held:
        raise RunError(f"no run of {chain} holds {' or '.join(map(repr, names))}")
    return pd.concat([load(r, f, device).assign(run_id=r) for r, f in held], ignore_index=True)


def path(run_id: str, filename: str, device: str = "h200") -> Path:
    """The path of `filename` in run `run_id`; RunError when the run is not registered or lacks the file."""
    _row(device, run_id)
    p = data_dir(device) / run_id / filename
    if not p.exists():
        held = sorted(q.name for q in p.parent.iterdir()) if p.parent.exists() else []
        raise RunError(f"run {run_id!r} has no {filename!r} (it holds {held})")
    return p


def load(run_id: str, filename: str, device: str = "h200") -> pd.DataFrame:
    """A run's CSV file as a DataFrame (see :func:`path`)."""
    return pd.read_csv(path(run_id, filename, device))


def file_run(device: str, kind_: str, purpose: str, files: list[str | Path], env: dict[str, str],
             timing_method: str = "none", peers: str = "", started: str | None = None,
             commit: str | None = None) -> str:
    """Commit-ready filing of one run: copy `files` into ``data/<device>/<UTC start>-<kind_>/`` with `env` (which
    must name device, torch and triton) as env.json and the date, and append its row to RUNS.csv (commit: this
    checkout's HEAD). Returns the run id. `purpose` is the text after the kind (the row reads "kind_: purpose").
    `started` is the run's UTC start as ISO 8601 (default: now), for runs filed after they ran; `commit` the commit
    whose tree ran (default: HEAD, for a run filed before anything else is committed). A run that carries on an
    earlier call of the same machine start names it as ``env["continues"]`` (see :func:`continued`)."""
    if timing_method not in TIMING_METHODS:
        raise ValueError(f"timing_method: must be one of {', '.join(TIMING_METHODS)}, got {timing_method!r}")
    missing = [k for k in ("device", "torch", "triton") if not env.get(k)]
    if missing:
        raise ValueError(f"env: must name {', '.join(missing)}")
    now = (datetime.datetime.fromisoformat(started.replace("Z", "+00:00")).astimezone(datetime.timezone.utc)
           if started else datetime.datetime.now(datetime.timezone.utc)).replace(microsecond=0)
    run_id = f"{now:%Y-%m-%dT%H%M}-{kind_}"
    folder = data_dir(device) / run_id
    if folder.exists():
        raise RunError(f"run {run_id!r} already exists in {data_dir(device)}")
    folder.mkdir(parents=True)
    for f in files:
        shutil.copy2(f, folder / Path(f).name)
    env = {**env, "date": env.get("date", now.isoformat())}
    (folder / "env.json").write_text(json.dumps(env, indent=1) + "\n")
    head = commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                    cwd=data_dir(device).parent).stdout.strip() or "?"
    row = dict(run_id=run_id, utc_time=now.strftime("%Y-%m-%dT%H:%M:%SZ"), commit=head, device=env["device"],
               driver=env.get("driver", ""), torch=env["torch"], triton=env["triton"], peers=peers,
               timing_method=timing_method, purpose=f"{kind_}: {purpose}")
    registry = data_dir(device) / "RUNS.csv"
    pd.DataFrame([row], columns=list(COLUMNS)).to_csv(registry, mode="a", index=False, header=not registry.exists())
    return run_id
