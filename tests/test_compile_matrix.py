"""The static dot-shape check, its agreement with what the compiler did (the committed compile-matrix CSVs), the
parsers of the build worker, and one real cross-target compile."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest

from gdnlab import compile_matrix as cm, dot_shapes as ds
from gdnlab.compile_matrix import (BVS, MATRIX, RELEASES, STAGES, WARPS, committed, dot_lowering, jobs,
                                   matrix_instructions)

SHIPPED_AUTOTUNE = [dict(BV=bv, num_warps=w, num_stages=s) for bv in BVS for w in WARPS for s in STAGES]
V_FIRST = "V_new^T.K (V-first state update)"


# ---- the static check ------------------------------------------------------------------------------------------

def test_gfx1151_flags_exactly_the_bv8_configs():
    flagged = ds.flag_autotune_configs("hip:gfx1151", "fused_shipped", SHIPPED_AUTOTUNE)
    assert len(flagged) == 6 and {c.BV for c in flagged} == {8}
    sites = {d.site for d in flagged[0].below_min}
    assert sites == {"Q.h", "W.h", "A.U", V_FIRST}  # every BV-wide dot; Q.K^T is 64x64x64
    assert "below_min" in flagged[0].summary() and "[64,64]x[64,8]" in flagged[0].summary()


def test_gfx942_serves_every_shipped_config():
    # CDNA3's 4x4x4 16-block MFMA covers 64x8 and 8x64 tiles: the MI300X occupancy configs are legal there.
    assert ds.flag_autotune_configs("hip:gfx942", "fused_shipped", SHIPPED_AUTOTUNE) == []


def test_hopper_bv8_only_the_v_first_update_is_below_mma():
    chk = ds.check_dot_shapes("cuda:90", 8, "fused_shipped")
    assert [d.site for d in chk.below_min] == [V_FIRST]  # M = 8 < mma's 16; N = 8 is fine (m16n8k16)
    assert ds.check_dot_shapes("cuda:90", 8, "fwd_o").ok  # the two-kernel path keeps BV on N
    assert ds.check_dot_shapes("cuda:90", 8, "fwd_h").ok
    assert not ds.check_dot_shapes("hip:gfx1151", 8, "fwd_o").ok


def test_bv16_and_up_are_native_everywhere():
    for t in ds.TARGETS:
        for k in ds.KERNELS:
            for bv in (16, 32, 64):
                for w in (2, 4):
                    assert ds.check_dot_shapes(t, bv, k, w).ok, (t, k, bv, w)


def test_fused_dot_shapes_follow_the_tiles():
    dots = {d.site: (d.M, d.N, d.K, d.operands) for d in ds.kernel_dots("fused_shipped", 16)}
    assert dots == {"Q.h": (64, 16, 64, "bf16"), "Q.K^T": (64, 64, 64, "bf16"), "W.h": (64, 16, 64, "bf16"),
                    "A.U": (64, 16, 64, "bf16"), V_FIRST: (16, 64, 64, "bf16")}
    fixed = {d.site for d in ds.kernel_dots("fused_fixed", 16)}
    assert "A.V_new" in fixed and "A.U" not in fixed
    nodown = {d.site: d.operands for d in ds.kernel_dots("fused_shipped_no_downcast", 16)}
    assert nodown["Q.h"] == "fp32"
    assert ds.kernel_dots("l2norm") == [] and ds.kernel_dots("log_norm") == []


def test_fold_builds_have_their_plain_kernels_dots():
    # FOLD moves the l2-norm into the gates: the same jit function, the same tl.dot sites.
    for plain in ("prologue", "fwd_h", "fwd_o"):
        fold = f"{plain}_fold"
        assert ds.jit_fn(fold) == ds.jit_fn(plain) and ds.TWO_KERNEL_BUILDS[fold].options == {"fold_norm": True}
        assert (fold in ds.BV_KERNELS) == (plain in ds.BV_KERNELS)
        for bv in ((8, 64) if plain in ds.BV_KERNELS else (None,)):
            assert ds.kernel_dots(fold, bv) == ds.kernel_dots(plain, bv) != []


def test_walk_t_builds_trade_the_prologue_products_for_one_in_the_walk():
    pro = {d.site for d in ds.kernel_dots("prologue_walk_t")}
    assert pro == {d.site for d in ds.kernel_dots("prologue")} - {"W = T.(beta exp(G) K)", "U = T.(beta V)"}
    walk = {d.site: (d.M, d.N, d.K) for d in ds.kernel_dots("fwd_h_walk_t", 32)}
    assert walk == {"K.h": (64, 32, 64), "T.(beta (V - exp(G) K.h))": (64, 32, 64),
                    "K^T.V_new (state update)": (64, 32, 64)}


def test_solve_builds_differ_from_the_default_only_where_their_solve_adds_products():
    # "moves" takes the blocks out by register moves (no product more); "doubling" inverts them by products.
    assert ds.kernel_dots("prologue_t_moves") == ds.kernel_dots("prologue_walk_t")
    extra = [d for d in ds.kernel_dots("prologue_doubling") if d not in ds.kernel_dots("prologue_fold")]
    assert [(d.M, d.N, d.K, d.operands) for d in extra] == [(16, 16, 16, "fp32")]


def test_output_kernel_takes_bv_128_the_others_stop_at_64():
    # fast launches the output kernel at out_BV = 128; the state kernel and the fused variants take STATE_BVS.
    from gdnlab.kernel_params import OUT_BVS, STATE_BVS
    assert 128 in OUT_BVS and 128 not in STATE_BVS
    for k in ds.KERNELS:
        want = OUT_BVS if ds.jit_fn(k) == "fwd_o_kernel" else STATE_BVS if k in ds.BV_KERNELS else ()
        assert ds.KERNEL_BVS[k] == want, k
    assert {ds.TWO_KERNEL_BUILDS[k].bv_option for k in ("fwd_o", "fwd_o_fold")} == {"out_BV"}
    for k in ("fwd_o", "fwd_o_fold"):
        dots = {d.site: (d.M, d.N, d.K) for d in ds.kernel_dots(k, 128)}
        assert dots == {"Q.h": (64, 128, 64), "Q.K^T": (64, 64, 64), "A.V_new": (64, 128, 64)}  # N = BV as at 8..64
        for t in ds.TARGETS:
            assert ds.check_dot_shapes(t, 128, k, 2).ok and ds.check_dot_shapes(t, 128, k, 4).summary() == "native"
    for k in ("fwd_h", "fwd_h_fold", "fused_shipped"):
        with pytest.raises(ValueError, match="BV"):
            ds.kernel_dots(k, 128)


def test_fp32_ieee_dots_have_no_matrix_instruction_on_nvidia_or_rdna():
    for t in ("cuda:90", "hip:gfx1151"):
        chk = ds.check_dot_shapes(t, None, "prologue")
        assert [d.operands for d in chk.no_instr] == ["fp32"] and chk.ok
        assert [d.site for d in ds.check_dot_shapes(t, 32, "fused_shipped_no_downcast").no_instr] == ["Q.h"]
    assert ds.check_dot_shapes("hip:gfx942", None, "prologue").no_instr == ()


def test_wgmma_needs_a_warpgroup():
    wg = next(i for i in ds.INSTRUCTIONS["cuda:90"] if i.name.startswith("wgmma"))
    d = ds.Dot("x", 64, 16, 64)
    assert wg.covers(d, 4) and not wg.covers(d, 2)
    assert ds.check_dot_shapes("cuda:90", 16, "fused_shipped", num_warps=2).ok  # mma.sync serves 2 warps


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="target"):
        ds.check_dot_shapes("hip:gfx90a", 16)
    with pytest.raises(ValueError, match="kernel"):
        ds.check_dot_shapes("cuda:90", 16, "nope")
    with pytest.raises(TypeError, match="BV"):
        ds.check_dot_shapes("cuda:90", None, "fused_shipped")
    with pytest.raises(ValueError, match="num_warps"):
        ds.check_dot_shapes("cuda:90", 16, num_warps=0)


def test_frontend_minima_per_release():
    assert ds.frontend_min("hip:gfx1151", "3.0.0") == (16, 16, 16)
    assert ds.frontend_min("cuda:90", "3.1.0") == (16, 16, 16)
    assert ds.frontend_min("hip:gfx942", "3.2.0") == (16, 16, 8)
    assert ds.frontend_min("hip:gfx1151", "3.2.0") == (16, 16, 16)
    assert ds.frontend_min("hip:gfx1151", "3.3.1") == (1, 1, 1)
    assert ds.frontend_min("cuda:90", "3.4.0") == (16, 16, 16)
    assert ds.frontend_min("cuda:90", "3.9.0") == (1, 1, 16)
    # Triton <= 3.1 rejects BV = 8 even where the hardware has an instruction for it.
    assert ds.predict("hip:gfx942", "3.0.0", 8, "fused_shipped") == "error"
    assert ds.predict("hip:gfx942", "3.9.0", 8, "fused_shipped") == "ok"
    assert ds.predict("hip:gfx1151", "3.9.0", 64, "fused_shipped") == "ok"


def test_job_list():
    full = jobs()
    # 3 targets; 9 BV-free kernels (l2norm, prologue, log_norm, prologue_fold, prologue_walk_t, prologue_t_moves,
    # prologue_doubling, prologue_wu_apart, wu) x 6 warps/stages,
    # 12 kernels at the state BVs (fwd_h, fwd_h_fold, fwd_h_walk_t, fwd_h_fused_output, fwd_h_batch_layout,
    # fwd_h_k_once, fwd_h_ws, fwd_h_k_once_split, 4 fused variants) x 4 BV x 6, the output kernels (fwd_o,
    # fwd_o_fold, fwd_o_split) x 5 BV x 6
    assert len(full) == 3 * (9 * 6 + 12 * 4 * 6 + 3 * 5 * 6) == 1296
    free = ("l2norm", "prologue", "log_norm", "prologue_fold", "prologue_walk_t", "prologue_t_moves",
            "prologue_doubling", "prologue_wu_apart", "wu")
    assert {j["BV"] for j in full if j["kernel"] in free} == {None}
    assert {j["BV"] for j in full if j["kernel"] in ("fwd_o", "fwd_o_fold", "fwd_o_split")} == {8, 16, 32, 64, 128}
    assert {j["BV"] for j in full if j["kernel"] in ("fwd_h", "fwd_h_fold", "fwd_h_walk_t", "fwd_h_fused_output",
                                                     "fwd_h_batch_layout", "fwd_h_k_once", "fwd_h_ws",
                                                     "fwd_h_k_once_split",
                                                     *cm.FUSED_VARIANTS)} == set(BVS)
    assert sorted(full, key=cm._priority)  # every kernel's jit function has its place in the build order
    quick = jobs(quick=True)
    assert len(quick) == 12 and {j["kernel"] for j in quick} == {"fused_shipped", "fwd_o"}
    # the release sweep: fused_shipped at 4 BVs, fwd_o at 5, on 2 targets
    assert len(jobs(kernels=cm.RELEASE_KERNELS, targets=cm.RELEASE_TARGETS, warps=(4,), stages=(2,))) == 18
    assert {j["BV"] for j in jobs(kernels=("fwd_o", "fused_shipped"), bvs=(64, 128))} == {64, 128}


# ---- the worker's parsers --------------------------------------------------------------------------------------

def test_matrix_instruction_parser():
    ptx = ("wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {...};\n"
           "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {...};")
    assert matrix_instructions({"ptx": ptx}) == "mma.m16n8k16.bf16;wgmma.m64n8k16.bf16"
    gcn = "v_wmma_f32_16x16x16_bf16 v[0:7], v[8:15]\nv_mfma_f32_4x4x4_16b_bf16 a[0:3]"
    assert matrix_instructions({"amdgcn": gcn}) == "v_mfma_f32_4x4x4_16b_bf16;v_wmma_f32_16x16x16_bf16"
    assert matrix_instructions({"amdgcn": "v_fma_f32 v0, v1, v2"}) == "none"


def test_dot_lowering_parser():
    ttgir = "\n".join([
        "#blocked = #ttg.blocked<{sizePerThread = [1, 1]}>",
        "#mma = #ttg.nvidia_mma<{versionMajor = 3, versionMinor = 0, instrShape = [16, 8, 16]}>",
        "#mma1 = #ttg.nvidia_mma<{versionMajor = 2, versionMinor = 0, instrShape = [16, 8]}>",
        "%1 = ttng.warp_group_dot %a, %b, %c {inputPrecision = 0 : i32} : !ttg.memdesc<64x64xbf16, #s> * "
        "!ttg.memdesc<64x8xbf16, #s> -> tensor<64x8xf32, #mma> loc(#l)",
        "%2 = tt.dot %a, %b, %c : tensor<8x64xbf16, #ttg.dot_op<{opIdx = 0, parent = #mma1}>> * "
        "tensor<64x64xbf16, #ttg.dot_op<{opIdx = 1, parent = #mma1}>> -> tensor<8x64xf32, #mma1>",
        "%3 = tt.dot %a, %b, %c, inputPrecision = ieee : tensor<64x64xf32, #ttg.dot_op<{opIdx = 0, parent = "
        "#blocked}>> * tensor<64x64xf32, #ttg.dot_op<{opIdx = 1, parent = #blocked}>> -> tensor<64x64xf32, #blocked>",
        # a batched dot (four 16x16 products) is listed by the shape of each product
        "%4 = tt.dot %a, %b, %c, inputPrecision = ieee : tensor<4x16x8xf32, #ttg.dot_op<{opIdx = 0, parent = "
        "#blocked}>> * tensor<4x8x32xf32, #ttg.dot_op<{opIdx = 1, parent = #blocked}>> "
        "-> tensor<4x16x32xf32, #blocked>",
    ])
    dots, fma = dot_lowering(ttgir)
    assert dots == "16x32x8 f32:fma;64x64x64 f32:fma;64x8x64 bf16:wgmma;8x64x64 bf16:mma" and fma == 2


# ---- agreement with what the compiler did ----------------------------------------------------------------------

def _rows(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        pytest.skip(f"{path.name} not generated yet (gdnlab compile-matrix)")
    with open(path) as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r["kernel"] = cm.OLD_KERNEL_NAMES.get(r["kernel"], r["kernel"])
    return rows


def _bv(row: dict[str, str]) -> int | None:
    return int(row["BV"]) if row["BV"] else None


def _observed(row: dict[str, str]) -> dict[tuple[int, int, int, str], str]:
    out = {}
    for item in filter(None, row["dots"].split(";")):
        shape, kind = item.split(":")
        mnk, dt = shape.split(" ")
        m, n, k = (int(x) for x in mnk.split("x"))
        out[(m, n, k, "fp32" if dt == "f32" else dt)] = kind
    return out


def _agree(row: dict[str, str], version: str) -> None:
    """The static check's prediction and the compiler's record of one build must tell the same story."""
    t, k, bv, w = row["target"], row["kernel"], _bv(row), int(row["num_warps"])
    where = f"{version} {t} {k} BV={bv} warps={w}"
    assert ds.predict(t, version, bv, k, w) == row["status"], f"{where}: {row['error']}"
    if row["status"] != "ok":
        return
    chk = ds.check_dot_shapes(t, bv, k, w)
    seen = _observed(row)
    assert {k[:3] for k in seen} == {(d.M, d.N, d.K) for d in chk.dots}, f"{where}: dot shapes"
    for d in chk.dots:
        # An FMA fallback converts bf16 operands to fp32 first, so it shows as an f32 dot.
        kind = seen.get((d.M, d.N, d.K, d.operands)) or seen.get((d.M, d.N, d.K, "fp32"))
        assert kind is not None, f"{where}: {d.site} {d.shape} {d.operands} not in the TTGIR"
        want = ds.expected_lowering(t, version, d, chk)
        assert (kind == "fma") == (want == "fma"), f"{where}: {d.site} {d.shape} lowered to {kind}, expected {want}"
    b = ds.behaviour(t, version)
    small = b is not None and any(b.small(d) for d in chk.dots)
    if small and b.prints:
        assert b.prints in row["diagnostic"], f"{where}: expected the diagnostic {b.prints!r}"
    else:
        assert "no matching matrix core intrinsic" not in row["diagnostic"], f"{where}: {row['diagnostic']}"
    if chk.dots and len(chk.no_instr) < len(chk.dots):
        assert row["matrix_instr"] != "none", where


def test_matrix_csv_rows_are_jobs_and_cover_the_shipped_kernel():
    rows = _rows(committed(MATRIX))
    got = [(r["target"], r["kernel"], r["BV"], r["num_warps"], r["num_stages"]) for r in rows]
    want = {(j["target"], j["kernel"], "" if j["BV"] is None else str(j["BV"]), str(j["num_warps"]),
             str(j["num_stages"])) for j in jobs()}
    assert len(got) == len(set(got)) and set(got) <= want  # a full run has every job; --collect may write fewer
    shipped = {(t, bv, w, st) for t, k, bv, w, st in got if k == "fused_shipped"}
    assert len(shipped) == len(jobs(kernels=("fused_shipped",)))  # every target x BV x warps x stages
    assert len({r["triton_version"] for r in rows}) == 1
    for r in rows:
        if r["status"] == "ok" and ds.kernel_dots(r["kernel"], _bv(r)):
            assert r["matrix_instr"], r  # the instruction is named for every build that succeeded


def test_static_check_agrees_with_the_matrix():
    for row in _rows(committed(MATRIX)):
        _agree(row, row["triton_version"])


def test_static_check_agrees_with_every_release():
    rows = [r for r in _rows(committed(RELEASES)) if not r["error"].startswith(("venv setup failed", "driver failed"))]
    assert rows
    for row in rows:
        _agree(row, row["release"])


def test_which_release_prints_the_reports_error():
    rows = _rows(committed(RELEASES))
    hits = {(r["release"], r["target"], r["BV"]) for r in rows if ds.REPORT_ERROR in r["diagnostic"] + r["error"]}
    assert hits and {h[1] for h in hits} == {"hip:gfx1151"} and {h[2] for h in hits} == {"8"}
    assert {h[0] for h in hits} == {r["release"] for r in rows if r["release"].startswith("3.7")}


# ---- one real compile ------------------------------------------------------------------------------------------

def test_real_compile_gfx942_fwd_o_bv8(tmp_path, monkeypatch):
    pytest.importorskip("triton.backends.amd.compiler")
    from gdnlab.compile_matrix import _build
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")
    # About 5 s on an idle core (the smallest kernel with a BV-wide dot; the fused kernel takes 20-60 s).
    row = _build(dict(target="hip:gfx942", kernel="fwd_o", BV=8, num_warps=4, num_stages=2))
    assert row["status"] == "ok", row["error"]
    assert "v_mfma_f32_4x4x4_16b_bf16" in row["matrix_instr"]  # the 64x8 tiles, on the 16-block MFMA
    row["triton_version"] = row.get("triton_version", "")
    _agree({k: str(v) for k, v in row.items()}, row["triton_version"])


def test_build_captures_what_the_compiler_prints(monkeypatch):
    """triton.compile runs inside the capture: an MLIR error it prints reaches `error` and `diagnostic` (a stand-in
    compile, no real build)."""
    import os
    import triton

    def failing_compile(*a, **kw):
        os.write(2, b"loc(\"x.py\":1:2): error: no matching matrix core intrinsic (test)\n")
        raise RuntimeError("PassManager::run failed")

    monkeypatch.setattr(triton, "compile", failing_compile)
    row = cm._build(dict(target="hip:gfx942", kernel="l2norm", BV=None, num_warps=4, num_stages=2))
    assert row["status"] == "error"
    assert row["error"] == "no matching matrix core intrinsic (test)"
    assert row["diagnostic"] == "error: no matching matrix core intrinsic (test)"


def test_real_compile_hopper_regs_from_tritons_own_ptxas_log(tmp_path, monkeypatch, capsys):
    """Registers and spills come from the ptxas log Triton prints (TRITON_DUMP_PTXAS_LOG), not a second ptxas run.
    (pytest's capture is lifted: it swaps sys.stdout, which the build worker's processes leave on file descriptor 1.)"""
    pytest.importorskip("triton.backends.nvidia.compiler")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")
    monkeypatch.setenv("TRITON_DUMP_PTXAS_LOG", "1")

    def no_fallback(ptx):
        raise AssertionError("the fallback ptxas run was used: Triton's own ptxas log was not captured")

    monkeypatch.setattr(cm, "_nvidia_resources", no_fallback)
    # Under a second: the l2-norm kernel has no tl.dot.
    with capsys.disabled():
        row = cm._build(dict(target="cuda:90", kernel="l2norm", BV=None, num_warps=4, num_stages=2))
    assert row["status"] == "ok", row["error"]
    assert int(row["regs"]) > 0 and row["spills"] == "0"


@pytest.mark.parametrize("kernel", ["fwd_o", "fwd_o_fold"])
def test_output_kernel_recorded_at_bv_128(kernel):
    """The output kernel's BV 128 (fast's out_BV) is recorded from a call with out_BV=128 (BV, the state kernel's,
    stops at 64)."""
    spec = cm.launch_spec(kernel, 128)
    assert spec.fn.__name__ == "fwd_o_kernel" and spec.constexprs["BV"] == 128
    assert spec.constexprs["FOLD"] is (kernel == "fwd_o_fold")
    assert (spec.signature, spec.constexprs) == (cm.launch_spec(kernel, 64).signature,
                                                 {**cm.launch_spec(kernel, 64).constexprs, "BV": 128})
    with pytest.raises(ValueError, match="BV"):
        cm.launch_spec("fwd_h", 128)


@pytest.mark.parametrize("kernel", cm.KERNELS)
def test_builds_take_the_arguments_the_wrapper_passes(kernel):
    """Every build's signature and constexprs cover the jit function's parameters exactly (runtime arguments typed,
    constexprs valued), come from the wrapper's own launch (int32 indices at this size), and the fused builds carry
    their variant's switches, the two-kernel builds their jit function and (with fold_norm) FOLD."""
    from gdnlab.kernel_params import FUSED_VARIANTS
    spec = cm.launch_spec(kernel, 16 if kernel in ds.BV_KERNELS else None)
    params = {p.name: p for p in spec.fn.params}
    assert set(spec.signature) | set(spec.constexprs) == set(params)
    assert all(params[n].is_constexpr for n in spec.constexprs)
    assert not any(params[n].is_constexpr for n in spec.signature)
    assert spec.constexprs.get("I64", False) is False
    assert spec.fn.__name__ == ds.jit_fn(kernel)
    if kernel in FUSED_VARIANTS:
        assert {k: spec.constexprs[k] for k in ("DOWNCAST", "INTRA_VNEW")} == FUSED_VARIANTS[kernel].constexprs
    elif "FOLD" in params:
        assert spec.constexprs["FOLD"] is ds.TWO_KERNEL_BUILDS[kernel].options.get("fold_norm", False)


