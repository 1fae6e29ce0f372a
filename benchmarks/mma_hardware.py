"""The Hopper matrix-unit model against the tensor cores: random and adversarial bf16 tiles through one tl.dot on the
device and through gdnlab.mma's models, compared bit for bit (which instruction ran is read from the PTX)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch
import triton
import triton.language as tl

from benchmarks.context import Context
from benchmarks.env import log, stamp
from benchmarks.inputs import DEV

OUTPUT = "mma_model_vs_hardware.csv"


@triton.jit
def _tile_dot(a_ptr, b_ptr, c_ptr, d_ptr, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr):
    i = tl.program_id(0)
    rm, rk, rn = tl.arange(0, M), tl.arange(0, K), tl.arange(0, N)
    a = tl.load(a_ptr + i * M * K + rm[:, None] * K + rk[None, :])
    b = tl.load(b_ptr + i * K * N + rk[:, None] * N + rn[None, :])
    c = tl.load(c_ptr + i * M * N + rm[:, None] * N + rn[None, :])
    tl.store(d_ptr + i * M * N + rm[:, None] * N + rn[None, :], tl.dot(a, b, c))


def run(ctx: Context, n: int = 2000) -> pd.DataFrame:
    """Per tile shape and model: the fraction of output elements (and of whole tiles) bit-equal to the device."""
    from gdnlab import mma
    rows = []
    for m, k, cols, warps in [(64, 64, 64, 4), (16, 16, 16, 1), (64, 16, 8, 4)]:
        a, b, c = mma.hardware_check_tiles(n, seed=m + k + cols, m=m, k=k, cols=cols)
        at = torch.from_numpy(a).to(DEV).to(torch.bfloat16)
        assert torch.equal(at.float().cpu(), torch.from_numpy(a)), "tiles must hold bf16 values"
        bt = torch.from_numpy(b).to(DEV).to(torch.bfloat16)
        ct = torch.from_numpy(c).to(DEV)
        d = torch.full_like(ct, float("nan"))
        kern = _tile_dot[(n,)](at, bt, ct, d, M=m, K=k, N=cols, num_warps=warps)
        ptx = kern.asm.get("ptx", "")
        instr = "wgmma" if "wgmma" in ptx else ("mma.sync" if "mma.sync" in ptx else "none")
        dh = d.cpu().numpy()
        kinds = mma.tile_kinds(n, mma.HARDWARE_KINDS)
        for name in ("hopper", "ideal", "ampere"):
            want = mma.get_model(name).dot(a, b, c)
            per_tile = np.array([mma.bit_exact_fraction(dh[i], want[i]) for i in range(n)])
            rows.append(dict(model=name, shape=f"{m}x{k}x{cols}", instruction=instr, cases=n * m * cols, tiles=n,
                             bit_exact_fraction=float(per_tile.mean()),
                             tiles_all_exact=float((per_tile == 1).mean())))
            for kind in sorted(set(kinds)):
                sel = np.array([x == kind for x in kinds])
                rows.append(dict(model=name, shape=f"{m}x{k}x{cols}", instruction=instr, kind=kind,
                                 cases=int(sel.sum()) * m * cols, tiles=int(sel.sum()),
                                 bit_exact_fraction=float(per_tile[sel].mean())))
        log("mma", m, k, cols, instr)
    return stamp(pd.DataFrame(rows), ctx.env)
