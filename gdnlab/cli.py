"""The `gdnlab` command: `gdnlab reproduce ...`, `gdnlab check ...` and `gdnlab compile-matrix ...`."""
from __future__ import annotations

import argparse
import sys


def _positive(text: str) -> int:
    """argparse type: an integer of at least 1."""
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def _reproduce(argv: list[str]) -> int:
    from gdnlab.reproduce import reproduce

    ap = argparse.ArgumentParser(
        prog="gdnlab reproduce",
        description="Run every notebook with papermill and write HTML reports, figures, CSV tables and index.html.",
        epilog="Bring your own kernel: write a module that calls gdnlab.backends.register_backend('my_kernel', fn) "
               "(fn takes chunk_gated_delta_rule's arguments), judge it with `gdnlab check --plugin my_module "
               "--backend my_kernel`, and run `gdnlab reproduce --plugin my_module --backend my_kernel`. "
               "Ctrl-C stops a run within seconds and keeps the previous reports of unfinished notebooks (exit 130).")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cpu: Triton interpreter (default); cuda: compiled kernels on the first GPU")
    ap.add_argument("--backend", metavar="NAME", default=None,
                    help="a registered backend to run as the candidate fused kernel (default: fused_shipped)")
    ap.add_argument("--plugin", metavar="MODULE", action="append", default=[],
                    help="import MODULE first (it registers backends); repeatable; the current directory is on "
                         "the import path")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run of every notebook (CI)")
    ap.add_argument("--out", default=None,
                    help="output folder (default: reports/ on cpu, reports/<gpu-name>/ on cuda; with a --backend "
                         "of your own, its subfolder <backend>/ there, so the lab's reports are never overwritten)")
    ap.add_argument("--only", metavar="NAME", action="append", default=[],
                    help="run only notebooks whose name contains NAME (repeatable), e.g. 01 or bv_sweep")
    ap.add_argument("--jobs", type=_positive, default=None,
                    help="notebooks run at once (default: 2 on cpu, 1 on cuda)")
    ap.add_argument("--kernel", default=None, help="Jupyter kernel name (default: 'gdnlab', registered if missing)")
    ap.add_argument("--timeout", type=_positive, default=None, help="seconds per cell before a notebook fails")
    # Ctrl-C / SIGTERM: pending notebooks are cancelled, running ones stopped, finished ones kept; exit status 130.
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    a = ap.parse_args(argv)
    return reproduce(device=a.device, backend=a.backend, plugins=a.plugin, quick=a.quick, out=a.out, only=a.only,
                     jobs=a.jobs, kernel=a.kernel, timeout=a.timeout, progress=not a.no_progress)


def _check(argv: list[str]) -> int:
    """`gdnlab check`: print a backend's conformance verdict (gdnlab.verdict); exit 1 when it fails."""
    ap = argparse.ArgumentParser(
        prog="gdnlab check",
        description="Judge a backend: budgets, final state, initial state, error growth with chunk count against "
                    "the two-kernel path, padding rows, written outputs, inputs left unchanged, the output's dtype "
                    "and the call's other arguments (scale, use_qk_l2norm_in_kernel, state_v_first, "
                    "output_final_state; gdnlab/verdict.py). Exits 0 on PASS, 1 on FAIL, 2 on a usage error or "
                    "when the plugin or the CSV path fails.")
    ap.add_argument("--backend", metavar="NAME", required=True, help="a registered backend, e.g. fused_fixed")
    ap.add_argument("--plugin", metavar="MODULE", action="append", default=[],
                    help="import MODULE first (it registers backends); repeatable; the current directory is on "
                         "the import path")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--full", action="store_true",
                    help="the full case set at the CuteDSL shape (minutes on CPU) instead of the quick one (seconds)")
    ap.add_argument("--csv", metavar="PATH", default=None, help="also write the verdict table to PATH")
    a = ap.parse_args(argv)

    import os

    import pandas as pd

    from gdnlab import backends
    from gdnlab.experiments import load_plugins
    from gdnlab.verdict import verdict

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        load_plugins(a.plugin)
    except ImportError as e:
        print(f"gdnlab check: --plugin: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - a plugin that fails to load is a usage error, not a FAIL
        print(f"gdnlab check: --plugin: importing it raised {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    if a.backend in backends.UNAVAILABLE:
        print(f"gdnlab check: --backend {a.backend!r} cannot run here: {backends.UNAVAILABLE[a.backend]}",
              file=sys.stderr)
        return 2
    if a.backend not in backends.BACKENDS:
        print(f"gdnlab check: --backend {a.backend!r} is not registered (known: {', '.join(backends.BACKENDS)}); "
              f"name the module that registers it with --plugin", file=sys.stderr)
        return 2
    if a.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            print("gdnlab check: --device cuda but no CUDA device is available", file=sys.stderr)
            return 2
    v = verdict(a.backend, quick=not a.full, device=a.device)
    t = v.table()
    with pd.option_context("display.width", 200, "display.max_colwidth", 90, "display.max_rows", 500):
        print(t.drop(columns=["backend", "reason"]).to_string(index=False, formatters={
            "value": "{:.3g}".format, "limit": "{:.3g}".format}))
    for c in v.failures:
        print(f"FAIL {c.check} [{c.case}]: {c.reason}")
    print(f"\n{a.backend}: {'PASS' if v.ok else 'FAIL'} ({len(v.checks) - len(v.failures)} of {len(v.checks)} checks "
          f"passed) [{v.seconds} s, {'quick' if v.quick else 'full'} set, {a.device}]")
    if a.csv:
        try:
            t.to_csv(a.csv, index=False)
        except OSError as e:
            print(f"gdnlab check: --csv: cannot write {a.csv}: {e.strerror or e}", file=sys.stderr)
            return 2
    return 0 if v.ok else 1


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `gdnlab` console script."""
    argv = sys.argv[1:] if argv is None else list(argv)
    commands = {"reproduce": "run the notebooks and write reports/",
                "check": "judge a backend (your kernel): PASS/FAIL with reasons, in seconds on CPU",
                "compile-matrix": "compile every kernel for Hopper, MI300X and RDNA3.5 without the hardware"}
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in commands:
        asked = not argv or argv[0] in ("-h", "--help")
        print("usage: gdnlab {reproduce,check,compile-matrix} [options]\n\n" +
              "\n".join(f"  {c:<16}{h}" for c, h in commands.items()) +
              "\n\n`gdnlab COMMAND --help` for the options of each.", file=sys.stdout if asked else sys.stderr)
        return 0 if asked else 2
    if argv[0] == "reproduce":
        return _reproduce(argv[1:])
    if argv[0] == "check":
        return _check(argv[1:])
    from gdnlab import compile_matrix  # another tool, imported only when asked for
    return int(compile_matrix.main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
