"""Validate gdnlab.mma's models against microsoft/MMA-Sim (PyPI ``mmasim``), bit for bit.

For every instruction that mmasim models and a gdnlab model claims (``gdnlab.mma.MMASIM_TARGETS``), draw random
instruction tiles of every kind in ``gdnlab.mma.TILE_KINDS`` (hard cases included), run them through mmasim and
through the model, and write ``mma_models_vs_mmasim.csv`` under --out (commit it as a run of data/cpu/). Two rows per instruction: single
instructions (the instruction's own K) and chains of instructions over K = 64 (each D feeding the next C, as a
compiled ``tl.dot`` walks K).

Columns: model (the gdnlab model that computed: for tf32/fp32 operands the unit's model for them, see
``MMAModel.for_inputs``), input_type, mmasim_arch, instruction, k_total, cases (tiles), elements (output values), bit_exact_fraction
(identical fp32 bit patterns, any NaN counted equal to any NaN), strict_bit_exact_fraction (NaN payloads must match
too), tile_exact_fraction (tiles whose every output matches), mmasim_version, date, target (the key in
``MMASIM_TARGETS`` or ``EXTRA_TARGETS``), notes (per-kind account of any difference; NaN payload differences).

Run: ``.venv/bin/python benchmarks/mma_vs_mmasim.py [--tiles 10000] [--chain-tiles 2500] [--out PATH]
[--only TARGET,...]`` (``--only`` reruns those targets and keeps the other rows of an existing table).
"""
from __future__ import annotations

import argparse
import csv
import datetime
import importlib.metadata
import sys
import time
from pathlib import Path

import numpy as np

from gdnlab import mma

CHAIN_K = 64

# Not a MODELS entry: the PairwiseFP32Add code path with k_block=2 (used, without flushing, by rdna3_hyp_dot2),
# validated against the CDNA2 bf16 MFMA without _1k, which mmasim models as flushed pairwise fp32 adds.
EXTRA_TARGETS = {
    "cdna2_pairwise2_path": dict(
        model=mma.PairwiseFP32Add("pairwise2_ftz", "code-path check", k_block=2, ftz=True, instr_k=8),
        family="MFMA", arch="CDNA2", instruction="f32_16x16x8bf16", shape=(16, 16, 8),
        note="code path of rdna3_hyp_dot2 (PairwiseFP32Add, k_block=2) with flushing on; "
             "rdna3_hyp_dot2 itself differs only in not flushing"),
}


def _mismatch_account(ref: np.ndarray, got: np.ndarray, labels: np.ndarray) -> str:
    """Per-kind fractions (NaN-equal) below 1, and a few differing values, for the notes column."""
    same = (ref.view(np.uint32) == got.view(np.uint32)) | (np.isnan(ref) & np.isnan(got))
    parts = []
    for kind in mma.TILE_KINDS:
        sel = labels == kind
        if sel.any() and not same[sel].all():
            parts.append(f"{kind}: {same[sel].mean():.6f}")
    if not parts:
        return ""
    idx = np.argwhere(~same)[:3]
    examples = "; ".join(f"tile {i[0]} ({labels[i[0]]}) mmasim {ref[tuple(i)]!r} model {got[tuple(i)]!r}"
                         for i in idx)
    return "differs in " + ", ".join(parts) + "; e.g. " + examples


def _nan_note(ref: np.ndarray, got: np.ndarray, labels: np.ndarray) -> str:
    """Count the NaN outputs whose payloads alone differ, by tile kind."""
    strict = ref.view(np.uint32) == got.view(np.uint32)
    payload = (~strict) & np.isnan(ref) & np.isnan(got)
    if not payload.any():
        return ""
    per_tile = payload.reshape(payload.shape[0], -1).sum(axis=1)
    kinds = ", ".join(f"{kind} {int(per_tile[labels == kind].sum())}" for kind in mma.TILE_KINDS
                      if per_tile[labels == kind].sum())
    ref_bits = sorted({hex(int(x)) for x in ref.view(np.uint32)[payload]})[:3]
    return (f"{int(payload.sum())} NaN outputs differ only in payload ({kinds}): mmasim {','.join(ref_bits)} "
            f"(host-CPU NaNs from torch / libm fma), model 0x7fffffff")


