"""The built-in backends, registered with gdnlab.registry when this module is imported.

They are the float64 reference, the two-kernel Triton path, the fused kernel as it shipped and as fixed, "fast" (the
lab's fastest configuration of its kernels) and "auto" (a rule that picks among them by shape; gdnlab.auto); the
field's kernels ("fla", "flashqla", "flashinfer") are registered by gdnlab.peers where they can run. The registry's names are re-exported here, so
`gdnlab.backends.register_backend` and `gdnlab.backends.chunk_gated_delta_rule` keep working.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, Callable

import torch

from gdnlab import peers, plans, reference
from gdnlab.auto import auto_backend
from gdnlab.kernel_params import BT, FIXED, OUT_BVS, OUT_CHUNKS, SHIPPED, STATE_BVS, cdiv
from gdnlab.kernels import pipeline
from gdnlab.kernels.prologue import SOLVE, SOLVES, forms_w_and_u
from gdnlab.registry import UNAVAILABLE, BACKENDS, Backend, chunk_gated_delta_rule, get_backend, register_backend
from gdnlab.validate import Problem

__all__ = ["BACKENDS", "Backend", "chunk_gated_delta_rule", "get_backend", "register_backend", "FAST",
           "fast_by_size", "fast_options", "multiprocessors", "STATE_BVS", "UNAVAILABLE"]


# ---- built-in backends ----------------------------------------------------------------------------------------

def _reference(q, k, v, g, beta, *, poison: bool = False, **kw: Any):
    """The float64 per-token recurrence (it validates its inputs itself). It takes `poison` (its output is computed
    afresh, never pre-filled) and no kernel option."""
    args = ("scale", "initial_state", "output_final_state", "use_qk_l2norm_in_kernel", "cu_seqlens", "state_v_first")
    unknown = sorted(set(kw) - set(args))
    if unknown:
        raise TypeError(f"options: the reference backend takes no kernel options, got {unknown}")
    kw = {n: kw[n] for n in args}
    return reference.recurrent_gated_delta_rule_ref(q, k, v, g, beta, **kw)


def _triton(path: str, by_size: Callable[[int, int, int], dict[str, Any]] | None = None,
            **defaults: Any) -> Backend:
    """A backend that runs the lab's Triton kernels through gdnlab.kernels.pipeline: `path` is "two_kernel" or "fused".
    Every path takes the prologue's options too: `prologue_warps` (its num_warps), `prologue_solve` (how T is
    formed: gdnlab.kernels.prologue.SOLVES), `prologue_programs` and `prologue_stages` (about that many programs
    per value head, each looping over a run of chunks that many stages deep; 0: one program per chunk),
    `prologue_tma` (k, v, W and U through tensor descriptors), `prologue_maxnreg` (its registers per thread capped;
    item 50) and `fuse_norm` (the q/k l2-norm inside the prologue
    instead of two launches of its own). The two-kernel path also takes `norm_q_in_output` (q's l2-norm inside the
    output kernel: one launch and one pass over q fewer), `index64` (int64 indices in its kernels; default: only
    where a buffer has 2^31 elements or more), `fold_norm` (q and k never rounded after normalising: their norms
    are folded into the gates in fp32; docs/speed-notes.md items 27 and 29), `split_wu` (W and U formed from T
    and the raw k and v rows with no operand rounded to bf16; item 29), and `out_programs` and `out_tma` (the
    output kernel looping over runs of chunks, its tiles through tensor descriptors: as the prologue's; item 39),
    and `walk_t` (the prologue stores T instead of W and U, and the state kernel forms V_new = T diag(beta)
    (V - diag(exp(G)) K S) itself: the prologue's two products and their stores traded for one product in the walk;
    item 43), and `out_chunks` (each output program takes that many chunks from the first one's h, and the state
    kernel stores only those h; item 53), and `fused_output` (the state kernel writes the output itself, with the
    output kernel's roundings: no h or V_new in memory, no output kernel, and none of OUTPUT_KERNEL_OPTIONS;
    item 55), and `walk_k_once` (with walk_t, the state kernel loads each chunk's K tiles once, for K S and the
    state update; the same numbers; item 59), and `wu_apart` (the prologue stores T only and a kernel of its own
    forms W and U from it, at `wu_warps` warps, for the walk that takes W and U, fused for batches; the prologue's
    products; item 72), and `walk_ws` (the state kernel that takes W and U reads its tiles through tensor
    descriptors and asks for warp specialisation; the same numbers; item 73), and `split_scores` (the output's
    gated scores enter their product with V_new as two bf16 terms instead of rounded to bf16; other numbers,
    closer to float64 where the state decays within a chunk; item 74).
    `by_size(programs, walkers, sms)` gives defaults that depend on the call: programs = chunks x value heads (the
    prologue's grid), walkers = the state kernel's programs (sequences x value heads x V tiles), sms = the device's
    multiprocessors. Options passed to the call override both."""

    token = object()  # this backend, in gdnlab.plans's keys

    def run(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
            use_qk_l2norm_in_kernel=False, cu_seqlens=None, state_v_first=False, **options: Any):
        x = pipeline.flatten(q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                             state_v_first=state_v_first, output_final_state=output_final_state,
                             use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
        key = plans.key(token, x, options)
        plan = plans.lookup(key)
        if plan is not None:
            return plans.replay(plan, x)
        return plans.record(key, x, lambda: _pipeline(x, use_qk_l2norm_in_kernel, output_final_state, options))

    def _pipeline(x: pipeline.Flat, use_qk_l2norm_in_kernel: bool, output_final_state: bool,
                  options: dict[str, Any]):
        p: Problem = x.problem
        sized = by_size(*_grids(x.plan.n_chunks, p.N, p.HV, p.V, {**defaults, **options}),
                        multiprocessors(x.q.device)) if by_size else {}
        opts = {**defaults, **sized, **options}
        if options.get("out_programs") and "out_stages" not in options:
            opts["out_stages"] = LOOP_OUT_STAGES  # the size rule's depth is the one-program-per-chunk kernel's
        allowed = {"BV", "poison", "num_warps", "num_stages", "prologue_warps", "prologue_solve",
                   "prologue_programs", "prologue_stages", "prologue_tma", "prologue_maxnreg",
                   "fuse_norm"} | (
            {"downcast", "intra_vnew"} if path == "fused" else {"out_BV", "out_warps", "out_stages", "norm_q_in_output",
                                                                 "index64", "fold_norm", "split_wu",
                                                                 "out_programs", "out_tma", "walk_t",
                                                                 "out_chunks", "fused_output", "walk_k_once",
                                                                 "wu_apart", "wu_warps", "walk_ws",
                                                                 "split_scores"})
        unknown = set(opts) - allowed
        if unknown:
            raise TypeError(f"options: this backend (the {path} kernels) does not take {sorted(unknown)}; it takes "
                            f"{sorted(allowed)}")
        opts = _settle_output(opts, options, defaults, sized)
        bv = opts.pop("BV", 64)
        if bv not in STATE_BVS:
            raise ValueError(f"BV: must be one of {', '.join(map(str, STATE_BVS))}, got {bv!r}")
        if opts.get("prologue_solve", SOLVE) not in SOLVES:
            raise ValueError(f"prologue_solve: must be one of {', '.join(SOLVES)}, got {opts['prologue_solve']!r}")
        if opts.get("out_BV") not in (None, *OUT_BVS):
            raise ValueError(f"out_BV: must be one of {', '.join(map(str, OUT_BVS))}, got {opts['out_BV']!r}")
        if type(opts.get("out_chunks", 1)) is not int or opts.get("out_chunks", 1) not in OUT_CHUNKS:
            raise ValueError(f"out_chunks: must be one of {', '.join(map(str, OUT_CHUNKS))}, "
                             f"got {opts['out_chunks']!r}")
        poison = bool(opts.pop("poison", False))
        fold = bool(opts.pop("fold_norm", False))
        placed = options.get("fuse_norm") or options.get("norm_q_in_output")
        if fold and placed and "fold_norm" not in options:
            fold = False  # a norm placement asked for explicitly overrides the default fold (auto's fuse_norm)
        if fold:  # the size rule's norm placement gives way; both asked for explicitly are refused by the prologue
            opts["norm_q_in_output"] = bool(options.get("norm_q_in_output", False))
        pro = pipeline.prologue(x, use_qk_l2norm_in_kernel, poison, fuse_norm=bool(opts.pop("fuse_norm", False)),
                                num_warps=int(opts.pop("prologue_warps", 4)),
                                solve=opts.pop("prologue_solve", SOLVE),
                                norm_q_in_output=bool(opts.pop("norm_q_in_output", False)),
                                index64=opts.get("index64"), fold_norm=fold,
                                split_wu=bool(opts.pop("split_wu", False)),
                                programs=int(opts.pop("prologue_programs", 0)),
                                stages=int(opts.pop("prologue_stages", 2)),
                                tma=bool(opts.pop("prologue_tma", False)),
                                maxnreg=int(opts.pop("prologue_maxnreg", 0)),
                                store_t=bool(opts.pop("walk_t", False)),
                                wu_apart=bool(opts.pop("wu_apart", False)), wu_warps=int(opts.pop("wu_warps", 8)))
        return pipeline.state_and_outputs(x, pro, path, output_final_state=output_final_state,
                                          state_v_first=p.state_v_first, BV=bv, poison=poison, **opts)

    run.validates_itself = True
    return run


_reference.validates_itself = True
register_backend("reference", _reference)
register_backend("two_kernel", _triton("two_kernel"))
register_backend("fused_shipped", _triton("fused", **SHIPPED))
register_backend("fused_fixed", _triton("fused", **FIXED))
#: "fast": the fastest config of each stage that is bit-equal to the default on the H200
#: (data/h200/2026-12-02T2021-stages/stages.csv; docs/speed-notes.md item 10): the state kernel at BV = 32 (128
#: programs for 132 SMs), the output kernel at BV = 128 (one program per chunk and head, Q.K^T computed once); the
#: prologue's warps and where q is normalised follow the call's size (fast_by_size). The l2-norm is folded into the
#: gates (fold_norm), by item 27's rule: as accurate as the most accurate peer at 1024 chunks and no slower than 3%
#: at any bench shape (item 29, data/h200/2026-12-04T1710-check).
FAST = dict(BV=32, num_warps=4, out_BV=128, out_warps=4, fold_norm=True)


def fast_by_size(programs: int, walkers: int, sms: int) -> dict[str, Any]:
    """fast's size-dependent options (docs/speed-notes.md items 12, 17 and 22; the variants runs in data/h200/).
    With at most two prologue programs per multiprocessor each program's latency is the time, and 4 warps hide more
    of it than 2 (512 tokens: 12% faster), and its diagonal blocks are inverted by products ("doubling": fewer
    dependent steps, 4% faster at 512 tokens; item 35); above that 2 warps leave room for more resident programs
    (1024 tokens: 10% faster) and forward substitution is the faster. Both choices round differently from
    two_kernel's prologue (4 warps, "blocks"), so fast is not bit-equal to two_kernel. Up to four programs per
    multiprocessor, q's l2-norm inside the output kernel saves a launch (2% faster); above that the heavier output
    kernel costs more than the pass over q it saves (1-2% slower). With at most one state-kernel program per
    multiprocessor the walk's loop is pipelined 4 stages deep instead of Triton's 3 (2-3% faster for one sequence of
    1024-65536 tokens); with more, the deeper pipeline's shared memory costs residency (8 x 2048: 7.5% slower, the
    ragged batch 6%). With that and more than 32 prologue programs per multiprocessor (on 132 multiprocessors one
    Qwen3-Next sequence of more than 132 chunks, 8448 tokens) the output kernel loops over runs of at least 16
    chunks, about four programs per V tile and value head, its tiles through tensor descriptors (0.97x at
    32768-65536 tokens on the H200, where at 4096-8192 tokens it cost 1.01-1.03x; items 40 and 42). With more
    state-kernel programs than multiprocessors (batches) the state kernel writes the output itself at V tile 64
    (fused_output: no h or V_new in memory, no output kernel; 0.93-0.98x on an H100's three batch shapes in two
    runs, item 55, where output blocks of two chunks had taken 0.95-0.99x, item 54), and its prologue stores T only,
    the walk forming V_new from it (walk_t: a further 0.954-0.968x there, item 56); for one sequence the fusion
    costs 1.27-1.35x and walk_t 1.06-1.12x from 2048 tokens. That fused walk keeps the K tiles it loads for K S for
    the state update (walk_k_once) and is pipelined 2 stages deep, which halves its shared memory so two programs
    share a multiprocessor (0.844-0.943x on the H100's batch shapes, item 59; 3 stages with K once: 1.08-1.13x).
    Its prologue, storing T only, solves the diagonal blocks with register moves where it runs more than two
    programs per multiprocessor ("moves": 0.846-0.877x on the H100's batch shapes, bit-equal, item 61; fewer keep
    "doubling", unmeasured against moves); where a prologue forms W and U, "moves" rounds differently and at 1024
    chunks its error was 1.109x fast's (item 60), so a caller who turns walk_t off gets the default solve back.
    One sequence with more than two and at most eight prologue programs per multiprocessor (1024-2048 tokens at 32
    value heads on 132) takes the same T-only prologue and "moves" with the two-kernel walk forming V_new (walk_t):
    0.907x and 0.955x at 1x1024 and 1x2048 on the H200, mean error at 16 and 32 chunks 0.883x (item 64); shorter
    and longer sequences keep W and U (1.04x at 512 tokens, 1.01-1.04x from 4096)."""
    small = programs <= 2 * sms
    opts: dict[str, Any] = dict(prologue_warps=4 if small else 2, norm_q_in_output=programs <= 4 * sms)
    if small:
        opts["prologue_solve"] = "doubling"
    if walkers <= sms:
        opts.update(num_stages=4, out_stages=3)
        if 2 * sms < programs <= 8 * sms:
            opts.update(walk_t=True, prologue_solve="moves")
        if programs > 32 * sms:
            opts.update(out_programs=4, out_tma=True, out_stages=LOOP_OUT_STAGES)
    else:
        opts.update(fused_output=True, BV=64, walk_t=True, walk_k_once=True, num_stages=2)
        if not small:
            opts["prologue_solve"] = "moves"
    return opts


def _settle_output(opts: dict[str, Any], given: dict[str, Any], defaults: dict[str, Any],
                   sized: dict[str, Any]) -> dict[str, Any]:
    """Merged options `opts` with fused_output and walk_t settled against the options the caller `given`: a caller
    who names an output-kernel option (OUTPUT_KERNEL_OPTIONS) without naming fused_output, or turns it off, gets
    the output kernel and, unless they name them, the default V tile and no walk_t or walk_k_once (a size rule's
    are the fused walk's) where a size rule chose fused_output; naming both is refused; otherwise the output
    kernel's options are dropped. A size rule's walk_t gives way to prologue options the caller names that need W
    and U (forms_w_and_u), and its walk_k_once with it. The size rule's (`sized`) walk depth is kept only for the
    walk it was chosen for (the two-kernel walk's 4 would overflow the fused walk's shared memory; the 2 of the
    fused walk loading K once would cost the others their prefetch), and its solve only for a prologue that stores
    T only (walk_t; the size rule's "moves" was measured there). wu_apart (W and U formed apart from a stored T)
    and walk_t exclude each other: the one the caller names wins over a default's or a size rule's, naming both is
    refused, and wu_warps is refused without wu_apart. walk_ws (the warp-specialised walk of W and U), when on,
    counts as an output-kernel option (a size rule's fused walk gives way to the two-kernel walk), and a size
    rule's walk_t gives way to it; walk_t or walk_k_once named with it are refused."""
    if given.get("wu_warps") is not None and not opts.get("wu_apart"):
        raise ValueError("wu_warps: the warps of wu_kernel, which runs only with wu_apart")
    if opts.get("wu_apart") and opts.get("walk_t"):
        if given.get("wu_apart") and given.get("walk_t"):
            raise ValueError("wu_apart: W and U are formed for the walk that takes them, and walk_t's walk takes "
                             "T; name one of them")
        opts = {**opts, "wu_apart": False} if given.get("walk_t") else {**opts, "walk_t": False}
    if opts.get("walk_t") and "walk_t" not in given and forms_w_and_u(
            split_wu=bool(opts.get("split_wu")), tma=bool(opts.get("prologue_tma")),
            solve=opts.get("prologue_solve", SOLVE)):
        opts = {**opts, "walk_t": False}
    if opts.get("walk_k_once") and not opts.get("walk_t") and "walk_k_once" not in given:
        opts = {**opts, "walk_k_once": False}
    named = sorted(n for n in set(given) & set(OUTPUT_KERNEL_OPTIONS) if n != "walk_ws" or given[n])
    if not opts.get("fused_output") or (named and "fused_output" not in given):
        if "fused_output" in opts:
            opts = {**opts, "fused_output": False, "BV": given.get("BV", defaults.get("BV", 64)),
                    "walk_t": given.get("walk_t", defaults.get("walk_t", False)),
                    "walk_k_once": given.get("walk_k_once", defaults.get("walk_k_once", False))}
    elif named:
        raise ValueError(f"fused_output: the state kernel writes the output; {named} do not apply")
    else:
        opts = {n: v for n, v in opts.items() if n not in OUTPUT_KERNEL_OPTIONS}
    if opts.get("walk_ws") and opts.get("walk_t"):
        if "walk_t" in given:
            raise ValueError("walk_ws: the warp-specialised walk takes W and U, and walk_t's walk takes T; name one "
                             "of them")
        if given.get("walk_k_once"):
            raise ValueError("walk_ws: the warp-specialised walk loads its K tiles itself; walk_k_once is walk_t's")
        opts = {**opts, "walk_t": False, "walk_k_once": False}
    if "num_stages" not in given and _walk_of(opts) != _walk_of(sized):
        opts = {n: v for n, v in opts.items() if n != "num_stages"}
    if "prologue_solve" not in given and sized.get("walk_t") and not opts.get("walk_t"):
        opts = {**opts, "prologue_solve": defaults.get("prologue_solve", SOLVE)}
    return opts


def _walk_of(opts: dict[str, Any]) -> tuple[bool, bool]:
    """Which state-kernel walk these options run, as far as its pipeline depth goes: fused or not, and fused
    loading K once or not."""
    return bool(opts.get("fused_output")), bool(opts.get("fused_output") and opts.get("walk_k_once"))


def _grids(chunks: int, seqs: int, HV: int, V: int, opts: dict[str, Any]) -> tuple[int, int]:
    """(programs, walkers) of a call that by_size rules take: chunks x value heads (the prologue's grid) and
    sequences x value heads x V tiles of the state kernel (0 where its BV is not one it takes: refused later)."""
    walk_bv = opts.get("BV", 64)
    return chunks * HV, (seqs * HV * -(-V // walk_bv) if walk_bv in STATE_BVS else 0)


def fast_options(lengths: Sequence[int], *, HV: int, V: int, sms: int, **options: Any) -> dict[str, Any]:
    """The options a fast call on sequences of these lengths runs with on `sms` multiprocessors: FAST, then
    fast_by_size's, then the caller's `options` (as the backend merges them), so that tools which did not run the
    call (gdnlab.traffic, the in-situ part) can say what it ran (the loop's default depth, set later, aside), with
    fused_output settled as the backend settles it."""
    chunks = sum(cdiv(n, BT) for n in lengths)
    sized = fast_by_size(*_grids(chunks, len(lengths), HV, V, {**FAST, **options}), sms)
    return _settle_output({**FAST, **sized, **options}, options, FAST, sized)


#: The output kernel's options, which a call with fused_output (no output kernel) refuses when given and drops
#: when a size rule sets them; walk_ws among them, as its walk leaves the output to that kernel.
OUTPUT_KERNEL_OPTIONS = ("out_BV", "out_warps", "out_stages", "out_programs", "out_tma", "out_chunks",
                         "norm_q_in_output", "walk_ws")

#: The looping output kernel's pipeline depth where the caller names none: at V tile 128 three stages need more
#: shared memory than a Hopper multiprocessor has (267864 B against 232448; docs/speed-notes.md item 39).
LOOP_OUT_STAGES = 2


#: Multiprocessors assumed off CUDA (the H200 the rule was measured on); the numbers do not depend on it.
NOMINAL_SMS = 132


def multiprocessors(device: torch.device) -> int:
    """The device's streaming multiprocessors (NOMINAL_SMS off CUDA)."""
    if device.type != "cuda":
        return NOMINAL_SMS
    return _sm_count(torch.cuda.current_device() if device.index is None else device.index)


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    """Asked once per device: every eager call needs it and the query costs host time."""
    return torch.cuda.get_device_properties(index).multi_processor_count


register_backend("fast", _triton("two_kernel", by_size=fast_by_size, **FAST))
peers.register_peers()
register_backend("auto", auto_backend)
