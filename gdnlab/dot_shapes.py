"""Static check of tl.dot shapes against each target's matrix instructions, before anything is compiled.

Every lab kernel issues a fixed set of `tl.dot` sites whose shapes follow from the tile sizes of
gdnlab.kernel_params (BT rows per chunk, K_TILE-wide K tiles, BV-wide V tiles). `kernel_dots` lists them (read off
the kernel source); `INSTRUCTIONS` holds, as data, the matrix instructions each target has; `check_dot_shapes`
says which dots fall below every instruction of their operand type (the autotune configs a target cannot serve
natively) and which have no instruction at all (an FMA loop by design, e.g. fp32 dots with input_precision="ieee"
on NVIDIA).

What a Triton release *does* with a small dot differs between releases and targets: `FRONTEND_MIN` is the shape
assertion `tl.dot` itself makes (read from each release's source), `SMALL_DOT_LOWERING` what the backend then does
with a dot that has M or N below 16 (serve it with a matrix instruction, padded if need be; fall back to an FMA loop;
or fail), measured by `gdnlab compile-matrix`. `predict` and `expected_lowering` combine the three.

This module imports nothing but the standard library (and gdnlab.kernel_params, which is standard library only), so
it runs inside the throwaway venvs of older Tritons too.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gdnlab.kernel_params import BT as _BT, FUSED_VARIANTS, K_TILE, OUT_BVS, SOLVE_BLOCK, STATE_BVS

#: Targets of the compile matrix: name -> (backend, arch, warp size).
TARGETS: dict[str, tuple[str, object, int]] = {
    "cuda:90": ("cuda", 90, 32),
    "hip:gfx942": ("hip", "gfx942", 64),
    "hip:gfx1151": ("hip", "gfx1151", 32),
}


@dataclass(frozen=True)
class TwoKernelBuild:
    """One build of a kernel the two-kernel path launches: its jit function (in gdnlab/kernels), the options of
    ``chunk_gated_delta_rule(..., backend="two_kernel")`` whose call launches it this way, the V tiles it takes
    (`bvs`: the BVs the compile matrix builds it at; empty for a kernel whose tiles do not depend on BV) and the
    option of that call that sets its BV (`bv_option`: "BV" for the state kernel, "out_BV" for the output kernel,
    gdnlab.kernels.two_kernel)."""

    fn: str
    options: dict[str, Any] = field(default_factory=dict, hash=False)
    bvs: tuple[int, ...] = ()
    bv_option: str = "BV"


#: fast's l2-norm folded into the gates (gdnlab/backends.py FAST): log_norm_kernel, then the prologue, state and
#: output kernels with FOLD=True. (It takes effect with use_qk_l2norm, which every build's call sets.)
FOLD_NORM: dict[str, Any] = {"fold_norm": True}

#: fast's fold with the walk applying T (option walk_t, docs/speed-notes.md item 43): the prologue stores T
#: (STORE_T, no W or U products) and the state kernel forms V_new from T itself (T_FORM, one product more).
WALK_T: dict[str, Any] = {**FOLD_NORM, "walk_t": True}

#: fast's fold with the state kernel writing the output (option fused_output, docs/speed-notes.md item 55): no
#: output kernel; the state kernel adds the output kernel's three products to its own two.
FUSED_OUTPUT: dict[str, Any] = {**FOLD_NORM, "fused_output": True}
#: fast's layout for batches (items 55 and 56): the fused walk forming V_new from the T the prologue stores.
BATCH_LAYOUT: dict[str, Any] = {**FUSED_OUTPUT, "walk_t": True}
#: The batch layout with the state update reusing the K tiles of K S (option walk_k_once, item 59): fast's for
#: batches since then, launched at 2 stages (one of the compile matrix's stage counts).
K_ONCE: dict[str, Any] = {**BATCH_LAYOUT, "walk_k_once": True}
#: fast's prologue for batches (item 61): T only, its diagonal blocks solved by register moves (the same products
#: as the default solve's).
T_MOVES: dict[str, Any] = {**WALK_T, "prologue_solve": "moves"}
#: fast's prologue where it runs at most two programs a multiprocessor (item 35): W and U, its diagonal blocks
#: inverted by products ("doubling": six batched 16x16 fp32 products more than the default solve).
DOUBLING: dict[str, Any] = {**FOLD_NORM, "prologue_solve": "doubling"}

#: wu_apart (docs/speed-notes.md item 72, a candidate for one long sequence): the prologue stores T only ("blocks"
#: solve, the fold) and wu_kernel forms W and U from it, one program per chunk and value head.
WU_APART: dict[str, Any] = {**FOLD_NORM, "wu_apart": True}

#: walk_ws (item 73, a candidate for one sequence): the W/U walk's tiles through tensor descriptors, its chunk loop
#: warp-specialised (on Hopper; the same dots).
WALK_WS: dict[str, Any] = {**FOLD_NORM, "walk_ws": True}

#: split_scores (item 74, a candidate for every shape): the output's gated scores as two bf16 terms, in the output
#: kernel and in the batches' fused walk (one dot more where the output is formed).
SPLIT_SCORES: dict[str, Any] = {**FOLD_NORM, "split_scores": True}

#: The state kernel's V tiles (option BV) and the output kernel's (option out_BV: fast launches it at 128).
_STATE = dict(bvs=STATE_BVS)
_OUTPUT = dict(bvs=OUT_BVS, bv_option="out_BV")

#: The two-kernel path's builds of the compile matrix: name -> jit function, call options, V tiles. A name with
#: options is the same jit function launched with other constexprs (FOLD adds no tl.dot: kernel_dots reads the
#: sites off the function).
TWO_KERNEL_BUILDS: dict[str, TwoKernelBuild] = {
    "l2norm": TwoKernelBuild("l2norm_kernel"),
    "prologue": TwoKernelBuild("prologue_kernel"),
    "fwd_h": TwoKernelBuild("fwd_h_kernel", **_STATE),
    "fwd_o": TwoKernelBuild("fwd_o_kernel", **_OUTPUT),
    "log_norm": TwoKernelBuild("log_norm_kernel", FOLD_NORM),
    "prologue_fold": TwoKernelBuild("prologue_kernel", FOLD_NORM),
    "fwd_h_fold": TwoKernelBuild("fwd_h_kernel", FOLD_NORM, **_STATE),
    "fwd_o_fold": TwoKernelBuild("fwd_o_kernel", FOLD_NORM, **_OUTPUT),
    "prologue_walk_t": TwoKernelBuild("prologue_kernel", WALK_T),
    "prologue_t_moves": TwoKernelBuild("prologue_kernel", T_MOVES),
    "prologue_doubling": TwoKernelBuild("prologue_kernel", DOUBLING),
    "fwd_h_walk_t": TwoKernelBuild("fwd_h_kernel", WALK_T, **_STATE),
    "fwd_h_fused_output": TwoKernelBuild("fwd_h_kernel", FUSED_OUTPUT, **_STATE),
    "fwd_h_batch_layout": TwoKernelBuild("fwd_h_kernel", BATCH_LAYOUT, **_STATE),
    "fwd_h_k_once": TwoKernelBuild("fwd_h_kernel", K_ONCE, **_STATE),
    "fwd_h_ws": TwoKernelBuild("fwd_h_kernel", WALK_WS, **_STATE),
    "prologue_wu_apart": TwoKernelBuild("prologue_kernel", WU_APART),
    "wu": TwoKernelBuild("wu_kernel", WU_APART),
    "fwd_o_split": TwoKernelBuild("fwd_o_kernel", SPLIT_SCORES, **_OUTPUT),
    "fwd_h_k_once_split": TwoKernelBuild("fwd_h_kernel", {**K_ONCE, **SPLIT_SCORES}, **_STATE),
}

#: The jit function every fused variant launches (with its switches as constexprs).
FUSED_FN = "fused_kernel"


def jit_fn(kernel: str) -> str:
    """The name of the jit function behind `kernel` (a name of KERNELS)."""
    return FUSED_FN if kernel in FUSED_VARIANTS else TWO_KERNEL_BUILDS[kernel].fn


#: Kernels of the compile matrix: the shared and two-kernel builds, then every named fused variant.
KERNELS: tuple[str, ...] = (*TWO_KERNEL_BUILDS, *FUSED_VARIANTS)
#: The V tiles each kernel takes, i.e. the BVs the compile matrix builds it at: the two-kernel builds' own
#: (TWO_KERNEL_BUILDS), the fused variants' STATE_BVS (their autotune space as shipped); () for a BV-free kernel.
KERNEL_BVS: dict[str, tuple[int, ...]] = {**{n: b.bvs for n, b in TWO_KERNEL_BUILDS.items()},
                                          **{n: STATE_BVS for n in FUSED_VARIANTS}}
#: Kernels whose tiles depend on BV (the others compile once per num_warps/num_stages).
BV_KERNELS: frozenset[str] = frozenset(n for n, bvs in KERNEL_BVS.items() if bvs)


@dataclass(frozen=True)
class Dot:
    """One tl.dot site: [M, K] x [K, N]; operands "bf16", or "fp32" (input_precision="ieee")."""

    site: str
    M: int
    N: int
    K: int
    operands: str = "bf16"

    @property
    def shape(self) -> str:
        return f"[{self.M},{self.K}]x[{self.K},{self.N}]"


@dataclass(frozen=True)
class Instr:
    """A matrix instruction: the smallest M x N x K block it computes, and the warps it needs."""

    name: str
    M: int
    N: int
    K: int
    operands: str = "bf16"
    min_warps: int = 1

    def covers(self, d: Dot, num_warps: int) -> bool:
        return (d.operands == self.operands and d.M >= self.M and d.N >= self.N and d.K >= self.K
                and num_warps >= self.min_warps)


#: The matrix instructions of each target, per operand type (data; sources: PTX ISA, CDNA3 and RDNA3.5 ISA guides).
INSTRUCTIONS: dict[str, tuple[Instr, ...]] = {
    # Hopper: wgmma needs a warpgroup (4 warps) and M = 64; mma.sync m16n8k16 otherwise. fp32 "ieee" dots have no
    # tensor-core instruction (tf32 would round the operands), so they are FMA loops by design.
    "cuda:90": (
        Instr("wgmma.m64nNk16", 64, 8, 16, "bf16", min_warps=4),
        Instr("mma.m16n8k16", 16, 8, 16, "bf16"),
    ),
    # CDNA3 (MI300X): 32x32x8 and 16x16x16 bf16 MFMA, and the 4x4x4 16-block MFMA that Triton uses as a 64x4 or
    # 4x64 tile; fp32 MFMA exists too (32x32x2, 16x16x4, 4x4x1 16-block).
    "hip:gfx942": (
        Instr("v_mfma_f32_32x32x8_bf16", 32, 32, 8),
        Instr("v_mfma_f32_16x16x16_bf16", 16, 16, 16),
        Instr("v_mfma_f32_4x4x4_16b_bf16 (64x4)", 64, 4, 4),
        Instr("v_mfma_f32_4x4x4_16b_bf16 (4x64)", 4, 64, 4),
        Instr("v_mfma_f32_32x32x2_f32", 32, 32, 2, "fp32"),
        Instr("v_mfma_f32_16x16x4_f32", 16, 16, 4, "fp32"),
        Instr("v_mfma_f32_4x4x1_16b_f32 (64x4)", 64, 4, 1, "fp32"),
        Instr("v_mfma_f32_4x4x1_16b_f32 (4x64)", 4, 64, 1, "fp32"),
    ),
    # RDNA3/3.5 WMMA: 16x16x16 is the only shape; no fp32 operands.
    "hip:gfx1151": (
        Instr("v_wmma_f32_16x16x16_bf16", 16, 16, 16),
    ),
}


def _output_dots(BV: int, kt: int, BT: int) -> list[Dot]:
    """The output's tl.dot sites (the output kernel's, or the state kernel's with fused_output)."""
    return [
        Dot("Q.h", BT, BV, kt),
        Dot("Q.K^T", BT, BT, kt),
        Dot("A.V_new", BT, BV, BT),
    ]


