"""gdnlab.experiments, findings, plots, reproduce and cli on tiny problems (CPU interpreter)."""
from __future__ import annotations

import json
import math
import os
from dataclasses import replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import nbformat
import pandas as pd
import pytest
import torch

import gdnlab
from gdnlab import experiments as ex
from gdnlab import findings, plots
from gdnlab.backends import register_backend
from gdnlab.cli import main as cli_main
from gdnlab.reproduce import NotebookSpec, gpu_slug, reproduce

TINY = dict(H=1, HV=1, K=64, V=64)
SLOW = ex.Problem(regime="cutedsl", decay=0.001, **TINY)
ENV = {"device", "torch", "triton", "seed", "regime", "backend"}


def _prefix(inp, n: int):
    cut = lambda x: x[:, :n].contiguous()
    return replace(inp, q=cut(inp.q), k=cut(inp.k), v=cut(inp.v), g=cut(inp.g), beta=cut(inp.beta))


@pytest.mark.parametrize("backend", ["two_kernel", "fused_shipped"])
def test_prefix_of_a_run_is_the_run_of_the_prefix(backend):
    inp = SLOW.inputs(130, "cpu")
    o_long, _ = ex.run_backend(inp, backend)
    for n in (63, 64, 128):
        o, _ = ex.run_backend(_prefix(inp, n), backend)
        assert torch.equal(o, o_long[:, :n]), (backend, n)


def test_seq_len_sweep_table():
    df = ex.seq_len_sweep([63, 64, 128], ["two_kernel", "fused_shipped", "fused_fixed"], problem=SLOW,
                          progress=False)
    need = ENV | {"seq_len", "n_chunks", "initial_state", "max_abs_err", "mean_abs_err", "rel_rms", "diff_vs_baseline"}
    assert need <= set(df.columns)
    assert len(df) == 3 * 3 * 2
    assert df.n_chunks.tolist()[:3] == [1, 1, 2]
    assert (df.device == "cpu").all() and (df.triton == gdnlab.interp.triton_version()).all()
    fixed = df[df.backend == "fused_fixed"]
    assert (fixed.diff_vs_baseline == 0).all()
    findings.bit_equal_to_baseline(df, "fused_fixed", columns=("diff_vs_baseline",))
    findings.ratio_grows_with_chunks(df, "fused_shipped", initial_state=False)
    view = ex.sweep_view(df)
    assert "h0: ratio fused_shipped/two_kernel" in view.columns


def test_run_backend_refuses_unwritten_output():
    def lazy(q, k, v, g, beta, **kw):
        o, ht = gdnlab.chunk_gated_delta_rule(q, k, v, g, beta, **kw, backend="two_kernel")
        o[0, -1, 0, 0] = float("nan")
        return o, ht

    register_backend("test_lazy", lazy, overwrite=True)
    with pytest.raises(AssertionError, match="test_lazy: 1 of .* not written"):
        ex.run_backend(SLOW.inputs(64, "cpu"), "test_lazy")


def test_user_backend_without_options_runs_unpoisoned():
    def plain(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, cu_seqlens=None, state_v_first=False):
        return gdnlab.chunk_gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                             output_final_state=output_final_state,
                                             use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, backend="two_kernel")

    register_backend("test_plain", plain, overwrite=True)
    o, _ = ex.run_backend(SLOW.inputs(64, "cpu"), "test_plain")
    assert torch.isfinite(o.float()).all()


def test_ablation_and_bv_findings():
    abl = ex.ablation([64, 128], problem=SLOW, progress=False)
    assert set(abl.variant) == {"two_kernel", *ex.ABLATION_VARIANTS.values()}
    f = findings.intra_operand_explains(abl)
    assert "intra-chunk operand explains" in f.claim and f.numbers["by_seq_len"][128]["intra_fixed_diff"] == 0.0
    view = ex.ablation_view(abl)
    assert view.loc["two_kernel", "/ baseline @ 128"] == 1.0

    bv = ex.bv_sweep([32, 64], ["two_kernel", "fused_shipped"], problem=SLOW, progress=False)
    assert list(bv.BV) == [64, 32, 64] and (bv.status == "ok").all()
    findings.bv_does_not_matter(bv, "fused_shipped")
    assert not ex.bv_view(bv).empty


def _ratio_frame(ratios_h0: dict[int, float]) -> pd.DataFrame:
    rows = []
    for n, r in ratios_h0.items():
        for b, e in (("two_kernel", 1e-3), ("fused_shipped", r * 1e-3)):
            rows.append(dict(device="cpu", torch="x", triton="y", seed=0, regime="cutedsl", decay=0.001,
                             gate_decay=0.001, h0_scale=0.05, backend=b, seq_len=64 * n, n_chunks=n,
                             initial_state=True, max_abs_err=e))
    return pd.DataFrame(rows)