# ---- what the device's Triton can parse -------------------------------------------------------------------------

def _flat_target(t) -> bool:
    import ast
    return isinstance(t, (ast.Name, ast.Attribute, ast.Subscript)) or (
        isinstance(t, ast.Tuple) and all(isinstance(e, ast.Name) for e in t.elts))


def test_kernel_assignments_are_flat_for_triton_3_6():
    """Every @triton.jit function assigns to names or flat tuples of names. Triton 3.6 (the H200's) hashes a
    kernel's source through a dependency finder that takes each assignment target as a set of names, and a nested
    tuple target fails the kernel's first launch there (docs/speed-notes.md item 34), though later Tritons accept it."""
    import ast
    import importlib
    import inspect
    import pkgutil

    import gdnlab.kernels as kernels
    from triton.runtime.jit import JITFunction
    nested, seen = [], 0
    for m in pkgutil.iter_modules(kernels.__path__):
        mod = importlib.import_module(f"gdnlab.kernels.{m.name}")
        for name, fn in vars(mod).items():
            if isinstance(fn, JITFunction) and fn.__module__ == mod.__name__:
                seen += 1
                for node in ast.walk(ast.parse(inspect.getsource(fn.fn))):
                    targets = node.targets if isinstance(node, ast.Assign) else []
                    nested += [f"{m.name}.{name}: line {node.lineno}" for t in targets if not _flat_target(t)]
    assert seen > 30 and not nested, nested


