"""The static instruction mix of one of the lab's kernels as Triton builds it for Hopper (sm_90), on any machine.

The compile matrix (gdnlab.compile_matrix) says whether a build compiles and what registers, spills and matrix
instructions it has; it does not say where a kernel's instructions go. For a kernel bound by latency rather than
by its bytes (fast's prologue, speed notes item 46) that is the question: how many of its instructions are matrix
products, FMA arithmetic, shared-memory traffic and barriers (Triton's layout conversions go through shared
memory, each behind a barrier), and how many layout conversions its TTGIR asks for. :func:`mix` builds a kernel
exactly as a recorded call of the public entry point launches it (pointer arguments 16-byte aligned, as Triton's
JIT marks them), with constexprs optionally replaced (a study form such as the prologue's SOLVE="identity"), and
counts both. Static counts, not executed ones: straight-line kernels such as the prologue run each about once.

    python -m gdnlab.instruction_mix --backend fast --kernel prologue_kernel prologue_warps=2 prologue_solve=blocks
"""
from __future__ import annotations

import argparse
import collections
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from gdnlab.findings import Finding, _fail

#: The opcode classes :func:`groups` sums (SASS opcodes without their modifiers).
GROUPS: dict[str, tuple[str, ...]] = {
    "matrix": ("HMMA", "HGMMA", "WGMMA"),
    "fp32 arithmetic": ("FFMA", "FADD", "FMUL", "FSEL", "FSETP", "FMNMX", "MUFU"),
    "shared memory": ("LDS", "STS", "LDSM", "STSM"),
    "barriers": ("BAR",),
    "shuffles": ("SHFL",),
    "global memory": ("LDG", "STG", "LDGSTS", "UTMALDG", "UTMASTG"),
    "local memory (spills)": ("LDL", "STL"),
    "conversions": ("F2FP", "F2F", "I2F", "F2I", "HMUL2", "PRMT"),
}
_OPCODE = re.compile(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)", re.M)


@dataclass(frozen=True)
class Mix:
    """One build's SASS opcodes (modifiers dropped) with their static counts, and its TTGIR's layout conversions,
    shared-memory buffers and dots."""

    opcodes: collections.Counter
    convert_layouts: int
    local_allocs: int
    dots: int

    @property
    def total(self) -> int:
        return sum(self.opcodes.values())

    def groups(self) -> dict[str, int]:
        """Static counts per class of GROUPS, then everything else and the total."""
        out = {g: sum(self.opcodes[o] for o in ops) for g, ops in GROUPS.items()}
        out["other"] = self.total - sum(out.values())
        out["total"] = self.total
        return out


def recorded_spec(backend: str, kernel: str, **options: Any) -> tuple[Any, dict[str, Any]]:
    """The LaunchSpec (gdnlab.compile_matrix) and launch options (num_warps, ...) with which one call of
    `backend` with `options` launches `kernel` (compile_matrix.recorded_launch: a one-chunk call). Pass the
    options that depend on the call's size (fast_by_size's) explicitly: this call is small."""
    from gdnlab.compile_matrix import recorded_launch, spec_of
    from gdnlab.handles import LAUNCH_OPTIONS

    call = recorded_launch(backend, kernel, **options)
    return spec_of(call), {k: v for k, v in call.kwargs.items() if k in LAUNCH_OPTIONS}


def mix(backend: str, kernel: str, *, replace: dict[str, Any] | None = None, **options: Any) -> Mix:
    """Build `kernel` for sm_90 as `backend` with `options` launches it (warps, stages and register cap as the
    call passes them, Triton's defaults where it passes none; its constexprs in `replace` swapped for the given
    values) and count its SASS opcodes and TTGIR operations."""
    import triton

    from gdnlab.compile_matrix import _ast_source, _gpu_target

    spec, launch = recorded_spec(backend, kernel, **options)
    cx = dict(spec.constexprs)
    for name, value in (replace or {}).items():
        if name not in cx:
            raise ValueError(f"replace: {kernel} has no constexpr {name!r}")
        cx[name] = value
    # FMA fusion on, as every Triton the lab's devices run builds by default (stated: 3.9 warns otherwise)
    opts = dict(num_warps=launch.get("num_warps", 4), num_stages=launch.get("num_stages", 3),
                enable_fp_fusion=True)
    if launch.get("maxnreg"):
        opts["maxnreg"] = launch["maxnreg"]
    k = triton.compile(_ast_source(spec.fn, spec.signature, cx), target=_gpu_target("cuda:90"), options=opts)
    ttgir = k.asm["ttgir"]
    return Mix(collections.Counter(o.split(".")[0] for o in _OPCODE.findall(_disassemble(k.asm["cubin"]))),
               convert_layouts=len(re.findall(r"ttg\.convert_layout\b", ttgir)),
               local_allocs=len(re.findall(r"ttg\.local_alloc\b", ttgir)),
               dots=len(re.findall(r"\btt\.dot\b|\bttng\.warp_group_dot\b", ttgir)))


def available() -> bool:
    """Whether this machine can count SASS: the installed Triton ships an nvdisasm."""
    return _nvdisasm().exists()


