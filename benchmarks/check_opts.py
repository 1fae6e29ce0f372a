"""Run "fast" with some options once per size on CUDA, in a process of its own, and say whether the output equals
fast's bit for bit (the bench part's own poisoned comparison, on its inputs) and its replays (plan, CUDA graph) equal
its own output: a quick guard before a benchmark whose process one faulting kernel would end.

    python -m benchmarks.check_opts "dict(prefetch=True, num_stages=1)" [T ...]
"""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from benchmarks.bench import against_fast
    from benchmarks.inputs import bench_inputs, call_kwargs
    from benchmarks.variants import register_study
    argv = sys.argv[1:] if argv is None else argv
    opts = eval(argv[0], {"__builtins__": {}, "dict": dict, "True": True, "False": False})  # noqa: S307
    register_study({"fast+opts": ("fast", opts)})
    ok = True
    for T in [int(t) for t in argv[1:]] or [512, 1024, 4096, 8192]:
        check = against_fast(call_kwargs(bench_inputs(1, T, T), "fast"), ["fast+opts"])["fast+opts"]
        print(opts, T, check)
        ok &= bool(check.get("bit_equal_fast")) and bool(check.get("replays_equal"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
