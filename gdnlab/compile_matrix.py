"""`gdnlab compile-matrix`: build every lab kernel for Hopper, MI300X and RDNA3.5 without the hardware.

Each build is `triton.compile(ASTSource(...), target=GPUTarget(...))` of one kernel at one autotune config
(BV, num_warps, num_stages) with the problem sizes H=4, HV=8, K=V=128 and exactly the argument types and constexpr
values the lab's wrapper launches it with (`launch_spec` reads them from a recorded call, so they cannot drift from
the kernels). A build records: status (ok / error), the
first line of any error, compiler diagnostics printed on stderr (even when the build succeeds), the matrix
instructions in the generated assembly (PTX for cuda, AMDGCN for hip), how each tl.dot was lowered (read from the
TTGIR layouts: wgmma / mma / mfma / wmma / fma), registers, spills and shared memory, and the compile time.

`--releases 3.2.0,3.3.1,...` builds the shipped fused kernel and the two-kernel output kernel for gfx1151 and gfx942
under older Triton releases, each in a throwaway venv under ~/.cache/gdnlab (never in the repo), to find which
release reproduces the report's "no matching matrix core intrinsic for wmma version 1" failure.

The build worker (`_build`, `--worker`) imports only the standard library and gdnlab's standard-library modules at
module level and adapts to the
Triton API of each release (GPUTarget and ASTSource's signature changed between 3.0, 3.2 and 3.3).
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Iterator

from gdnlab.dot_shapes import (BV_KERNELS, FUSED_FN, KERNEL_BVS, KERNELS, TARGETS, TWO_KERNEL_BUILDS,
                               check_dot_shapes, jit_fn)
from gdnlab.kernel_params import BT, FUSED_VARIANTS, STATE_BVS

ROOT = Path(__file__).resolve().parents[1]
#: The tables' file names; the committed ones are runs of data/cpu/ (RUNS.csv), read through :func:`committed`.
MATRIX, RELEASES = "compile_matrix.csv", "compile_matrix_releases.csv"
CACHE = Path(os.environ.get("GDNLAB_CACHE", Path.home() / ".cache" / "gdnlab"))
#: Where a build writes before it is filed as a run: a stable path, so that --resume and --collect find its checkpoint.
STAGING = CACHE / "out"


def committed(name: str) -> Path:
    """The committed table `name` (MATRIX or RELEASES): the file of the latest CPU run that holds it."""
    from gdnlab import runs
    return runs.path(runs.latest("cpu", has=name), name, "cpu")


def _file(out: Path, kind: str, purpose: str, triton_version: str) -> None:
    """File a finished default build as a run of data/cpu/ (gdnlab.runs.file_run) and say where it went."""
    import torch

    from gdnlab import runs
    rid = runs.file_run("cpu", kind, purpose, [out], dict(device="cpu (no GPU: builds only)", torch=torch.__version__,
                                                          triton=triton_version))
    print(f"filed as data/cpu/{rid}/{out.name} (listed in data/cpu/RUNS.csv)")

#: The shipped fused kernel's autotune space (the BVs of every build but the output kernel's: dot_shapes.KERNEL_BVS).
BVS = STATE_BVS
WARPS = (2, 4)
STAGES = (2, 3, 4)
#: Problem sizes every build uses (the CuteDSL test's head shape); a 64-token chunk is enough to record launches.
SIZES = dict(H=4, HV=8, K=128, V=128)
#: Releases tried by default with --releases all (cp311 manylinux x86_64 wheels exist for each).
DEFAULT_RELEASES = ("3.0.0", "3.1.0", "3.2.0", "3.3.1", "3.4.0", "3.5.1", "3.6.0", "3.7.1", "3.8.0")
RELEASE_KERNELS = ("fused_shipped", "fwd_o")
RELEASE_TARGETS = ("hip:gfx1151", "hip:gfx942")
#: Kernel names of matrices built before the fused variants had one table of names (read by load_matrix).
OLD_KERNEL_NAMES = {"fused_nodowncast": "fused_shipped_no_downcast",
                     "fused_fixed_nodowncast": "fused_fixed_no_downcast"}

#: The compile matrix's columns; a row kept from a run before a column existed has it blank (warp_partitions).
MATRIX_COLUMNS = ["target", "kernel", "BV", "num_warps", "num_stages", "status", "error", "diagnostic",
                  "matrix_instr", "dots", "fma_dots", "static_check", "regs", "spills", "shared", "compile_s",
                  "triton_version", "kernels_sha", "warp_partitions"]
RELEASE_COLUMNS = ["release", "target", "kernel", "BV", "num_warps", "num_stages", "status", "error", "diagnostic",
                   "matrix_instr", "dots", "fma_dots", "static_check", "linked", "compile_s"]

#: Triton's names for the argument types the wrappers pass.
_TYPES = {"torch.bfloat16": "*bf16", "torch.float16": "*fp16", "torch.float32": "*fp32", "torch.int32": "*i32",
          "torch.int64": "*i64"}


@dataclass(frozen=True)
class LaunchSpec:
    """What a build compiles: the jit function, the type of each runtime argument and the value of each constexpr,
    exactly as the lab's wrapper launches it."""

    fn: Any
    signature: dict[str, str]
    constexprs: dict[str, Any]


def _arg_type(value: Any) -> str:
    import torch
    if isinstance(value, torch.Tensor):
        return _TYPES[str(value.dtype)]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"a runtime argument of type {type(value).__name__} has no Triton type here")
    return "fp32" if isinstance(value, float) else "i32"