def kernel_dots(kernel: str, BV: int | None = None, K: int = 128, BT: int = _BT) -> list[Dot]:
    """The tl.dot sites `kernel` issues for one V tile of width BV (K = key dim, BT = chunk rows).

    Read off gdnlab/kernels: every K-tile loop repeats the same shapes, so each site is listed once. The sites are
    those of the build's jit function (TWO_KERNEL_BUILDS): FOLD changes gates, not dots; walk_t drops the
    prologue's W and U products and adds T's product to the state kernel; wu_apart moves W's and U's to
    wu_kernel; fused_output adds the output's three; the "doubling" solve adds its batched products of the diagonal
    blocks.
    BV must be one of the V tiles the kernel takes (KERNEL_BVS: the output kernel's run to 128, N = BV there too).
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel: unknown {kernel!r}; known: {', '.join(KERNELS)}")
    if kernel in BV_KERNELS:
        if not isinstance(BV, int):
            raise TypeError(f"BV: {kernel} needs an int BV, got {BV!r}")
        if BV not in KERNEL_BVS[kernel]:
            raise ValueError(f"BV: {kernel} takes one of {', '.join(map(str, KERNEL_BVS[kernel]))}, got {BV!r}")
    kt = min(K, K_TILE)  # K is walked in register tiles
    fn = jit_fn(kernel)
    build = TWO_KERNEL_BUILDS[kernel].options if kernel in TWO_KERNEL_BUILDS else {}
    walk_t, fused_output = build.get("walk_t", False), build.get("fused_output", False)
    t_only = walk_t or build.get("wu_apart", False)  # the prologue stores T, W and U are formed elsewhere
    doubling = build.get("prologue_solve") == "doubling"
    if fn in ("l2norm_kernel", "log_norm_kernel"):
        return []
    if fn == "prologue_kernel":
        # Whole-chunk dots (K and V whole, padded to a power of two; V = K here) and the solve's 16x16 products.
        solve = [Dot("beta.K.K^T", BT, BT, K),
                 Dot("block substitution T_ij (ieee)", SOLVE_BLOCK, SOLVE_BLOCK, SOLVE_BLOCK, "fp32")]
        if doubling:
            solve.append(Dot("diagonal blocks by doubling, batched (ieee)", SOLVE_BLOCK, SOLVE_BLOCK, SOLVE_BLOCK,
                             "fp32"))
        return solve if t_only else solve + _wu_dots(K, BT)
    if fn == "wu_kernel":
        return _wu_dots(K, BT)
    if fn == "fwd_h_kernel":
        walk = [
            Dot("K.h", BT, BV, kt),
            Dot("T.(beta (V - exp(G) K.h))", BT, BV, BT),
            Dot("K^T.V_new (state update)", kt, BV, BT),
        ] if walk_t else [
            Dot("W.h", BT, BV, kt),
            Dot("K^T.V_new (state update)", kt, BV, BT),
        ]
        return walk + _output_dots(BV, kt, BT) if fused_output else walk
    if fn == "fwd_o_kernel":
        return _output_dots(BV, kt, BT)
    f = FUSED_VARIANTS[kernel]
    return [
        Dot("Q.h", BT, BV, kt, "bf16" if f.downcast else "fp32"),
        Dot("Q.K^T", BT, BT, kt),
        Dot("W.h", BT, BV, kt),
        Dot(f"A.{f.intra_operand}", BT, BV, BT),
        Dot("V_new^T.K (V-first state update)", BV, kt, BT),
    ]


def _wu_dots(K: int, BT: int) -> list[Dot]:
    """W's and U's products from T (in prologue_kernel, or wu_kernel with wu_apart; V = K here)."""
    return [Dot("W = T.(beta exp(G) K)", BT, K, BT), Dot("U = T.(beta V)", BT, K, BT)]


@dataclass(frozen=True)
class ShapeCheck:
    """The verdict for one (target, kernel, BV, num_warps): dots below the minimum, dots with no instruction."""

    target: str
    kernel: str
    BV: int | None
    num_warps: int
    dots: tuple[Dot, ...]
    below_min: tuple[Dot, ...] = field(default=())
    no_instr: tuple[Dot, ...] = field(default=())

    @property
    def ok(self) -> bool:
        """True when every dot that has an instruction type on this target fits one."""
        return not self.below_min

    def summary(self) -> str:
        """'native', or 'below_min: <site shape>; ...' (what the CSV's static_check column holds)."""
        if self.ok:
            return "native"
        return "below_min: " + "; ".join(f"{d.site} {d.shape}" for d in self.below_min)


def check_dot_shapes(target: str, BV: int | None, kernel: str = "fused_shipped", num_warps: int = 4, K: int = 128,
                     BT: int = _BT) -> ShapeCheck:
    """Flag the dots of `kernel` at this BV that fall below every matrix instruction of `target`."""
    if target not in INSTRUCTIONS:
        raise ValueError(f"target: unknown {target!r}; known: {', '.join(INSTRUCTIONS)}")
    if not isinstance(num_warps, int) or num_warps < 1:
        raise ValueError(f"num_warps: must be a positive int, got {num_warps!r}")
    dots = tuple(kernel_dots(kernel, BV, K, BT))
    below, none = [], []
    for d in dots:
        cands = [i for i in INSTRUCTIONS[target] if i.operands == d.operands]
        if not cands:
            none.append(d)
        elif not any(i.covers(d, num_warps) for i in cands):
            below.append(d)
    return ShapeCheck(target, kernel, BV if kernel in BV_KERNELS else None, num_warps, dots, tuple(below),
                      tuple(none))


def flag_autotune_configs(target: str, kernel: str, configs: list[dict], K: int = 128,
                          BT: int = _BT) -> list[ShapeCheck]:
    """The configs (dicts with BV and num_warps) of an autotune list that `target` cannot serve natively."""
    out = []
    for c in configs:
        chk = check_dot_shapes(target, c.get("BV"), kernel, c.get("num_warps", 4), K, BT)
        if not chk.ok:
            out.append(chk)
    return out


# ---- what each Triton release does with small dots --------------------------------------------------------------

@dataclass(frozen=True)
class FrontendMin:
    """The (M, N, K) minimum that `tl.dot` itself asserts in Triton releases [first, last] for targets whose name
    starts with `target` (read from each release's backend `min_dot_size` / language/semantic.py; for 16-bit and
    32-bit operands, which share it in every release for the shapes these kernels use)."""

    first: str
    last: str
    target: str
    mnk: tuple[int, int, int]


FRONTEND_MIN: tuple[FrontendMin, ...] = (
    FrontendMin("3.0.0", "3.1.99", "", (16, 16, 16)),  # one assert for every target: "must be >= 16!"
    FrontendMin("3.2.0", "3.2.99", "hip:gfx94", (16, 16, 8)),
    FrontendMin("3.2.0", "3.2.99", "", (16, 16, 16)),
    FrontendMin("3.3.0", "3.4.99", "cuda", (16, 16, 16)),
    FrontendMin("3.3.0", "9.99", "hip", (1, 1, 1)),  # AMD: "fall back to FMA if no matrix instruction fits"
    FrontendMin("3.5.0", "9.99", "cuda", (1, 1, 16)),  # NVIDIA pads small M/N up to an instruction
)


@dataclass(frozen=True)
class Lowering:
    """What Triton releases [first, last] do on `target` with a dot that passes the frontend but has M or N below
    `below` (16: the smallest MFMA/WMMA/mma tile side). Measured by `gdnlab compile-matrix`."""

    target: str
    first: str
    last: str
    outcome: str  # "matrix": a matrix instruction serves it (natively or padded); "fma": an FMA loop; "error"
    how: str
    prints: str = ""  # a diagnostic the build prints on stderr for such a dot (and still succeeds)
    below: int = 16

    def small(self, d: Dot) -> bool:
        return min(d.M, d.N) < self.below


REPORT_ERROR = "no matching matrix core intrinsic for wmma version 1 with instruction shape [0, 0, 64]"

#: Measured: compile_matrix_releases.csv (data/cpu/RUNS.csv) (hip targets, Triton 3.0-3.8, BV 8..64, 4 warps, 2 stages)
#: and compile_matrix.csv (all targets, the installed Triton). Releases 3.0-3.2 never get here: their tl.dot
#: assertion (FRONTEND_MIN) rejects the BV = 8 dots first. cuda before 3.9 was not measured.
SMALL_DOT_LOWERING: tuple[Lowering, ...] = (
    Lowering("hip:gfx1151", "3.3.0", "3.6.99", "fma",
             "silently: the BV-wide dots become FMA loops on fp32-converted operands; no diagnostic"),
    Lowering("hip:gfx1151", "3.7.0", "3.7.99", "fma",
             "prints the report's error, then builds on: the BV-wide dots become FMA loops", prints=REPORT_ERROR),
    Lowering("hip:gfx1151", "3.8.0", "3.9.99", "matrix",
             "v_wmma_f32_16x16x16_bf16 on a padded tile"),
    Lowering("hip:gfx942", "3.3.0", "3.4.99", "fma",
             "silently: the BV-wide dots become FMA loops on fp32-converted operands; no diagnostic"),
    Lowering("hip:gfx942", "3.5.0", "3.9.99", "matrix", "v_mfma_f32_4x4x4_16b_bf16 (16 blocks as a 64x4 / 4x64 tile)"),
    Lowering("cuda:90", "3.9.0", "3.9.99", "matrix",
             "wgmma m64n8k16 for N = 8; mma.sync m16n8k16 on a padded tile for M = 8"),
)
def _vkey(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("+")[0].split(".")[:3] if x.isdigit())


def _in(v: str, first: str, last: str) -> bool:
    return _vkey(first) <= _vkey(v) <= _vkey(last)


def frontend_min(target: str, triton_version: str) -> tuple[int, int, int] | None:
    """The tl.dot shape assertion of this release for this target (None: release not in the table)."""
    for f in FRONTEND_MIN:
        if target.startswith(f.target) and _in(triton_version, f.first, f.last):
            return f.mnk
    return None


def behaviour(target: str, triton_version: str) -> Lowering | None:
    """How this Triton release lowers small dots on this target, or None if never measured."""
    for b in SMALL_DOT_LOWERING:
        if b.target == target and _in(triton_version, b.first, b.last):
            return b
    return None


def predict(target: str, triton_version: str, BV: int | None, kernel: str, num_warps: int = 4) -> str:
    """The build outcome predicted before compiling: "error" when a dot fails this release's tl.dot assertion, when
    the release is recorded to reject such small dots, or (release never measured) when a dot is below the hardware
    minimum; else "ok"."""
    chk = check_dot_shapes(target, BV, kernel, num_warps)
    fmin = frontend_min(target, triton_version)
    if fmin is not None and any(d.M < fmin[0] or d.N < fmin[1] or d.K < fmin[2] for d in chk.dots):
        return "error"
    b = behaviour(target, triton_version)
    if b is None:
        return "ok" if chk.ok else "error"
    return "error" if b.outcome == "error" and any(b.small(d) for d in chk.dots) else "ok"


def expected_lowering(target: str, triton_version: str, d: Dot, chk: ShapeCheck) -> str:
    """"fma" or "matrix": how a dot of a successful build should be lowered, per the check and the measured data."""
    if d in chk.no_instr:
        return "fma"
    b = behaviour(target, triton_version)
    if b is not None and b.small(d):
        return "fma" if b.outcome == "fma" else "matrix"
    return "matrix"
