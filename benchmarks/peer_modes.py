"""`python -m benchmarks.peer_modes --out DIR`: whether a backend computes the same numbers, as fast, whatever its
process ran before and however its inputs are marked.

Written for FlashQLA's two modes (docs/peers.md, speed notes item 68): with the same versions and seeded inputs it
ran one of two computations per machine start. Each scenario runs in its own Python process on the same seeded
inputs (seed 0 at every shape) and with a TileLang kernel cache of its own (TILELANG_CACHE_DIR, empty at its start:
the one state known to outlive a process): first what the scenario runs before (nothing, calls at a conformance
case's size, one call of 65536 tokens at the sweep's heads, in the same process or in one before it that shares its
cache, or the conformance part's cases, the backend's own calls of them in a field start's order), then the backend
at each shape, with the scenario's options or with q, k and v requiring grad. modes.csv holds, per scenario and
shape, the graph-replayed and eager median ms and a sha256 of the output's bytes (equal hashes are the same
computation) and the scenario's TileLang kernels (`kernel_sources`: whether code generation differed); it is
rewritten after each scenario. env.json is written as every benchmarks run writes it. Each scenario compiles
FlashQLA's kernels afresh: 110-150 s a scenario for two shapes on an H100, and after-conformance's 28 cases up to 4
minutes more, so the seven take longer than one device call; pass --scenarios to split them.

    python -m benchmarks.peer_modes --out /tmp/modes --backend flashqla --shapes 1x32768,8x2048
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

#: What each scenario runs first (backend calls at (B, T, heads)), and how it then calls the backend.
SCENARIOS: dict[str, dict[str, Any]] = {
    "alone": {},
    "after-small": {"before": [(2, 100, dict(H=4, HV=8, K=128, V=128))]},
    "after-long": {"before": [(1, 65536, dict(H=4, HV=8, K=128, V=128))]},
    "after-long-process": {"primer": [(1, 65536, dict(H=4, HV=8, K=128, V=128))]},
    "after-conformance": {"conformance": True},
    "grad": {"grad": True},
    "no-auto-cp": {"options": {"auto_cp": False}},
}
#: The scenarios that pass backend options only FlashQLA takes.
FLASHQLA_ONLY = ("no-auto-cp",)


def parse_shape(label: str) -> tuple[int, int]:
    """"BxT" as two positive integers; anything else is refused naming the label."""
    b, sep, t = label.partition("x")
    if not sep or not b.isdigit() or not t.isdigit() or int(b) < 1 or int(t) < 1:
        raise ValueError(f"shapes: expected BxT with positive integers (1x32768), got {label!r}")
    return int(b), int(t)


def output_hash(o: Any) -> str:
    """sha256 of a tensor's bytes as stored (bf16 compared bit for bit)."""
    import torch
    return hashlib.sha256(o.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()


def kernel_sources(cache: str) -> tuple[int, str]:
    """How many TileLang kernels a cache folder holds and one sha256 over their generated CUDA sources
    (device_kernel.cu, hashed each and sorted by hash, so the folders' names do not count): equal digests in two
    machine starts mean TileLang generated the same kernels, so a difference in output lies after code generation."""
    digests = sorted(hashlib.sha256(p.read_bytes()).hexdigest() for p in Path(cache).rglob("device_kernel.cu"))
    return len(digests), (hashlib.sha256("".join(digests).encode()).hexdigest() if digests else "")


def run_scenario(scenario: str, backend: str, shapes: list[tuple[int, int]], heads: dict[str, int],
                 device: str, prime: bool = False) -> list[dict[str, Any]]:
    """In this process: the scenario's calls first, then `backend` at each shape on seed-0 inputs. One row per
    shape: the calls that ran before it (`before`; `refused`: those the backend refused), ms (eager median, CUDA
    only), graph_ms (CUDA only; nan where capture fails), the output's hash. With `prime`, only the scenario's
    primer calls (the process before the one that times)."""
    import torch

    import gdnlab
    from gdnlab.inputs import make_inputs

    spec = SCENARIOS[scenario]
    options = dict(spec.get("options", {}))

    def call(inp: Any) -> Any:
        kw = inp.kwargs()
        if spec.get("grad"):
            kw.update({n: kw[n].detach().requires_grad_(True) for n in ("q", "k", "v")})
        out = gdnlab.chunk_gated_delta_rule(**kw, backend=backend, **options)
        return out[0] if isinstance(out, tuple) else out

    before = refused = 0  # calls made before the timed ones in this process, and those the backend refused
    for B, T, h in spec.get("primer" if prime else "before", []):
        call(make_inputs(B=B, T=T, seed=1, device=device, **h))
        before += 1
    if spec.get("conformance") and not prime:  # the conformance part's cases in its order, this backend's calls only
        from benchmarks.conformance import case_kwargs, cases
        for case, svf in cases():
            try:
                gdnlab.chunk_gated_delta_rule(**case_kwargs(case, svf, device), backend=backend)
                before += 1
            except Exception:  # noqa: BLE001 (the conformance part records a refusal as a failed case and goes on)
                refused += 1
        if device == "cuda":
            torch.cuda.synchronize()  # a fault in those calls surfaces here, not in the timed ones
    if prime:
        return []
    rows = []
    for B, T in shapes:
        inp = make_inputs(B=B, T=T, seed=0, device=device, **heads)
        row: dict[str, Any] = dict(scenario=scenario, backend=backend, B=B, T=T, before=before, refused=refused,
                                   ms=float("nan"), graph_ms=float("nan"), error="")
        try:
            row["sha256"] = output_hash(call(inp))
            if device == "cuda":
                import triton

                from benchmarks.timing import capture
                row["ms"] = triton.testing.do_bench(lambda: call(inp), warmup=10, rep=50, return_mode="median")
                try:
                    row["graph_ms"] = triton.testing.do_bench(capture([lambda: call(inp)])[0].replay, warmup=10,
                                                              rep=50, return_mode="median")
                except Exception as e:  # noqa: BLE001 (a backend that cannot be captured keeps its eager time)
                    row["error"] = f"capture: {e!r}"[:200]
        except Exception as e:  # noqa: BLE001
            row["error"] = repr(e)[:300]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.peer_modes", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for env.json and modes.csv")
    ap.add_argument("--backend", default="flashqla")
    ap.add_argument("--shapes", default="1x32768,8x2048", help="comma list of BxT")
    ap.add_argument("--scenarios", default="", help=f"comma list of {', '.join(SCENARIOS)} (default: all that "
                                                     "the backend takes)")
    ap.add_argument("--heads", default="16,32,128,128", help="H,HV,K,V (default: the Qwen3-Next layer's)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    ap.add_argument("--prime", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    try:
        shapes = [parse_shape(s) for s in a.shapes.split(",") if s]
        heads = dict(zip(("H", "HV", "K", "V"), (int(x) for x in a.heads.split(","))))
    except ValueError as e:
        ap.error(str(e))
    if len(heads) != 4:
        ap.error(f"heads: expected H,HV,K,V, got {a.heads!r}")
    if a.child:
        rows = run_scenario(a.child, a.backend, shapes, heads, a.device, a.prime)
        with open(os.path.join(a.out, f"{a.child}.json"), "w") as f:
            json.dump(rows, f)
        return 0
    scenarios = [s for s in a.scenarios.split(",") if s] or [
        s for s in SCENARIOS if a.backend == "flashqla" or s not in FLASHQLA_ONLY]
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown:
        ap.error(f"scenarios: unknown {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    os.makedirs(a.out, exist_ok=True)
    if a.device == "cuda":
        from benchmarks.env import env_info
        with open(os.path.join(a.out, "env.json"), "w") as f:
            json.dump(env_info(), f, indent=1)
    import pandas as pd
    rows: list[dict[str, Any]] = []
    for s in scenarios:
        cache = os.path.join(os.path.abspath(a.out), f"tilelang-cache-{s}")
        shutil.rmtree(cache, ignore_errors=True)
        env = {**os.environ, "TILELANG_CACHE_DIR": cache}
        child = [sys.executable, "-m", "benchmarks.peer_modes", "--child", s, "--out", a.out, "--backend",
                 a.backend, "--shapes", a.shapes, "--heads", a.heads, "--device", a.device]
        if "primer" in SCENARIOS[s]:
            subprocess.run([*child, "--prime"], env=env)
        r = subprocess.run(child, env=env)
        kernels, sources = kernel_sources(cache)
        shutil.rmtree(cache, ignore_errors=True)
        got = os.path.join(a.out, f"{s}.json")
        if r.returncode == 0 and os.path.exists(got):
            with open(got) as f:
                rows += [dict(row, kernels=kernels, kernel_sources=sources) for row in json.load(f)]
            os.remove(got)
        else:
            rows.append(dict(scenario=s, backend=a.backend, error=f"process exited {r.returncode}"))
        df = pd.DataFrame(rows)  # written after every scenario: a call cut off at its time limit keeps what ran
        df.to_csv(os.path.join(a.out, "modes.csv"), index=False)
    print(df.to_string(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
