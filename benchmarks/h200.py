"""The former entry point, kept so that `python3 benchmarks/h200.py --out DIR --parts ...` still works: it runs
`python -m benchmarks` with the same arguments (see benchmarks/__main__.py)."""
import os
import sys

if __name__ == "__main__":
    sys.path[0] = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    from benchmarks.__main__ import main
    sys.exit(main())
