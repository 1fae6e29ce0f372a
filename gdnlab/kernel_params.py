"""The sizes and named switch settings of the lab's kernels, in one place (standard library only, so that
gdnlab.dot_shapes can read them inside the throwaway venvs of older Tritons).

Chunked GDN splits every sequence into chunks of BT rows (docs/design.md §2); the kernels hold K in register tiles
of K_TILE columns (at most four, so K <= MAX_K) and split V into tiles of BV columns, one program per V tile.
The fused kernel's two compile-time switches (docs/design.md §4) give its named variants: as shipped, as fixed, and
each with the bf16 downcast of the state switched off.
"""
from __future__ import annotations

from dataclasses import dataclass

#: Rows per chunk. The prologue's solve works on four SOLVE_BLOCK-row blocks, so BT is fixed at 64.
BT = 64
#: Rows of the prologue's diagonal blocks (T = (I + A)^-1 is solved block by block).
SOLVE_BLOCK = 16
#: Width of the register tiles K is held in; the kernels unroll at most four of them.
K_TILE = 64
#: The largest key dim the state-carrying kernels take (four K tiles).
MAX_K = 4 * K_TILE
#: The V tiles the state-carrying kernels take (option BV); the fused kernel as shipped autotuned over these.
STATE_BVS: tuple[int, ...] = (8, 16, 32, 64)
#: The V tiles the two-kernel path's output kernel takes (option out_BV).
OUT_BVS: tuple[int, ...] = (8, 16, 32, 64, 128)
#: Chunks per output-kernel program (two_kernel's out_chunks): one block of rows from the first chunk's h.
OUT_CHUNKS: tuple[int, ...] = (1, 2)


def cdiv(n: int, d: int) -> int:
    """ceil(n / d) for launch grids (plain Python: triton.cdiv is a constexpr function, ~5 us per host call)."""
    return -(-n // d)


def pow2(n: int) -> int:
    """The smallest power of two >= n (padded tile widths; plain Python for the same reason as cdiv)."""
    return 1 << (n - 1).bit_length() if n > 1 else 1


@dataclass(frozen=True)
class FusedVariant:
    """A setting of the fused kernel's switches: ``downcast`` (round the fp32 state to bf16 before Q.h) and
    ``intra_vnew`` (the intra-chunk term multiplies the masked scores by V_new = U - W.S rather than by U)."""

    name: str
    downcast: bool
    intra_vnew: bool

    @property
    def options(self) -> dict[str, bool]:
        """The switches as options of ``chunk_gated_delta_rule`` / ``gdnlab.kernels.fused``."""
        return dict(downcast=self.downcast, intra_vnew=self.intra_vnew)

    @property
    def constexprs(self) -> dict[str, bool]:
        """The switches as the fused kernel's constexpr arguments."""
        return dict(DOWNCAST=self.downcast, INTRA_VNEW=self.intra_vnew)

    @property
    def intra_operand(self) -> str:
        """The intra-chunk term's operand: "V_new" or "U"."""
        return "V_new" if self.intra_vnew else "U"

    @property
    def label(self) -> str:
        """A one-line description (the ablation tables' variant column)."""
        tag = {"fused_shipped": " (as shipped)", "fused_fixed": " (fixed)"}.get(self.name, "")
        return f"downcast {'on' if self.downcast else 'off'}, intra A·{self.intra_operand}{tag}"


#: Every named variant of the fused kernel: the kernel as it shipped, as fixed, and each without the downcast.
FUSED_VARIANTS: dict[str, FusedVariant] = {v.name: v for v in (
    FusedVariant("fused_shipped", downcast=True, intra_vnew=False),
    FusedVariant("fused_fixed", downcast=True, intra_vnew=True),
    FusedVariant("fused_shipped_no_downcast", downcast=False, intra_vnew=False),
    FusedVariant("fused_fixed_no_downcast", downcast=False, intra_vnew=True),
)}
#: The switches of the kernel as it shipped and as fixed (the options of the fused backends).
SHIPPED: dict[str, bool] = FUSED_VARIANTS["fused_shipped"].options
FIXED: dict[str, bool] = FUSED_VARIANTS["fused_fixed"].options
