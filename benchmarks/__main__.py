"""`python -m benchmarks --out DIR --parts a,b`: one device call that runs the named experiments (benchmarks.registry)
and writes env.json and one CSV per part under DIR."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

from benchmarks.registry import DEFAULT_PARTS, EXPERIMENTS, get


def parser() -> argparse.ArgumentParser:
    from benchmarks.variants import STUDIES
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=(
        "Check, compare and time every backend on a CUDA GPU. Results go only to --out; commit them as a run under "
        "data/<device>/<run_id>/ with the env.json this writes."))
    ap.add_argument("--out", required=True, help="folder for env.json and the parts' CSVs (outside the repository)")
    ap.add_argument("--parts", default=None,
                    help=f"comma list of {', '.join(EXPERIMENTS)} (default: {','.join(DEFAULT_PARTS)})")
    ap.add_argument("--backends", default="", help="comma list for conformance and bench (default: all but reference)")
    ap.add_argument("--conformance-backends", default="", help="comma list for conformance (default: --backends)")
    ap.add_argument("--study", "--variants", dest="study", default="small", choices=sorted(STUDIES),
                    help="study of the variants part")
    ap.add_argument("--register", default="", choices=["", *sorted(STUDIES)],
                    help="register this study's candidates first, so that conformance and bench include them")
    ap.add_argument("--fla-tokens", default="2048,32768", help="sizes (one sequence) of the fla_tuning part")
    ap.add_argument("--probe", default="", help="probe CSV of benchmarks.probe_configs (breakdown times ok ones)")
    ap.add_argument("--shapes", default="", help="comma list of bench shapes for bench and in_situ, as labelled "
                                                 "(1x512, 8x2048, varlen; default: all)")
    ap.add_argument("--reps", type=int, default=1000, help="paired eager samples of the auto_overhead part")
    ap.add_argument("--rule", type=int, default=None, metavar="ITEM",
                    help="measure the candidate rule of speed-notes item ITEM (gdnlab.rules): its parts, shapes and "
                         "backends, which --parts, --shapes, --backends and --conformance-backends may not also name")
    return ap


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with what --rule sets filled in and --parts defaulted."""
    args = parser().parse_args(argv)
    if args.rule is not None:
        from gdnlab import rules
        named = [f"--{k.replace('_', '-')}" for k in ("parts", "shapes", "backends", "conformance_backends")
                 if getattr(args, k)]
        if named:
            parser().error(f"--rule {args.rule} sets {', '.join(named)} itself")
        try:
            vars(args).update(rules.get(args.rule).benchmarks_settings())
        except KeyError as e:
            parser().error(str(e.args[0]))
    args.parts = args.parts or ",".join(DEFAULT_PARTS)
    return args


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    from benchmarks.inputs import select_shapes
    try:
        shapes = select_shapes(args.shapes)
    except ValueError as e:
        parser().error(str(e))
    parts = [p for p in args.parts.split(",") if p and p != "env"]  # env.json is always written
    experiments = [get(p) for p in parts]
    import torch

    from benchmarks.context import Context
    from benchmarks.env import env_info, log
    from benchmarks.probe_configs import read_ok
    from benchmarks.variants import STUDIES, register_study
    os.makedirs(args.out, exist_ok=True)
    env = env_info()
    log(json.dumps(env))
    with open(os.path.join(args.out, "env.json"), "w") as f:
        json.dump(env, f, indent=1)
    torch.manual_seed(0)
    if args.register:
        register_study(STUDIES[args.register])
    chosen = args.backends.split(",") if args.backends else None
    ctx = Context(env=env, out=args.out, backends=chosen,
                  conformance_backends=args.conformance_backends.split(",") if args.conformance_backends else None,
                  study=args.study, fla_tokens=tuple(int(t) for t in args.fla_tokens.split(",")),
                  probe_ok=read_ok(args.probe) if args.probe and os.path.exists(args.probe) else None,
                  reps=args.reps, shapes=shapes)
    status = 0
    for exp in experiments:
        t0 = time.time()
        try:
            df = exp.load().run(ctx)
            df.to_csv(os.path.join(args.out, exp.output(ctx)), index=False)
            log(exp.name, f"done in {time.time() - t0:.0f}s")
            print(df.to_string(max_rows=60, max_colwidth=40), flush=True)
        except Exception:  # noqa: BLE001
            status = 1
            log(exp.name, "FAILED")
            traceback.print_exc()
    return status


if __name__ == "__main__":
    sys.exit(main())