def run_target(key: str, spec: dict, tiles: int, k_total: int, seed: int) -> dict:
    """Validate one instruction (chained to ``k_total``) on ``tiles`` random tiles."""
    input_type = spec.get("input", "bf16")
    model = spec["model"] if isinstance(spec["model"], mma.MMAModel) else mma.get_model(spec["model"])
    model = model.for_inputs(input_type)
    m, n, k = spec["shape"]
    a, b, c = mma.random_tiles(tiles, m, k_total, n, seed=seed, input_type=input_type)
    labels = np.array(mma.tile_kinds(tiles), dtype=object)
    mma.MMASIM_TARGETS.setdefault(key, dict(spec, model=model.name))
    t0 = time.perf_counter()
    ref = mma.mmasim_dot(key, a, b, c)
    t1 = time.perf_counter()
    got = np.concatenate([model.dot(a[i:i + 1000], b[i:i + 1000], c[i:i + 1000], input_type=input_type)
                          for i in range(0, tiles, 1000)])
    t2 = time.perf_counter()
    # the batched call must agree with mmasim's own instruction object: check one tile of every kind
    for i in range(min(tiles, len(mma.TILE_KINDS))):
        direct = mma.mmasim_call(key, a[i], b[i], c[i])
        if mma.bit_exact_fraction(direct, ref[i], nan_equal=True) != 1.0:
            raise RuntimeError(f"{key}: batched mmasim differs from op(A, B, C) on tile {i}")
    strict = ref.view(np.uint32) == got.view(np.uint32)
    loose = strict | (np.isnan(ref) & np.isnan(got))
    notes = "; ".join(x for x in (spec.get("note", ""), _mismatch_account(ref, got, labels), _nan_note(ref, got, labels))
                      if x)
    row = dict(
        model=model.name,
        input_type=input_type,
        mmasim_arch=spec["arch"],
        instruction=f"{spec['family'].lower()} {spec['instruction']}"
                    + ("" if k_total == k else f" x{k_total // k} chained"),
        k_total=k_total,
        cases=tiles,
        elements=int(ref.size),
        bit_exact_fraction=f"{loose.mean():.6f}",
        strict_bit_exact_fraction=f"{strict.mean():.6f}",
        tile_exact_fraction=f"{loose.reshape(tiles, -1).all(axis=1).mean():.6f}",
        mmasim_version=importlib.metadata.version("mmasim"),
        date=datetime.date.today().isoformat(),
        target=key,
        notes=notes,
    )
    print(f"{key:22s} K={k_total:3d} tiles={tiles:6d} bit_exact={row['bit_exact_fraction']} "
          f"strict={row['strict_bit_exact_fraction']} (mmasim {t1 - t0:.1f}s, model {t2 - t1:.1f}s)"
          + (f"\n    {notes}" if notes else ""), flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiles", type=int, default=10_000, help="tiles per single-instruction row")
    ap.add_argument("--chain-tiles", type=int, default=2_500, help="tiles per chained (K=64) row")
    ap.add_argument("--seed", type=int, default=2025)
    ap.add_argument("--out", type=Path, required=True, help="the CSV to write (file it with gdnlab.runs.file_run)")
    ap.add_argument("--only", default="", help="comma-separated targets to rerun (other rows of --out are kept)")
    args = ap.parse_args(argv)
    targets = dict(mma.MMASIM_TARGETS)
    targets.update(EXTRA_TARGETS)
    only = [t for t in args.only.split(",") if t]
    unknown = set(only) - set(targets)
    if unknown:
        ap.error(f"unknown targets {sorted(unknown)}; known: {list(targets)}")
    kept = {}
    if only and args.out.exists():
        for r in csv.DictReader(open(args.out)):
            kept.setdefault(r.get("target", ""), []).append(r)
    rows = []
    for j, (key, spec) in enumerate(targets.items()):
        if only and key not in only:
            rows.extend(kept.get(key, []))
            continue
        k = spec["shape"][2]
        rows.append(run_target(key, spec, args.tiles, k, seed=args.seed + 2 * j))
        if args.chain_tiles:
            rows.append(run_target(key, spec, args.chain_tiles, CHAIN_K, seed=args.seed + 2 * j + 1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {args.out}")
    worst = min(float(r["bit_exact_fraction"]) for r in rows)
    return 0 if worst >= 0.999 else 1


if __name__ == "__main__":
    sys.exit(main())