@functools.lru_cache(maxsize=None)
def launch_spec(kernel: str, BV: int | None) -> LaunchSpec:
    """The arguments the lab's wrapper passes to `kernel` (a name of KERNELS) at BV (None: a BV-free kernel), read
    from a recorded call of the public entry point on CPU tensors of SIZES (with an initial state, the final state
    stored, q/k l2-normalised): nothing is run, and nothing is restated here that the kernels or wrappers say. The
    call's backend, options and the jit function read from it are the fused variant's (FUSED_VARIANTS) or the
    two-kernel build's (TWO_KERNEL_BUILDS); BV goes to the option that sets this kernel's V tile (the output
    kernel's is out_BV, which takes 128 where the state kernel's BV stops at 64; the other kernels are then launched
    at their default)."""
    fused = FUSED_VARIANTS.get(kernel)
    build = None if fused else TWO_KERNEL_BUILDS[kernel]
    backend, opts = ("fused_shipped", dict(fused.options)) if fused else ("two_kernel", dict(build.options))
    if BV is not None:
        if BV not in KERNEL_BVS[kernel]:
            raise ValueError(f"BV: {kernel} takes one of {', '.join(map(str, KERNEL_BVS[kernel]))}, got {BV!r}")
        opts["BV" if fused else build.bv_option] = BV
    spec = spec_of(recorded_launch(backend, jit_fn(kernel), **opts))
    if BV is not None and spec.constexprs.get("BV") != BV:
        raise AssertionError(f"{kernel}: the recorded launch has BV={spec.constexprs.get('BV')!r}, not {BV}")
    return spec


def recorded_launch(backend: str, fn_name: str, **options: Any) -> Any:
    """The first launch of the jit function `fn_name` in one call of `backend` with `options` on CPU tensors of
    SIZES (one chunk, an initial state, the final state stored, q/k l2-normalised), recorded, not run
    (gdnlab.interp.recorded_launches)."""
    import torch

    import gdnlab
    from gdnlab.inputs import make_inputs
    from gdnlab.interp import recorded_launches

    inp = make_inputs(B=1, T=BT, **SIZES, seed=0, dtype=torch.bfloat16, state_dtype=torch.float32,
                      use_qk_l2norm=True)
    with recorded_launches() as got:
        gdnlab.chunk_gated_delta_rule(**inp.kwargs(), backend=backend, **options)
    call = next((c for c in got if c.kernel.__name__ == fn_name), None)
    if call is None:
        raise ValueError(f"kernel: {backend} launches no {fn_name!r} "
                         f"(it launches {', '.join(dict.fromkeys(c.kernel.__name__ for c in got))})")
    return call


def spec_of(call: Any) -> LaunchSpec:
    """A launch recorded by gdnlab.interp.recorded_launches as what a build compiles: the type of each runtime
    argument and every constexpr, those the wrapper leaves at their defaults included (launch options such as
    num_warps are not constexprs and are left out)."""
    from gdnlab.handles import LAUNCH_OPTIONS
    params = list(call.kernel.params)
    signature = {p.name: _arg_type(a) for p, a in zip(params, call.args)}
    cx = {k: v for k, v in call.kwargs.items() if k not in LAUNCH_OPTIONS}
    for p in params:
        if p.is_constexpr and p.name not in cx and p.name not in signature:
            cx[p.name] = p.default
    return LaunchSpec(call.kernel, signature, cx)


def jobs(quick: bool = False, kernels: tuple[str, ...] = KERNELS, targets: tuple[str, ...] = tuple(TARGETS),
         bvs: tuple[int, ...] | None = None, warps: tuple[int, ...] = WARPS,
         stages: tuple[int, ...] = STAGES) -> list[dict[str, Any]]:
    """Every (target, kernel, BV, num_warps, num_stages) build; BV-free kernels once per warps/stages, the others at
    every V tile they take (dot_shapes.KERNEL_BVS: the output kernels at OUT_BVS, the rest at STATE_BVS), or only
    at those of `bvs` when given.
    `quick`: fused_shipped and fwd_o at BV 8 and 64, 4 warps, 2 stages, on every target."""
    if quick:
        kernels, bvs, warps, stages = ("fused_shipped", "fwd_o"), (8, 64), (4,), (2,)
    out = []
    for t in targets:
        for k in kernels:
            own = KERNEL_BVS[k]
            for bv in ((None,) if k not in BV_KERNELS else own if bvs is None else tuple(b for b in own if b in bvs)):
                for w in warps:
                    for s in stages:
                        out.append(dict(target=t, kernel=k, BV=bv, num_warps=w, num_stages=s))
    return out


# ---- the build worker (runs under any Triton 3.x) -------------------------------------------------------------

@contextlib.contextmanager
def _capture_fds(fds: tuple[int, ...] = (1, 2)) -> Iterator[list[str]]:
    """Capture file descriptors (MLIR/LLVM print diagnostics on 2; Triton prints the ptxas log on 1) into the
    yielded list, line by line."""
    out: list[str] = []
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in fds}
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        for fd in fds:
            os.dup2(tmp.fileno(), fd)
        try:
            yield out
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, dup in saved.items():
                os.dup2(dup, fd)
                os.close(dup)
            tmp.seek(0)
            out.extend(tmp.read().decode("utf-8", "replace").splitlines())


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def _gpu_target(name: str) -> Any:
    from triton.backends.compiler import GPUTarget
    backend, arch, warp = TARGETS[name]
    return GPUTarget(backend, arch, warp)