def prologue_forms(solves: tuple[str, ...] = ("blocks", "moves", "doubling", "tf32x3"), *,
                   warps: int = 2) -> dict[str, Mix]:
    """fast's prologue (the fold) at `warps` warps with each of `solves`, and "no solve" (the first solve's build
    with SOLVE="identity", the study form whose T is the identity): what each solve adds to the rest."""
    out = {s: mix("fast", "prologue_kernel", prologue_warps=warps, prologue_solve=s) for s in solves}
    out["no solve"] = mix("fast", "prologue_kernel", replace={"SOLVE": "identity"}, prologue_warps=warps,
                          prologue_solve=solves[0])
    return out


def table(mixes: dict[str, Mix]) -> pd.DataFrame:
    """One row per build: the static count of each class of GROUPS, the rest, the total, and the TTGIR's dots,
    layout conversions and shared-memory buffers."""
    rows = {name: dict(m.groups(), dots=m.dots, layout_conversions=m.convert_layouts,
                       shared_buffers=m.local_allocs) for name, m in mixes.items()}
    df = pd.DataFrame.from_dict(rows, orient="index")
    df.index.name = "build"
    return df


def solve_cost(tab: pd.DataFrame, solve: str = "blocks", without: str = "no solve") -> Finding:
    """The `solve` build against the build with no solve: the solve adds no matrix instruction (its products run
    on the FMA units), but layout conversions and barriers. Raises when any of the three does not hold."""
    a, b = tab.loc[solve], tab.loc[without]
    d = a - b
    if d["matrix"] != 0 or d["layout_conversions"] <= 0 or d["barriers"] <= 0:
        raise _fail(f"solve_cost: {solve} against {without} is not 'no matrix instructions, more conversions and "
                    "barriers'", d.to_dict())
    return Finding(f"The {solve} solve adds {d['total']:.0f} of the prologue's {a['total']:.0f} static "
                   f"instructions and no matrix instruction ({a['matrix']:.0f} with it and without): its "
                   f"{d['dots']:.0f} dots run on the FMA units (+{d['fp32 arithmetic']:.0f} fp32 instructions), "
                   f"and it brings {d['layout_conversions']:.0f} layout conversions, +{d['shared memory']:.0f} "
                   f"shared-memory instructions, +{d['barriers']:.0f} barriers and +{d['shuffles']:.0f} shuffles.",
                   dict(with_solve=a.to_dict(), without=b.to_dict()))


def figure(tab: pd.DataFrame) -> Figure:
    """Each build's static instructions by class, as stacked horizontal bars."""
    classes = [*GROUPS, "other"]
    fig, ax = plt.subplots(figsize=(7.2, 0.5 * len(tab) + 1.6))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    left = pd.Series(0.0, index=tab.index)
    for i, c in enumerate(classes):
        ax.barh(tab.index, tab[c], left=left, color=colors[i % len(colors)] if c != "other" else "0.8", label=c)
        left += tab[c]
    ax.invert_yaxis()
    ax.set(xlabel="static SASS instructions (sm_90)", title="fast's prologue: where its instructions go")
    ax.legend(fontsize=7, frameon=False, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.25))
    fig.tight_layout()
    return fig


def _nvdisasm() -> Path:
    from gdnlab.compile_matrix import nvidia_bin
    return nvidia_bin() / "nvdisasm"


def _disassemble(cubin: bytes) -> str:
    """SASS text of a cubin, by the nvdisasm Triton ships."""
    nvdisasm = _nvdisasm()
    if not nvdisasm.exists():
        raise RuntimeError(f"no nvdisasm at {nvdisasm} (this Triton ships none)")
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "k.cubin"
        p.write_bytes(cubin)
        done = subprocess.run([str(nvdisasm), "-c", str(p)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"nvdisasm failed: {done.stderr[-300:]}")
    return done.stdout


def _value(text: str) -> Any:
    """An option's value from the command line: int, bool, else the string."""
    if text in ("True", "False"):
        return text == "True"
    try:
        return int(text)
    except ValueError:
        return text


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m gdnlab.instruction_mix", description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="fast")
    ap.add_argument("--kernel", default="prologue_kernel")
    ap.add_argument("--replace", action="append", default=[], metavar="CONSTEXPR=VALUE",
                    help="build with this constexpr swapped (repeatable), e.g. SOLVE=identity")
    ap.add_argument("options", nargs="*", metavar="OPTION=VALUE", help="the backend's call options")
    a = ap.parse_args(argv)
    if any("=" not in o for o in [*a.options, *a.replace]):
        ap.error("options and --replace take NAME=VALUE")
    opts, rep = ({k: _value(v) for k, _, v in (o.partition("=") for o in given)} for given in (a.options, a.replace))
    m = mix(a.backend, a.kernel, replace=rep, **opts)
    print(f"{a.kernel} of {a.backend} {opts} {rep or ''}: TTGIR {m.dots} dots, {m.convert_layouts} layout "
          f"conversions, {m.local_allocs} shared-memory buffers")
    for g, n in m.groups().items():
        print(f"  {g:24s} {n:6d}")


if __name__ == "__main__":
    main()
