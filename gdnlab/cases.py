"""The conformance matrix as data.

:data:`CASES` mirrors the report's 23-case test: chunk-aligned and unaligned lengths, dense batches whose T is not a
multiple of the chunk, ragged varlen batches (1-token sequences, many short sequences, trailing padding rows), both
state dtypes, with and without initial state. All use the CuteDSL test's shapes and its q, k, v, beta, with a
slower gate (see Case.regime): Hk = 4, Hv = 8, K = V = 128, bf16. :data:`ISOLATION` holds the report's three
isolation cases. Each case is small, because CI runs them through the Triton CPU interpreter: :func:`total_chunks`
over CASES stays under 120.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from gdnlab.inputs import GDNInputs, make_inputs
from gdnlab.kernel_params import BT

__all__ = ["Case", "CASES", "ISOLATION", "CASES_BY_NAME", "total_chunks"]

H, HV, K, V = 4, 8, 128, 128

_F32, _BF16 = torch.float32, torch.bfloat16


@dataclass(frozen=True)
class Case:
    """One conformance case. ``seqlens`` (a tuple) makes it a ragged batch of B = 1 with ``pad`` trailing rows."""

    name: str
    B: int = 1
    T: int = 64
    seqlens: tuple[int, ...] | None = None
    pad: int = 0
    state_dtype: torch.dtype = _F32
    initial_state: bool = True
    # CuteDSL's q, k, v, beta with a slow gate (mean -g = 0.1 per token): CuteDSL's own gate decays ~7.7 per token
    # (docs/design.md §6), so almost no state is carried into a chunk and the shipped kernel's defect would be
    # invisible.
    regime: str = "decay"
    seed: int = 0

    def inputs(self, device: str | torch.device = "cpu") -> GDNInputs:
        """The case's seeded inputs (Hk=4, Hv=8, K=V=128, bf16) on ``device``."""
        return make_inputs(B=self.B, T=self.T, H=H, HV=HV, K=K, V=V,
                           seqlens=None if self.seqlens is None else list(self.seqlens), pad=self.pad,
                           regime=self.regime, seed=self.seed, dtype=_BF16, initial_state=self.initial_state,
                           state_dtype=self.state_dtype, device=device)

    @property
    def lengths(self) -> list[int]:
        """Length of every sequence."""
        return [self.T] * self.B if self.seqlens is None else list(self.seqlens)

    @property
    def n_tokens(self) -> int:
        """Rows of the token buffer(s), padding included."""
        return self.B * self.T if self.seqlens is None else sum(self.seqlens) + self.pad

    @property
    def n_chunks(self) -> int:
        """Chunks over all sequences (what a chunk-walking kernel iterates, per head and V tile)."""
        return sum(-(-n // BT) for n in self.lengths)


def _c(name: str, seed: int, **kw) -> Case:
    return Case(name=name, seed=seed, **kw)


#: The 23 conformance cases.
CASES: tuple[Case, ...] = (
    # dense, one sequence: around the chunk boundaries and a few chunks
    _c("t1", 1, T=1),
    _c("t63", 2, T=63),
    _c("t64", 3, T=64),
    _c("t65", 4, T=65),
    _c("t128", 5, T=128),
    _c("t129", 6, T=129),
    _c("t192", 7, T=192),
    _c("t320", 8, T=320),
    _c("t513", 9, T=513),
    # state dtype bf16, and no initial state
    _c("t64_bf16", 10, T=64, state_dtype=_BF16),
    _c("t129_bf16", 11, T=129, state_dtype=_BF16),
    _c("t128_noh0", 12, T=128, initial_state=False),
    _c("t65_bf16_noh0", 13, T=65, state_dtype=_BF16, initial_state=False),
    # dense padded batches: B > 1, T not a multiple of the chunk
    _c("b2_t100", 14, B=2, T=100),
    _c("b3_t65_bf16", 15, B=3, T=65, state_dtype=_BF16),
    _c("b4_t33_noh0", 16, B=4, T=33, initial_state=False),
    # ragged varlen batches
    _c("var_1tok", 17, seqlens=(1, 1, 1)),
    _c("var_edges", 18, seqlens=(1, 63, 64, 65)),
    _c("var_16short", 19, seqlens=(3, 1, 7, 12, 5, 9, 2, 16, 4, 11, 8, 1, 6, 10, 13, 15)),
    _c("var_pad", 20, seqlens=(50, 70), pad=14),
    _c("var_pad_bf16_noh0", 21, seqlens=(100, 28, 129), pad=7, state_dtype=_BF16, initial_state=False),
    _c("var_long", 22, seqlens=(200, 65)),
    _c("var_1tok_pad_bf16", 23, seqlens=(1, 130), pad=5, state_dtype=_BF16),
)

#: The report's isolation cases: the inter-chunk term is zero only in the first.
ISOLATION: tuple[Case, ...] = (
    _c("iso_1chunk_noh0", 101, T=64, initial_state=False),
    _c("iso_1chunk_h0", 102, T=64, initial_state=True),
    _c("iso_2chunk_noh0", 103, T=128, initial_state=False),
)

#: Every case above by name.
CASES_BY_NAME: dict[str, Case] = {c.name: c for c in CASES + ISOLATION}


def total_chunks(cases: tuple[Case, ...] = CASES) -> int:
    """Sum over cases of chunks per sequence times sequences: the cost of a case set in the CPU interpreter."""
    return sum(c.n_chunks for c in cases)