def _ast_source(fn: Any, args: dict[str, str], cx: dict[str, Any]) -> Any:
    """ASTSource for the installed Triton: 3.3+ (constexprs=, name keys), 3.2 (constants=, name keys) or
    3.0/3.1 (constants=, argument-index keys, signature without constexprs).

    From 3.3 every pointer argument is marked 16-byte aligned (tt.divisibility 16), as Triton's JIT marks a launch
    whose tensors start so (every torch allocation does): without it the compiler cannot widen loads and stores,
    and the registers, spills and instructions of a build are not those of the kernel that runs (speed notes item
    49). Integer arguments stay unmarked: their divisibility depends on the call. Older releases take attributes in
    other forms and are built without them (the release sweep records only whether a build succeeds)."""
    import triton
    from triton.compiler import ASTSource
    v = _version_key(triton.__version__)
    names = list(fn.arg_names)
    if v >= (3, 3):
        sig = {n: args.get(n, "constexpr") for n in names}
        aligned = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if str(sig[n]).startswith("*")}
        return ASTSource(fn=fn, signature=sig, constexprs=cx, attrs=aligned)
    if v >= (3, 2):
        sig = {n: args.get(n, "constexpr") for n in names}
        return ASTSource(fn=fn, signature=sig, constants=cx)
    sig = {i: args[n] for i, n in enumerate(names) if n in args}
    return ASTSource(fn=fn, signature=sig, constants={names.index(n): val for n, val in cx.items()})


def _find_lld() -> str | None:
    """An ld.lld for the Triton releases that link HSACO with an external linker (newest LLVM first)."""
    cands = sorted(Path("/usr/lib").glob("llvm-*/bin/ld.lld"), key=lambda p: _version_key(p.parts[-3]),
                   reverse=True)
    found = [str(c) for c in cands] + [p for p in (shutil.which("ld.lld"), "/opt/rocm/llvm/bin/ld.lld") if p]
    return next((p for p in found if Path(p).is_file()), None)


_LINK_NOTE: list[str] = []


def _guard_hip_link() -> None:
    """Let a HIP build stop before linking when no linker can be had: the AMDGCN text is what we read."""
    try:  # the class triton.compile uses: backends are loaded as separate module instances
        from triton.backends import backends
        HIPBackend = backends["amd"].compiler
    except Exception:
        return
    if getattr(HIPBackend.make_hsaco, "_gdnlab", False):
        return
    orig = HIPBackend.make_hsaco
    find = getattr(HIPBackend, "path_to_rocm_lld", None)  # 3.0-3.4 look for ld.lld (also in hash())
    if find is not None:
        def path_to_rocm_lld():
            try:
                return find()
            except Exception:  # no linker here: a stub that answers --version and refuses to link
                stub = Path(tempfile.gettempdir()) / "gdnlab-no-ld.lld"
                if not stub.exists():
                    stub.write_text('#!/bin/sh\n[ "$1" = "--version" ] && { echo "gdnlab stub, no ld.lld"; exit 0; }\n'
                                    'echo "no ld.lld on this machine" >&2; exit 1\n')
                    stub.chmod(0o755)
                return stub

        HIPBackend.path_to_rocm_lld = staticmethod(path_to_rocm_lld)

    def make_hsaco(src, metadata, options):
        try:
            return orig(src, metadata, options)
        except Exception as e:  # missing or too old ld.lld: keep the amdgcn, record that it was not linked
            _LINK_NOTE.append(f"not linked: {type(e).__name__}: {_first_line(str(e))}")
            return b""

    make_hsaco._gdnlab = True  # type: ignore[attr-defined]
    HIPBackend.make_hsaco = staticmethod(make_hsaco)


def _first_line(s: str) -> str:
    return next((ln.strip() for ln in s.splitlines() if ln.strip()), "")


def _error_line(exc: BaseException, stderr: list[str]) -> str:
    """The most telling first line: an MLIR 'error:' diagnostic if one was printed, else the innermost cause."""
    diag = [ln for ln in stderr if "error:" in ln]
    if diag:
        return diag[0].split("error:", 1)[1].strip()
    inner = exc
    while inner.__cause__ is not None or (inner.__context__ is not None and not inner.__suppress_context__):
        inner = inner.__cause__ or inner.__context__  # type: ignore[assignment]
    msg = str(inner)
    lines = [ln.strip() for ln in msg.splitlines() if ln.strip()]
    # Triton's CompilationError starts with "at L:C:" and the source; its last line is the message.
    text = lines[-1] if lines and lines[0].startswith("at ") else (lines[0] if lines else "")
    return f"{type(inner).__name__}: {text}"[:300]


_PTX_INSTR = re.compile(r"\b(wgmma\.mma_async[\w.]*|mma\.sync\.aligned[\w.]*)")
_AMD_INSTR = re.compile(r"\b(v_mfma_\w+|v_wmma_\w+|v_swmmac_\w+)")


