"""The public entry point and the registry of backends every experiment runs on.

`chunk_gated_delta_rule(..., backend=NAME)` validates its inputs once and hands them to the named backend. The
built-in backends are the float64 reference, the two-kernel Triton path, the fused kernel as it shipped and as
fixed, "fast" (the lab's fastest configuration of its kernels), flash-linear-attention ("fla") when importable on
CUDA, and "auto" (a rule that picks among them by shape; gdnlab.auto). A user registers their own kernel with
`register_backend(name, fn)`; everything in the lab (cases, sweeps, notebooks, `gdnlab reproduce --backend`) then
runs on it.
"""
from __future__ import annotations

import functools

from typing import Any, Callable

import torch

from gdnlab import reference
from gdnlab.auto import auto_backend
from gdnlab.kernels.fused import FIXED, SHIPPED
from gdnlab.kernels.prologue import SOLVE, SOLVES
from gdnlab.validate import Problem, check_inputs

Backend = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]

_REGISTRY: dict[str, Backend] = {}
#: Names of every backend that can be asked for now (built-in and registered).
BACKENDS: list[str] = []


def register_backend(name: str, fn: Backend, *, overwrite: bool = False) -> None:
    """Make `fn` (same signature as `chunk_gated_delta_rule`, minus `backend`) available under `name`."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"name: must be a non-empty str, got {name!r}")
    if not callable(fn):
        raise TypeError(f"fn: must be callable, got {type(fn).__name__}")
    if name in _REGISTRY and not overwrite:
        raise ValueError(f"name: backend {name!r} is already registered (pass overwrite=True to replace it)")
    _REGISTRY[name] = fn
    if name not in BACKENDS:
        BACKENDS.append(name)


def get_backend(name: str) -> Backend:
    """The callable behind a backend name; ValueError naming the known ones otherwise."""
    if not isinstance(name, str):
        raise TypeError(f"backend: must be a str, got {type(name).__name__}")
    if name not in _REGISTRY:
        raise ValueError(f"backend: unknown backend {name!r}; known: {', '.join(BACKENDS)}")
    return _REGISTRY[name]


def chunk_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                           scale: float | None = None, initial_state: torch.Tensor | None = None,
                           output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
                           cu_seqlens: torch.Tensor | None = None, state_v_first: bool = False,
                           backend: str = "two_kernel", **options: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated DeltaNet prefill (DESIGN.md sections 2 and 6) on the named backend. Returns (o, final state or None).

    Dtypes: the lab's Triton backends take bf16 q, k, v (fp16/fp32 are refused with a TypeError naming q); the
    "reference" backend takes any floating dtype. Unusual but legal values are computed, not refused: g > 0 (the
    state grows), beta outside [0, 1], non-finite inputs (see gdnlab.validate.check_inputs)."""
    fn = get_backend(backend)
    if not getattr(fn, "validates_itself", False):
        check_inputs(q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                     state_v_first=state_v_first, output_final_state=output_final_state,
                     use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
    return fn(q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
              use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens, state_v_first=state_v_first,
              **options)


# ---- built-in backends ----------------------------------------------------------------------------------------

def _reference(q, k, v, g, beta, **kw: Any):
    """The float64 per-token recurrence (it validates its inputs itself)."""
    kw = {n: kw[n] for n in ("scale", "initial_state", "output_final_state", "use_qk_l2norm_in_kernel",
                             "cu_seqlens", "state_v_first")}
    return reference.recurrent_gated_delta_rule_ref(q, k, v, g, beta, **kw)


#: The V tiles the state-carrying kernels take (option BV).
STATE_BVS = (8, 16, 32, 64)


def _triton(path: str, by_size: Callable[[int, int, int], dict[str, Any]] | None = None,
            **defaults: Any) -> Backend:
    """A backend that runs the lab's Triton kernels: `path` is "two_kernel" or "fused". Every path takes the
    prologue's options too: `prologue_warps` (its num_warps) and `fuse_norm` (the q/k l2-norm inside the prologue
    instead of two launches of its own). The two-kernel path also takes `norm_q_in_output` (q's l2-norm inside the
    output kernel: one launch and one pass over q fewer) and `index64` (int64 indices in its kernels; default:
    only where a buffer has 2^31 elements or more). `by_size(programs, walkers, sms)` gives defaults that depend
    on the call: programs = chunks x value heads (the prologue's grid), walkers = the state kernel's programs
    (sequences x value heads x V tiles), sms = the device's multiprocessors. Options
    passed to the call override both."""

    def run(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
            use_qk_l2norm_in_kernel=False, cu_seqlens=None, state_v_first=False, **options: Any):
        from gdnlab.kernels import fused, run_prologue, two_kernel, ChunkPlan, alloc
        p: Problem = check_inputs(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                  cu_seqlens=cu_seqlens, state_v_first=state_v_first,
                                  output_final_state=output_final_state,
                                  use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, dtypes=(torch.bfloat16,))
        plan = ChunkPlan.build(p.seq_bounds, q.device)
        sized = {}
        if by_size:
            walk_bv = {**defaults, **options}.get("BV", 64)
            walkers = p.N * p.HV * -(-p.V // walk_bv) if walk_bv in STATE_BVS else 0  # else refused below
            sized = by_size(plan.n_chunks * p.HV, walkers, multiprocessors(q.device))
        opts = {**defaults, **sized, **options}
        allowed = {"BV", "poison", "num_warps", "num_stages", "prologue_warps", "prologue_solve", "fuse_norm"} | (
            {"downcast", "intra_vnew"} if path == "fused" else {"out_BV", "out_warps", "out_stages",
                                                                 "norm_q_in_output", "index64"})
        unknown = set(opts) - allowed
        if unknown:
            raise TypeError(f"options: {path} backend does not take {sorted(unknown)}; it takes {sorted(allowed)}")
        bv = opts.pop("BV", 64)
        if bv not in STATE_BVS:
            raise ValueError(f"BV: must be one of {', '.join(map(str, STATE_BVS))}, got {bv!r}")
        if opts.get("prologue_solve", SOLVE) not in SOLVES:
            raise ValueError(f"prologue_solve: must be one of {', '.join(SOLVES)}, got {opts['prologue_solve']!r}")
        if opts.get("out_BV") not in (None, 8, 16, 32, 64, 128):
            raise ValueError(f"out_BV: must be one of 8, 16, 32, 64, 128, got {opts['out_BV']!r}")
        poison = bool(opts.pop("poison", False))
        tokens = p.B * p.T

        def flat(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
            return x.reshape(tokens, *x.shape[2:]).to(dtype or x.dtype).contiguous()

        pro_opts = dict(fuse_norm=bool(opts.pop("fuse_norm", False)), num_warps=int(opts.pop("prologue_warps", 4)),
                        solve=opts.pop("prologue_solve", SOLVE),
                        norm_q_in_output=bool(opts.pop("norm_q_in_output", False)), index64=opts.get("index64"))
        vf = flat(v)
        pro = run_prologue(flat(q), flat(k), vf, flat(g, torch.float32), flat(beta), plan, use_qk_l2norm_in_kernel,
                           poison, **pro_opts)
        o = alloc((tokens, p.HV, p.V), q.dtype, q.device, poison)
        ht = None
        if output_final_state:
            shape = (p.N, p.HV, p.V, p.K) if state_v_first else (p.N, p.HV, p.K, p.V)
            ht = alloc(shape, torch.float32, q.device, poison)
        h0 = initial_state.contiguous() if initial_state is not None else None
        if path == "fused":
            fused(pro, vf, o, plan, h0, ht, p.scale, state_v_first, BV=bv, **opts)
        else:
            two_kernel(pro, vf, o, plan, h0, ht, p.scale, state_v_first, BV=bv, poison=poison, **opts)
        end = p.seq_bounds[-1][1] if p.seq_bounds else 0
        if end < tokens:
            o[end:] = 0  # padding rows of a varlen buffer
        return o.view(p.B, p.T, p.HV, p.V), ht

    run.validates_itself = True
    return run


def _fla(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
         use_qk_l2norm_in_kernel=False, cu_seqlens=None, state_v_first=False, **options: Any):
    """flash-linear-attention's chunk_gated_delta_rule, as a peer (CUDA only)."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise RuntimeError("backend 'fla' needs the flash-linear-attention package (pip install fla-core)") from e
    if not q.is_cuda:
        raise ValueError("backend 'fla': flash-linear-attention runs on CUDA tensors only; got CPU tensors")
    h0 = initial_state.transpose(-1, -2).contiguous() if (initial_state is not None and state_v_first) \
        else initial_state
    o, ht = fla_chunk(q, k, v, g, beta, scale=scale, initial_state=h0, output_final_state=output_final_state,
                      cu_seqlens=cu_seqlens.to(q.device, torch.long) if cu_seqlens is not None else None,
                      use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, **options)
    if cu_seqlens is not None and int(cu_seqlens[-1]) < q.shape[1]:
        o[:, int(cu_seqlens[-1]):] = 0
    if ht is not None and state_v_first:
        ht = ht.transpose(-1, -2).contiguous()
    return o, (ht.float() if ht is not None else None)


def fla_available() -> bool:
    """True when flash-linear-attention imports and a CUDA device is present."""
    if not torch.cuda.is_available():
        return False
    try:
        import fla.ops.gated_delta_rule  # noqa: F401
    except Exception:
        return False
    return True


_reference.validates_itself = True
register_backend("reference", _reference)
register_backend("two_kernel", _triton("two_kernel"))
register_backend("fused_shipped", _triton("fused", **SHIPPED))
register_backend("fused_fixed", _triton("fused", **FIXED))
#: "fast": the fastest config of each stage that is bit-equal to the default on the H200 (reports/h200/stages.csv;
#: benchmarks/NOTES.md item 10): the state kernel at BV = 32 (128 programs for 132 SMs), the output kernel at
#: BV = 128 (one program per chunk and head, Q.K^T computed once); the prologue's warps and where q is normalised
#: follow the call's size (fast_by_size).
FAST = dict(BV=32, num_warps=4, out_BV=128, out_warps=4)


def fast_by_size(programs: int, walkers: int, sms: int) -> dict[str, Any]:
    """fast's size-dependent options (benchmarks/NOTES.md items 12 and 17; reports/h200/variants_small.csv and
    variants_depth.csv). With at most two prologue programs per multiprocessor each program's latency is the time,
    and 4 warps hide more of it than 2 (512 tokens: 12% faster); above that 2 warps leave room for more resident
    programs (1024 tokens: 10% faster). Up to four programs per multiprocessor, q's l2-norm inside the output
    kernel saves a launch (2% faster); above that the heavier output kernel costs more than the pass over q it
    saves (1-2% slower). With at most one state-kernel program per multiprocessor the walk's loop is pipelined 4
    stages deep instead of Triton's 3 (2-3% faster for one sequence of 1024-65536 tokens); with more, the deeper
    pipeline's shared memory costs residency (8 x 2048: 7.5% slower, the ragged batch 6%)."""
    opts: dict[str, Any] = dict(prologue_warps=4 if programs <= 2 * sms else 2,
                                norm_q_in_output=programs <= 4 * sms)
    if walkers <= sms:
        opts.update(num_stages=4, out_stages=3)
    return opts


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
if fla_available():
    register_backend("fla", _fla)
register_backend("auto", auto_backend)