def test_builds_mark_pointer_arguments_aligned_as_the_jit_does():
    """Without tt.divisibility on its pointers a build cannot widen its loads, and its registers and spills are not
    the launched kernel's (speed notes item 49): every pointer argument is marked, no integer one."""
    import triton
    if cm._version_key(triton.__version__) < (3, 3):
        pytest.skip("attributes are passed only from Triton 3.3")
    spec = cm.launch_spec("prologue_fold", None)
    src = cm._ast_source(spec.fn, spec.signature, spec.constexprs)
    names = list(spec.fn.arg_names)
    marked = {names[k[0]] for k, v in src.attrs.items() if ["tt.divisibility", 16] in v}
    pointers = {n for n, t in spec.signature.items() if t.startswith("*")}
    assert pointers and marked == pointers
    assert not marked & {n for n, t in spec.signature.items() if t[0] == "i"}


def test_warp_partitions_counts_the_partitions_of_a_ttgir():
    ttgir = ("    %1 = ttg.warp_specialize(%a) attributes {requestedRegisters = array<i32: 232, 232>}\n"
             "    default {\n    }\n    partition0(%x: i32) num_warps(4) {\n    }\n"
             "    partition1(%x: i32) num_warps(4) {\n    } : (i32) -> ()\n")
    assert cm.warp_partitions(ttgir) == 2
    assert cm.warp_partitions("    %1 = tt.dot %a, %b\n    scf.for %i = ... {\n") == 0