def matrix_instructions(asm: dict[str, Any]) -> str:
    """The distinct matrix instructions in PTX ('wgmma.m64n8k16.bf16', 'mma.m16n8k16.bf16') or AMDGCN
    ('v_mfma_*', 'v_wmma_*'), ';'-joined, or 'none' (every dot became an FMA loop)."""
    found: set[str] = set()
    ptx = asm.get("ptx")
    if isinstance(ptx, str):
        for m in _PTX_INSTR.findall(ptx):
            shape = re.search(r"\.(m\d+n\d+k\d+)\.", m)
            kind = "wgmma" if m.startswith("wgmma") else "mma"
            dtype = "bf16" if ".bf16" in m else ("tf32" if ".tf32" in m else ("f16" if ".f16" in m else "?"))
            found.add(f"{kind}.{shape.group(1) if shape else '?'}.{dtype}")
    gcn = asm.get("amdgcn")
    if isinstance(gcn, str):
        found.update(_AMD_INSTR.findall(gcn))
    return ";".join(sorted(found)) if found else "none"


#: A dot's operands and result in the TTGIR; a batched dot (3-d operands) has a leading batch dim, skipped here.
_MEMDESC = r"(?:tensor|!ttg\.memdesc|!tt\.memdesc|!triton_gpu\.memdesc)"
_DOT = re.compile(r"(?:tt\.dot|ttng\.warp_group_dot|triton_nvidia_gpu\.warp_group_dot)\s+[^\n]*?:\s*"
                  + _MEMDESC + r"<(?:\d+x)?(\d+)x(\d+)x([a-z]\w*)[^\n]*?\*\s*"
                  + _MEMDESC + r"<(?:\d+x)?(\d+)x(\d+)x[a-z]\w*[^\n]*?->\s*"
                  r"tensor<(?:\d+x)?\d+x\d+x[a-z]\w*,\s*#(\w+)>")


def dot_lowering(ttgir: str) -> tuple[str, int]:
    """From the TTGIR: each distinct dot 'MxNxK dtype:kind' (kind = wgmma, mma, mfma, wmma or fma; a batched dot
    by the shape of each of its products) and how many of the distinct dots were left to FMA."""
    layouts: dict[str, str] = {}
    for name, body in re.findall(r"^#(\w+)\s*=\s*#([\w.]+)<", ttgir, re.M):
        b = body.split(".")[-1]
        kind = {"amd_mfma": "mfma", "amd_wmma": "wmma", "blocked": "fma"}.get(b, b)
        if b in ("nvidia_mma", "mma"):
            major = re.search(rf"^#{name}\s*=.*?versionMajor\s*=\s*(\d+)", ttgir, re.M)
            kind = "wgmma" if major and major.group(1) == "3" else "mma"
        layouts[name] = kind
    seen: set[str] = set()
    for m, k, dt, k2, n, enc in _DOT.findall(ttgir):
        seen.add(f"{m}x{n}x{k} {dt}:{layouts.get(enc, enc)}")
    fma = sum(1 for s in seen if s.endswith(":fma"))
    return ";".join(sorted(seen)), fma


def _ptxas_log_resources(log: str) -> tuple[str, str] | None:
    regs = re.search(r"Used (\d+) registers", log)
    st = re.search(r"(\d+) bytes spill stores", log)
    if regs is None or st is None:
        return None
    ld = re.search(r"(\d+) bytes spill loads", log)
    return regs.group(1), str(int(st.group(1)) + int(ld.group(1) if ld else 0))


def nvidia_bin() -> Path:
    """The folder of the NVIDIA tools the installed Triton ships (ptxas, nvdisasm, ...)."""
    import triton
    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


def _nvidia_resources(ptx: str) -> tuple[str, str]:
    """(registers, spill bytes) from ptxas -v on the PTX, with the ptxas Triton ships."""
    bins = nvidia_bin()
    arch = re.search(r"^\.target\s+(\w+)", ptx, re.M)
    log = ""
    # Releases ship one or two ptxas builds; use the first that accepts this PTX version.
    for ptxas in sorted(bins.glob("ptxas*"), key=lambda p: p.name != "ptxas"):
        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / "k.ptx"
            p.write_text(ptx)
            r = subprocess.run([str(ptxas), "-v", f"--gpu-name={arch.group(1) if arch else 'sm_90a'}", str(p),
                                "-o", str(Path(d) / "k.cubin")], capture_output=True, text=True)
        log = r.stdout + r.stderr
        if r.returncode == 0:
            break
    regs = re.search(r"Used (\d+) registers", log)
    st = re.search(r"(\d+) bytes spill stores", log)
    ld = re.search(r"(\d+) bytes spill loads", log)
    spills = "" if st is None else str(int(st.group(1)) + int(ld.group(1) if ld else 0))
    return (regs.group(1) if regs else ""), spills


def _amd_resources(gcn: str) -> tuple[str, str]:
    """('vgpr/sgpr[/agpr]', 'vgpr_spills/sgpr_spills') from the AMDGCN metadata."""
    def get(key: str) -> str:
        m = re.search(rf"\.{key}:\s*(\d+)", gcn)
        return m.group(1) if m else "?"
    agpr = re.search(r"\.agpr_count:\s*(\d+)", gcn)
    regs = f"v{get('vgpr_count')}/s{get('sgpr_count')}" + (f"/a{agpr.group(1)}" if agpr else "")
    return regs, f"v{get('vgpr_spill_count')}/s{get('sgpr_spill_count')}"


