"""Error measures and the pass/fail budgets the lab's comparisons use.

All arithmetic is float64, whatever the dtypes of the operands. A NaN anywhere in the output makes every measure NaN,
and a NaN never passes a budget (every comparison with NaN is False).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["ulp_bf16", "errors", "valid_rows", "Budget", "CUTEDSL_OUTPUT", "CUTEDSL_STATE", "FLA_REL_RMS"]

#: Unit roundoff of bfloat16 (8 significand bits, round to nearest): 2**-8. Relative error of one rounding is <= this.
ulp_bf16: float = 2.0 ** -8


def valid_rows(cu_seqlens: torch.Tensor | None, T: int, B: int = 1) -> torch.Tensor:
    """Boolean mask ``[T]`` of the rows of a token buffer that belong to a sequence (False on padding rows).

    With ``cu_seqlens`` None every row is valid. With ``B > 1`` (dense only) the mask is ``[B, T]``.
    """
    if cu_seqlens is None:
        shape = (T,) if B == 1 else (B, T)
        return torch.ones(shape, dtype=torch.bool)
    if B != 1:
        raise ValueError(f"B: a ragged buffer (cu_seqlens) has B == 1, got {B}")
    end = int(cu_seqlens[-1])
    if end > T:
        raise ValueError(f"cu_seqlens: last offset {end} passes the end of the T={T} token buffer")
    mask = torch.zeros(T, dtype=torch.bool, device=cu_seqlens.device)
    mask[:end] = True   # sequences are contiguous from 0 to cu_seqlens[-1]; everything after is padding
    return mask


def _select(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return x
    mask = mask.to(device=x.device, dtype=torch.bool)
    if tuple(mask.shape) == tuple(x.shape[: mask.dim()]):
        return x[mask]
    if mask.dim() == 1 and x.dim() >= 2 and mask.shape[0] == x.shape[1]:
        return x[:, mask]   # a [T] row mask applied to every batch row of a [B, T, ...] tensor
    raise ValueError(f"mask: must have shape {tuple(x.shape[:mask.dim()])} (leading dims) or [T]={x.shape[1]} "
                     f"for a tensor of shape {tuple(x.shape)}, got {tuple(mask.shape)}")


def errors(out: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor | None = None) -> dict[str, float]:
    """Error of ``out`` against ``ref`` in float64: ``max_abs``, ``mean_abs``, ``rel_rms`` = ‖out − ref‖ / ‖ref‖.

    ``mask`` (bool, over the leading dims, or a ``[T]`` row mask) restricts the comparison, e.g. to
    :func:`valid_rows`. NaN anywhere in ``out`` or ``ref`` (after masking) makes every value NaN. An empty
    selection gives zeros. ``ref`` all zero gives ``rel_rms`` 0 if ``out`` matches it exactly, else inf.
    """
    if not isinstance(out, torch.Tensor) or not isinstance(ref, torch.Tensor):
        raise TypeError(f"out, ref: must be torch.Tensor, got {type(out).__name__}, {type(ref).__name__}")
    if tuple(out.shape) != tuple(ref.shape):
        raise ValueError(f"out: must have ref's shape {tuple(ref.shape)}, got {tuple(out.shape)}")
    a = _select(out.detach(), mask).to(device="cpu", dtype=torch.float64)
    b = _select(ref.detach(), mask).to(device="cpu", dtype=torch.float64)
    if a.numel() == 0:
        return dict(max_abs=0.0, mean_abs=0.0, rel_rms=0.0)
    if torch.isnan(a).any() or torch.isnan(b).any():
        return dict(max_abs=math.nan, mean_abs=math.nan, rel_rms=math.nan)
    d = (a - b).abs()
    num, den = float(torch.linalg.vector_norm(a - b)), float(torch.linalg.vector_norm(b))
    rel = num / den if den > 0 else (0.0 if num == 0 else math.inf)
    return dict(max_abs=float(d.max()), mean_abs=float(d.mean()), rel_rms=rel)


@dataclass(frozen=True)
class Budget:
    """Upper limits (strict ``<``) on some of the measures of :func:`errors`; a limit of None is not checked."""

    name: str
    max_abs: float | None = None
    mean_abs: float | None = None
    rel_rms: float | None = None

    def limits(self) -> dict[str, float]:
        """The limits that are set, by measure name."""
        return {k: v for k, v in (("max_abs", self.max_abs), ("mean_abs", self.mean_abs),
                                   ("rel_rms", self.rel_rms)) if v is not None}

    def check(self, out: torch.Tensor, ref: torch.Tensor,
              mask: torch.Tensor | None = None) -> tuple[bool, dict[str, float]]:
        """``(ok, errs)``: ok when every set limit holds strictly; NaN or inf never passes."""
        errs = errors(out, ref, mask)
        ok = not math.isnan(errs["max_abs"]) and all(errs[k] < lim for k, lim in self.limits().items())
        return ok, errs


#: The CuteDSL GDN prefill test's budget on the output o: max abs < 2e-3, mean abs < 6e-5. These are the tolerances
#: the report's test used unchanged; the lab has not found that test's public source, and FlashInfer's GDN prefill
#: test uses other, elementwise tolerances (docs/design.md §6).
CUTEDSL_OUTPUT = Budget("cutedsl_output", max_abs=2e-3, mean_abs=6e-5)
#: Same test, final state (reference state cast to the state dtype first): max abs < 2e-2, mean abs < 6e-4.
CUTEDSL_STATE = Budget("cutedsl_state", max_abs=2e-2, mean_abs=6e-4)
#: FLA's tests: relative RMS error < 0.005 against an fp32 per-token reference.
FLA_REL_RMS = Budget("fla_rel_rms", rel_rms=0.005)
