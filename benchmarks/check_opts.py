"""Run "fast" with some options once per size on CUDA, in a process of its own, and say whether the output equals
fast's bit for bit (h200.py's own poisoned comparison, on its inputs): a quick guard before a benchmark whose
process one faulting kernel would end.

    python3 benchmarks/check_opts.py "dict(prefetch=True, num_stages=1)" [T ...]
"""
import sys

import h200


def main() -> int:
    opts = eval(sys.argv[1], {"__builtins__": {}, "dict": dict, "True": True, "False": False})  # noqa: S307
    h200._register_variants({"fast+opts": ("fast", opts)})
    ok = True
    for T in [int(t) for t in sys.argv[2:]] or [512, 1024, 4096, 8192]:
        check = h200._against_fast(h200._kwargs(h200._inputs(1, T, T), "fast"), ["fast+opts"])["fast+opts"]
        print(opts, T, check)
        ok &= bool(check.get("bit_equal_fast"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