def _build(job: dict[str, Any]) -> dict[str, Any]:
    """Compile one job; never raises: failures are recorded in the row."""
    row: dict[str, Any] = dict(job, status="error", error="", diagnostic="", matrix_instr="", dots="",
                               fma_dots="", regs="", spills="", shared="", linked="", compile_s="")
    t0 = time.perf_counter()
    stderr: list[str] = []
    try:
        import triton
        row["triton_version"] = triton.__version__
        spec = launch_spec(job["kernel"], job["BV"])
        target = _gpu_target(job["target"])
        if job["target"].startswith("hip"):
            _guard_hip_link()
        _LINK_NOTE.clear()
        with _capture_fds() as stderr:
            src = _ast_source(spec.fn, spec.signature, spec.constexprs)
            k = triton.compile(src, target=target,
                               options=dict(num_warps=job["num_warps"], num_stages=job["num_stages"]))
        asm = k.asm
        row["status"] = "ok"
        row["matrix_instr"] = matrix_instructions(asm)
        if isinstance(asm.get("ttgir"), str):
            row["dots"], row["fma_dots"] = dot_lowering(asm["ttgir"])
            row["warp_partitions"] = warp_partitions(asm["ttgir"])
        row["shared"] = getattr(k.metadata, "shared", "")
        if isinstance(asm.get("ptx"), str):
            # Triton ran ptxas -v itself; TRITON_DUMP_PTXAS_LOG made it print the log (captured above).
            got = _ptxas_log_resources("\n".join(stderr))
            row["regs"], row["spills"] = got if got else _nvidia_resources(asm["ptx"])
        elif isinstance(asm.get("amdgcn"), str):
            row["regs"], row["spills"] = _amd_resources(asm["amdgcn"])
            row["linked"] = "no" if _LINK_NOTE else "yes"
            if _LINK_NOTE:
                row["error"] = _LINK_NOTE[0]
    except BaseException as e:  # noqa: BLE001 - every failure is data
        if isinstance(e, KeyboardInterrupt):
            raise
        row["error"] = _error_line(e, stderr)
    diags = [ln.strip() for ln in stderr if re.search(r"\b(error|warning|remark):", ln)]
    if diags:
        row["diagnostic"] = re.sub(r"^.*?\b(error|warning|remark):\s*", r"\1: ", diags[0])[:300]
    row["compile_s"] = round(time.perf_counter() - t0, 2)
    return row


def warp_partitions(ttgir: str) -> int:
    """How many warp-specialised partitions a build's TTGIR runs beside its default warps (0: no loop was
    warp-specialised; a `tl.range(..., warp_specialize=True)` that the pass leaves alone also gives 0)."""
    return len(re.findall(r"^\s*partition\d+\(", ttgir, re.M))


def _init_worker(cache_dir: str) -> None:
    os.environ["TRITON_CACHE_DIR"] = cache_dir
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # 3.9's default, stated (silences its warning)
    os.environ["TRITON_DUMP_PTXAS_LOG"] = "1"  # registers and spills without a second ptxas run


def run_jobs(job_list: list[dict[str, Any]], workers: int = 2, progress: bool = True, desc: str = "compile",
             checkpoint: Path | None = None) -> list[dict[str, Any]]:
    """Build the jobs in a process pool (fresh Triton cache, so every build really compiles and prints its
    diagnostics); results in job order. With `checkpoint`, each finished row is appended there as a JSON line, and
    jobs already in it are not built again (a long run can be resumed)."""
    from concurrent.futures import ProcessPoolExecutor, as_completed
    import multiprocessing as mp
    done: dict[str, dict[str, Any]] = {}
    if checkpoint is not None and checkpoint.exists():
        for line in checkpoint.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                done[_job_key(r)] = r
    todo = [j for j in job_list if _job_key(j) not in done]
    cache = tempfile.mkdtemp(prefix="gdnlab-triton-cache-")
    bar = None
    if progress:
        try:
            from tqdm.auto import tqdm
            bar = tqdm(total=len(job_list), initial=len(job_list) - len(todo), desc=desc, unit="build")
        except ImportError:
            bar = None
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"), initializer=_init_worker,
                                 initargs=(cache,)) as ex:
            futs = [ex.submit(_build, j) for j in todo]
            for f in as_completed(futs):
                r = f.result()
                done[_job_key(r)] = r
                if checkpoint is not None:
                    with open(checkpoint, "a") as fh:
                        fh.write(json.dumps(r) + "\n")
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        shutil.rmtree(cache, ignore_errors=True)
    return [done[_job_key(j)] for j in job_list if _job_key(j) in done]


def _checkpoint_path(out: Path) -> Path:
    """Where an interrupted run of `out` keeps its finished builds (outside the repository)."""
    return CACHE / "checkpoints" / (hashlib.sha256(str(out.resolve()).encode()).hexdigest()[:8] + "-" + out.stem
                                    + ".partial.jsonl")


def _job_key(j: dict[str, Any]) -> str:
    return f"{j['target']}|{j['kernel']}|{j['BV']}|{j['num_warps']}|{j['num_stages']}"


#: Build order by jit function, after the shipped fused kernel: the costliest (the prologue: FMA-loop ieee dots) last.
_FN_ORDER = ("fwd_o_kernel", "fwd_h_kernel", FUSED_FN, "l2norm_kernel", "log_norm_kernel", "wu_kernel",
             "prologue_kernel")