def test_findings_fail_loudly_with_numbers():
    findings.ratio_grows_with_chunks(_ratio_frame({1: 8.0, 2: 50.0, 4: 60.0}))
    with pytest.raises(AssertionError, match="does not grow"):
        findings.ratio_grows_with_chunks(_ratio_frame({1: 8.0, 2: 9.0, 4: 7.0}))
    with pytest.raises(AssertionError, match="does not grow"):
        findings.ratio_grows_with_chunks(_ratio_frame({1: 8.0, 2: 9.0, 4: 12.0}))  # < 2x growth
    iso = pd.DataFrame([dict(case="c1", backend="fused_shipped", n_chunks=1, initial_state=False,
                             output_diff_vs_baseline=0.0, state_diff_vs_baseline=2 ** -20, max_abs_err=1e-3)])
    with pytest.raises(AssertionError, match="final state differs"):
        findings.final_state_bit_equal(iso)
    findings.one_chunk_no_h0_exact(iso)
    with pytest.raises(AssertionError, match="not bit-equal"):
        findings.bit_equal_to_baseline(iso, "fused_shipped")
    # an ablation where the downcast, not the operand, explains the excess
    rows = [("two_kernel", None, None, 1e-3), ("fused_shipped", True, "U", 5e-2), ("fused_shipped", False, "U", 1e-3),
            ("fused_shipped", True, "V_new", 5e-2), ("fused_shipped", False, "V_new", 1e-3)]
    abl = pd.DataFrame([dict(backend=b, variant=f"{d}{i}", downcast=d, intra_operand=i, seq_len=128,
                             max_abs_err=e, diff_vs_baseline=0.0) for b, d, i, e in rows])
    with pytest.raises(AssertionError, match="intra operand alone"):
        findings.intra_operand_explains(abl)


def test_report_table_against_the_report():
    df = pd.concat([_ratio_frame({1: 10.0, 2: 60.0, 3: 70.0}),
                    _ratio_frame({1: 10.0}).assign(seq_len=63)], ignore_index=True)
    t = ex.report_table(df)
    assert set(t.seq_len) == {63, 64, 128, 192} and set(t.quantity) == {"two_kernel max err", "fused max err", "ratio"}
    row = t[(t.seq_len == 192) & (t.quantity == "ratio")].iloc[0]
    assert row.measured == pytest.approx(70.0) and row.report == 76.0
    with pytest.raises(AssertionError, match="not matched within 2x"):
        findings.reproduces_report(t)  # two-kernel 1e-3 vs 4.2e-4 at 64: 2.4x
    f = findings.reproduces_report(t, factor=3.0)
    assert "within 3x" in f.claim
    assert list(ex.report_view(t).index) == [63, 64, 128, 192]


def test_regime_sweep_and_fit():
    sweep = ex.regime_sweep([None, 0.001], [0.05], ["two_kernel", "fused_shipped"], seq_lens=(63, 64, 128),
                            problem=replace(SLOW, decay=None), progress=False)
    assert sweep.decay.isna().sum() == sweep.decay.notna().sum() == 2 * 3
    fit = ex.report_fit(sweep)
    assert len(fit) == 2 * 3 * 3 and fit.worst_factor.notna().all()
    assert list(ex.fit_view(fit).index.get_level_values(0)) == ["regime's own", "0.001"]
    slow = ex.report_table(sweep, decay=0.001, h0_scale=0.05)
    assert len(slow) == 9 and (slow.decay == 0.001).all()
    assert ex.report_table(sweep, decay=None).decay.isna().all()
    with pytest.raises(ValueError, match="no rows for decay=0.002"):
        ex.report_table(sweep, decay=0.002)
    summary = findings.regime_fit_summary(fit)
    assert "Closest to the report" in summary.claim
    assert isinstance(summary, findings.Summary) and not summary._repr_markdown_()[0].startswith("**Finding.**")


def test_summaries_are_labelled_and_need_rows():
    iso = pd.DataFrame([dict(case="c1", backend="fused_shipped", max_abs_err=3e-3, report_max_abs_err=4e-3)])
    s = findings.compare_to_report(iso)
    assert isinstance(s, findings.Summary) and "descriptive" in s._repr_markdown_()[0]
    with pytest.raises(AssertionError, match="no fused_shipped rows"):
        findings.compare_to_report(iso.assign(report_max_abs_err=0.0))


def test_plots_draw_and_save(tmp_path):
    sweep = pd.concat([_ratio_frame({1: 8.0, 2: 50.0}), _ratio_frame({1: 1.0, 2: 50.0}).assign(initial_state=False)])
    ratios = ex.ratio_table(pd.concat([sweep[sweep.initial_state], sweep[sweep.initial_state].assign(
        decay=0.1, gate_decay=0.1)]), "fused_shipped", by=("seq_len", "n_chunks"))
    for name, fig in (("e", plots.error_vs_chunks(sweep)), ("h", plots.ratio_heatmap(ratios)),
                      ("d", plots.ratio_vs_decay(ratios)), ("c", plots.ratio_vs_chunks(ratios))):
        path = plots.save_figure(fig, tmp_path, name)
        assert path.stat().st_size > 1000
    assert plots.save_figure(fig, None, "x") is None
    with pytest.raises(ValueError, match="plain file name"):
        plots.save_figure(fig, tmp_path, "../x")
    assert ex.save_table([sweep, sweep], tmp_path, "t").read_text().count("\n") == 2 * len(sweep) + 1


