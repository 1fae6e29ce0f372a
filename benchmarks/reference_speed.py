"""Time the two float64 references at a long prefill: per-token recurrence vs chunked (WY) form.

Run: ``.venv/bin/python benchmarks/reference_speed.py [--T 4096] [--device cpu] [--threads N]``. Prints the best of
``--repeats`` runs of each, the speed-up and how closely the two agree. A measurement, not a test: the numbers depend
on the machine and on whatever else it is running.

Why the speed-up is bounded: both forms do about 6*K*V flops per token and head on the state (read it with W or k,
read it with Q or q, update it), plus O(BT*(K+V)) for the chunked form's intra-chunk work. The chunked form wins only
by doing them as matrix-matrix products; the per-token loop already streams an L2-resident state. On a CPU the
ratio is therefore about (float64 GEMM rate) / (per-token loop rate), a few times, not orders of magnitude.
"""
from __future__ import annotations

import argparse
import time

import torch

from gdnlab.inputs import make_inputs
from gdnlab.metrics import errors
from gdnlab.reference import chunk_gated_delta_rule_ref, recurrent_gated_delta_rule_ref


def _best_of(fn, repeats: int) -> tuple[float, tuple]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        if str(out[0].device).startswith("cuda"):
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, default=4096)
    ap.add_argument("--H", type=int, default=4)
    ap.add_argument("--HV", type=int, default=4)
    ap.add_argument("--K", type=int, default=128)
    ap.add_argument("--V", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)

    inp = make_inputs(T=a.T, H=a.H, HV=a.HV, K=a.K, V=a.V, regime="decay", decay=0.02, device=a.device)
    kw = inp.kwargs()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, device {a.device}; "
          f"T={a.T} H={a.H} HV={a.HV} K={a.K} V={a.V}, float64")
    t_rec, (o_rec, s_rec) = _best_of(lambda: recurrent_gated_delta_rule_ref(**kw), a.repeats)
    t_chk, (o_chk, s_chk) = _best_of(lambda: chunk_gated_delta_rule_ref(**kw), a.repeats)
    print(f"per-token recurrence : {t_rec * 1e3:9.1f} ms")
    print(f"chunked (WY, BT=64)  : {t_chk * 1e3:9.1f} ms")
    print(f"speed-up             : {t_rec / t_chk:9.1f}x")
    print(f"agreement: output rel_rms {errors(o_chk, o_rec)['rel_rms']:.2e}, "
          f"final state rel_rms {errors(s_chk, s_rec)['rel_rms']:.2e}")


if __name__ == "__main__":
    main()