def _priority(j: dict[str, Any]) -> tuple:
    """Build order: the shipped fused kernel first, then by jit function (_FN_ORDER), the costliest last."""
    k = j["kernel"]
    return (k != "fused_shipped", _FN_ORDER.index(jit_fn(k)), KERNELS.index(k), j["num_stages"], j["num_warps"],
            j["BV"] or 0, j["target"])


def kernels_sha() -> str:
    """A short hash of the kernel sources the matrix was built from."""
    h = hashlib.sha256()
    for p in sorted((ROOT / "gdnlab" / "kernels").glob("*.py")):
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


def _static(row: dict[str, Any]) -> str:
    return check_dot_shapes(row["target"], row["BV"], row["kernel"], row["num_warps"]).summary()


def _write(rows: list[dict[str, Any]], path: Path, columns: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({c: ("" if r.get(c) is None else r.get(c)) for c in columns})


def summarize(rows: list[dict[str, Any]], kernel: str = "fused_shipped") -> str:
    """A text pivot: target x BV -> status and matrix instructions of `kernel` (all warps/stages folded)."""
    cells: dict[tuple[str, Any], set[str]] = {}
    for r in rows:
        if r["kernel"] != kernel:
            continue
        val = r["matrix_instr"] if r["status"] == "ok" else "ERROR: " + str(r["error"])[:60]
        cells.setdefault((r["target"], r["BV"]), set()).add(val)
    lines = [f"{kernel}:"]
    for (t, bv), vals in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        lines.append(f"  {t:12s} BV={bv!s:>4}: {' | '.join(sorted(vals))}")
    return "\n".join(lines)


# ---- older releases, each in a throwaway venv -----------------------------------------------------------------

def release_venv(version: str, log: list[str]) -> Path:
    """A venv with triton==version that also sees this environment's packages (torch, numpy) after its own."""
    import sysconfig
    venv = CACHE / "venvs" / f"triton-{version}"
    py = venv / "bin" / "python"
    stamp = venv / ".gdnlab-ok"
    if stamp.exists():
        return py
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    wheels = CACHE / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip"]
    subprocess.run(pip + ["download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(wheels),
                          f"triton=={version}"], check=True)
    site = Path(subprocess.run([str(py), "-c", "import sysconfig;print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    subprocess.run(pip + ["install", "-q", "--no-deps", "--no-index", "--find-links", str(wheels),
                          "--target", str(site), f"triton=={version}"], check=True)
    # Appended after the venv's own site-packages: torch and numpy come from here, triton from the venv.
    (site / "zz_gdnlab_parent.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    stamp.write_text(version)
    log.append(f"created {venv}")
    return py


def run_release(version: str, job_list: list[dict[str, Any]], workers: int = 2) -> list[dict[str, Any]]:
    """Build `job_list` under Triton `version` in its throwaway venv; a failure to set up is recorded per job."""
    log: list[str] = []
    try:
        py = release_venv(version, log)
    except Exception as e:  # noqa: BLE001
        return [dict(j, release=version, status="error", error=f"venv setup failed: {_first_line(str(e))}")
                for j in job_list]
    with tempfile.TemporaryDirectory() as d:
        jin, jout = Path(d) / "jobs.json", Path(d) / "rows.json"
        jin.write_text(json.dumps(job_list))
        env = dict(os.environ, PYTHONPATH=str(ROOT), TRITON_CACHE_DIR=str(Path(d) / "cache"))
        lld = _find_lld()
        if lld:
            env["TRITON_HIP_LLD_PATH"] = lld
        r = subprocess.run([str(py), "-m", "gdnlab.compile_matrix", "--worker", str(jin), str(jout),
                            "--workers", str(workers)], env=env, capture_output=True, text=True)
        if r.returncode != 0 or not jout.exists():
            msg = _first_line((r.stderr or r.stdout).strip().splitlines()[-1] if (r.stderr or r.stdout) else "")
            return [dict(j, release=version, status="error", error=f"driver failed: {msg}") for j in job_list]
        rows = json.loads(jout.read_text())
    for row in rows:
        row["release"] = version
    return rows


def _worker_main(jin: str, jout: str, workers: int) -> int:
    """Inside a release venv: build the jobs of `jin`, write the rows to `jout` (no tqdm, no pandas needed)."""
    from gdnlab import compile_matrix as cm  # so the pool pickles gdnlab.compile_matrix._build, not __main__'s

    job_list = json.loads(Path(jin).read_text())
    rows = cm.run_jobs(job_list, workers=workers, progress=False)
    Path(jout).write_text(json.dumps(rows))
    return 0


# ---- tables for the notebook (pandas) --------------------------------------------------------------------------

def load_matrix(path: str | Path | None = None) -> "Any":
    """The compile matrix as a DataFrame (BV as a nullable int)."""
    import pandas as pd
    df = pd.read_csv(path or committed(MATRIX), keep_default_na=False, dtype=str)
    return _typed(df)


def load_releases(path: str | Path | None = None) -> "Any":
    """The release sweep as a DataFrame."""
    import pandas as pd
    df = pd.read_csv(path or committed(RELEASES), keep_default_na=False, dtype=str)
    return _typed(df)


def _typed(df: "Any") -> "Any":
    import pandas as pd
    df["kernel"] = df["kernel"].replace(OLD_KERNEL_NAMES)
    df["BV"] = pd.to_numeric(df["BV"].replace("", None)).astype("Int64")
    for c in ("num_warps", "num_stages"):
        df[c] = df[c].astype(int)
    return df


def _cell(r: "Any") -> str:
    if r["status"] != "ok":
        return "ERROR: " + str(r["error"])[:90]
    fma = f" (+{r['fma_dots']} FMA dot)" if str(r.get("fma_dots", "0")) not in ("", "0") else ""
    diag = f" [prints {r['diagnostic'][:70]}…]" if r.get("diagnostic") else ""
    return str(r["matrix_instr"]) + fma + diag


def verdict(r: "Any") -> str:
    """One word for a build, for a ROCm engineer: REJECTED (the build fails), FMA (a dot that has a matrix
    instruction type on this target was left to an FMA loop: silent numerics change), FMA+ERRMSG (same, with an
    'error:' printed while the build still succeeds), or MATRIX (every such dot on a matrix instruction)."""
    if r["status"] != "ok":
        return "REJECTED"
    bv = None if str(r["BV"]) in ("", "<NA>", "None") else int(r["BV"])
    chk = check_dot_shapes(r["target"], bv, r["kernel"], int(r["num_warps"]))
    fma = sum(1 for x in str(r["dots"]).split(";") if x.endswith(":fma"))
    if fma > len(chk.no_instr):
        return "FMA+ERRMSG" if str(r.get("diagnostic", "")).startswith("error") else "FMA"
    return "MATRIX"


def legality_pivot(df: "Any", kernel: str = "fused_shipped", by: "Any" = "target") -> "Any":
    """`by` x BV -> the verdicts of every build of `kernel` (distinct over warps/stages)."""
    d = df[df["kernel"] == kernel].copy()
    d["verdict"] = d.apply(verdict, axis=1)
    return d.pivot_table(index=by, columns="BV", values="verdict", aggfunc=lambda x: "/".join(sorted(set(x))))


def instr_pivot(df: "Any", kernel: str = "fused_shipped", by: str = "target") -> "Any":
    """`by` x BV -> what every build of `kernel` did (distinct outcomes over warps/stages, ' | '-joined)."""
    d = df[df["kernel"] == kernel].copy()
    d["cell"] = d.apply(_cell, axis=1)
    return d.pivot_table(index=by, columns="BV", values="cell", aggfunc=lambda x: " | ".join(sorted(set(x))))


def status_pivot(df: "Any") -> "Any":
    """kernel x (target, BV) -> 'ok builds / builds'."""
    d = df.copy()
    d["BV"] = d["BV"].astype("string").fillna("-")
    g = d.groupby(["kernel", "target", "BV"])["status"].agg(lambda s: f"{(s == 'ok').sum()}/{len(s)}")
    out = g.unstack(["target", "BV"]).fillna("")
    cols = sorted(out.columns, key=lambda c: (c[0], -1 if c[1] == "-" else int(c[1])))
    return out[cols]


def fma_fallbacks(df: "Any") -> "Any":
    """Builds where a dot became an FMA loop (silently different numerics): which dots, on which target."""
    d = df[(df["status"] == "ok") & (df["fma_dots"].astype(str).str.strip().isin(["", "0"]) == False)].copy()  # noqa
    d["fma"] = d["dots"].map(lambda s: ";".join(x for x in s.split(";") if x.endswith(":fma")))
    return d.groupby(["target", "kernel", "fma"])["BV"].agg(
        lambda b: ",".join(sorted({str(x) for x in b}))).reset_index()


def resources_pivot(df: "Any", kernel: str = "fused_shipped", num_stages: int = 2) -> "Any":
    """(target, num_warps) x BV -> 'regs | spills | shared bytes' for one kernel."""
    d = df[(df["kernel"] == kernel) & (df["num_stages"] == num_stages) & (df["status"] == "ok")].copy()
    d["cell"] = d["regs"].astype(str) + " | spill " + d["spills"].astype(str) + " | smem " + d["shared"].astype(str)
    return d.pivot_table(index=["target", "num_warps"], columns="BV", values="cell", aggfunc="first")


def static_disagreements(df: "Any", version_col: str = "triton_version") -> "Any":
    """Rows where the static check's prediction (gdnlab.dot_shapes.predict) differs from the recorded status."""
    from gdnlab.dot_shapes import predict
    d = df.copy()
    d["predicted"] = [predict(r["target"], r[version_col], None if r["BV"] is None or str(r["BV"]) == "<NA>"
                              else int(r["BV"]), r["kernel"], int(r["num_warps"])) for _, r in d.iterrows()]
    return d[d["predicted"] != d["status"]]


def report_error_rows(rel: "Any") -> "Any":
    """Release-sweep rows whose error or diagnostic is the report's 'no matching matrix core intrinsic'."""
    pat = "no matching matrix core intrinsic"
    m = rel["error"].str.contains(pat, regex=False) | rel["diagnostic"].str.contains(pat, regex=False)
    return rel[m]


# ---- CLI ------------------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    """`gdnlab compile-matrix [--quick] [--releases V1,V2|all] [--out CSV] [--workers N]`."""
    ap = argparse.ArgumentParser(prog="gdnlab compile-matrix", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a 12-build subset (fused_shipped, fwd_o; BV 8, 64)")
    ap.add_argument("--releases", default=None,
                    help="comma-separated Triton releases (or 'all') to sweep in throwaway venvs")
    ap.add_argument("--out", default=None, help="CSV to write (default: a new run of data/cpu/, RUNS.csv; "
                                                "--quick writes nothing unless given)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--resume", action="store_true",
                    help="keep the builds of an interrupted run (checkpointed under ~/.cache/gdnlab) and build the rest")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--collect", action="store_true",
                    help="write the CSV from an interrupted run's checkpoint without building")
    ap.add_argument("--kernels", default=None, metavar="K1,K2",
                    help="rebuild only these kernels' rows and merge them into the existing CSV")
    ap.add_argument("--worker", nargs=2, metavar=("JOBS_JSON", "ROWS_JSON"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        return _worker_main(a.worker[0], a.worker[1], a.workers)

    if a.releases:
        versions = DEFAULT_RELEASES if a.releases == "all" else tuple(v.strip() for v in a.releases.split(",") if v)
        job_list = jobs(kernels=RELEASE_KERNELS, targets=RELEASE_TARGETS, warps=(4,), stages=(2,))
        rows: list[dict[str, Any]] = []
        t0 = time.perf_counter()
        for v in versions:
            t1 = time.perf_counter()
            got = run_release(v, job_list, a.workers)
            for r in got:
                r["static_check"] = _static(r)
            rows += got
            ok = sum(r["status"] == "ok" for r in got)
            print(f"triton {v}: {ok}/{len(got)} ok ({time.perf_counter() - t1:.0f} s)", flush=True)
            print(summarize(got), flush=True)
        out = Path(a.out) if a.out else STAGING / RELEASES
        _write(rows, out, RELEASE_COLUMNS)
        print(f"wrote {out} ({len(rows)} rows, {time.perf_counter() - t0:.0f} s)")
        if not a.out:
            _file(out, "compile-releases", f"the release sweep (Triton {', '.join(versions)}), gdnlab compile-matrix "
                  "--releases; notebook 05", "/".join(versions))
        return 0

    full = job_list = jobs(quick=a.quick)
    keep: list[dict[str, Any]] = []  # rows of other kernels, kept when only some kernels are rebuilt
    kept_note = ""  # what a filed run says of them
    if a.kernels:
        names = tuple(k.strip() for k in a.kernels.split(",") if k.strip())
        unknown = set(names) - set(KERNELS)
        if unknown or not names:
            ap.error(f"--kernels: unknown {sorted(unknown)}; known: {', '.join(KERNELS)}")
        job_list = [j for j in full if j["kernel"] in names]
        old = Path(a.out) if a.out else committed(MATRIX)
        if old.exists():
            import pandas as pd
            keep = [r for r in pd.read_csv(old, keep_default_na=False).to_dict("records") if r["kernel"] not in names]
            kept_note = (f"; only {', '.join(names)} built in this run, the other kernels' rows kept from "
                         f"{old.parent.name} (see their kernels_sha)")
            for r in keep:
                r["BV"] = None if r["BV"] in ("", None) else int(r["BV"])
    if a.collect:  # write the CSV from an interrupted run's checkpoint, building nothing
        out = Path(a.out) if a.out else STAGING / MATRIX
        ckpt = _checkpoint_path(out)
        got = {}
        for line in (ckpt.read_text().splitlines() if ckpt.exists() else []):
            if line.strip():
                r = json.loads(line)
                got[_job_key(r)] = r
        rows = [got[_job_key(j)] for j in job_list if _job_key(j) in got]
        sha = kernels_sha()
        for r in rows:
            r["static_check"] = _static(r)
            r.setdefault("kernels_sha", sha)
        _write(rows, out, MATRIX_COLUMNS)
        print(f"wrote {out} from {ckpt.name}: {len(rows)}/{len(job_list)} builds")
        return 0
    t0 = time.perf_counter()
    sha = kernels_sha()  # of the sources the spawned workers import now
    out = Path(a.out) if a.out else (None if a.quick else STAGING / MATRIX)
    ckpt = None
    if out is not None:
        ckpt = _checkpoint_path(out)
        ckpt.parent.mkdir(parents=True, exist_ok=True)
        if not a.resume and ckpt.exists():
            ckpt.unlink()
    ordered = sorted(job_list, key=_priority)
    rows = run_jobs(ordered, workers=a.workers, progress=not a.no_progress, checkpoint=ckpt)
    for r in rows:
        r["static_check"] = _static(r)
        r["kernels_sha"] = sha
    wall = time.perf_counter() - t0
    built, ok = len(rows), sum(r["status"] == "ok" for r in rows)
    print(f"{ok}/{built} builds ok in {wall:.0f} s wall ({sum(float(r['compile_s']) for r in rows):.0f} s of "
          f"compiling, {a.workers} workers)" + (f"; {len(keep)} rows of other kernels kept" if keep else ""))
    index = {_job_key(j): i for i, j in enumerate(full)}
    rows = sorted(rows + [r for r in keep if _job_key(r) in index], key=lambda r: index[_job_key(r)])
    print(summarize(rows))
    if out is not None:
        _write(rows, out, MATRIX_COLUMNS)
        print(f"wrote {out}" + ("" if built == len(job_list) else f" (partial: {built}/{len(job_list)})"))
        if ckpt is not None and built == len(job_list):
            ckpt.unlink(missing_ok=True)
            if not a.out:
                _file(out, "compile-matrix", "every lab kernel built for Hopper, MI300X and RDNA3.5 without the "
                      f"hardware (gdnlab compile-matrix{' --kernels' if a.kernels else ''}){kept_note}; notebook 05",
                      rows[0]["triton_version"] if rows else "?")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