def test_gpu_slug():
    assert gpu_slug("NVIDIA H200") == "h200"
    assert gpu_slug("NVIDIA GeForce RTX 4090") == "geforce-rtx-4090"
    assert gpu_slug("AMD Radeon 8060S") == "radeon-8060s"


def test_cli_dispatch(monkeypatch, capsys):
    assert cli_main([]) == 0 and "reproduce" in capsys.readouterr().out
    assert cli_main(["nonsense"]) == 2
    seen = {}
    import gdnlab.compile_matrix as cm
    monkeypatch.setattr(cm, "main", lambda argv: seen.setdefault("argv", argv) and 0)
    assert cli_main(["compile-matrix", "--quick"]) == 0 and seen["argv"] == ["--quick"]
    assert cli_main(["reproduce", "--backend", "no_such_kernel", "--out", "/nonexistent/x"]) == 2


def _notebook(path: Path, body: str) -> None:
    nb = nbformat.v4.new_notebook()
    p = nbformat.v4.new_code_cell("out_dir = None\ndevice = 'cpu'")
    p.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell(f"# {path.stem} title"), p, nbformat.v4.new_code_cell(body)]
    nbformat.write(nb, path)


def test_failed_notebook_keeps_previous_report(tmp_path, monkeypatch):
    nbs, out, flag = tmp_path / "nb", tmp_path / "out", tmp_path / "fail-now"
    nbs.mkdir()
    write = ("import os\nos.makedirs(os.path.join(out_dir, 'tables'), exist_ok=True)\n"  # where save_table puts one
             "open(os.path.join(out_dir, 'tables', '{name}.csv'), 'w').write('x\\n1\\n')\nprint('{name} ran')")
    _notebook(nbs / "a_ok.ipynb", write.replace("{name}", "a"))
    _notebook(nbs / "b_flaky.ipynb", f"import os\nassert not os.path.exists({str(flag)!r}), 'told to fail'\n"
                                     + write.replace("{name}", "b"))
    assert reproduce(out=out, nb_dir=nbs, progress=False) == 0
    first = (out / "b_flaky.html").read_text()
    assert (out / "tables" / "b.csv").exists() and "b ran" in first and "print(" not in first  # code hidden
    flag.write_text("")
    assert reproduce(out=out, nb_dir=nbs, progress=False) == 1
    assert (out / "b_flaky.html").read_text() == first and (out / "tables" / "b.csv").exists()
    assert (out / "failed" / "b_flaky.html").exists()
    man = json.loads((out / "manifest.json").read_text())
    assert man["notebooks"]["a_ok"]["status"] == "ok" and man["notebooks"]["b_flaky"]["status"] == "failed"
    assert "told to fail" in man["notebooks"]["b_flaky"]["error"]
    index = (out / "index.html").read_text()
    assert "FAILED" in index and "previous report" in index and "b_flaky.html" in index
    assert not list(out.glob(".tmp-*"))
    flag.unlink()
    assert reproduce(out=out, nb_dir=nbs, progress=False, only=["flaky"]) == 0
    assert not (out / "failed" / "b_flaky.html").exists()
    assert math.isfinite(json.loads((out / "timings.json").read_text())["notebooks"]["b_flaky"])
    assert "seconds" not in json.loads((out / "manifest.json").read_text())["notebooks"]["a_ok"]


def test_reproduce_usage_errors(tmp_path):
    assert reproduce(out=tmp_path, only=["no-such-notebook"], progress=False) == 2
    assert reproduce(out=tmp_path, plugins=["no_such_module_xyz"], progress=False) == 2
    assert reproduce(out=tmp_path, device="tpu", progress=False) == 2
    assert isinstance(NotebookSpec("x", "y").quick, dict)


def test_templates_of_a_target_install_are_found(tmp_path, monkeypatch):
    """pip install --target DIR puts nbconvert's templates in DIR/share/jupyter: reproduce adds it to JUPYTER_PATH,
    once, and leaves a normal install (no such folder) alone."""
    from gdnlab.reproduce import add_target_jupyter_path
    pkg = tmp_path / "site" / "nbconvert" / "__init__.py"
    pkg.parent.mkdir(parents=True)
    pkg.touch()
    monkeypatch.setenv("JUPYTER_PATH", "/elsewhere")
    assert add_target_jupyter_path(pkg) is None  # no templates there
    (tmp_path / "site" / "share" / "jupyter" / "nbconvert" / "templates").mkdir(parents=True)
    share = add_target_jupyter_path(pkg)
    assert share == (tmp_path / "site" / "share" / "jupyter").resolve()
    assert os.environ["JUPYTER_PATH"].split(os.pathsep) == ["/elsewhere", str(share)]
    assert add_target_jupyter_path(pkg) is None  # already there
