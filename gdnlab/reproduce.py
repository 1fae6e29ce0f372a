"""`gdnlab reproduce`: run every notebook with papermill and write the shareable reports.

For each notebook in :data:`NOTEBOOKS`: execute it (working directory notebooks/, the project's Jupyter kernel) into
a temporary folder inside the output folder, with ``out_dir`` pointing there so that its tables and figures land
beside it; export HTML without code (nbconvert, ``exclude_input=True``); and only when all of that succeeded, move
``<name>.html``, ``figures/*.png`` and ``tables/*.csv`` into the output folder, replacing that notebook's previous
files. A notebook that fails leaves its previous files in place, gets ``failed/<name>.html`` (the executed notebook
with code and traceback) and is marked failed in ``index.html``; the others still run, and the command returns 1.

``manifest.json`` in the output folder records, per notebook, its status, time, parameters and files; ``index.html``
is written from it and links every notebook's report, figures and tables, the other tables found in ``tables/``,
and the reports of other devices in subfolders (e.g. ``h200/``).

A user's kernel: a module that calls ``gdnlab.backends.register_backend("my_kernel", fn)``, named with
``--plugin my_module`` (importable from the current directory), and ``--backend my_kernel`` makes it the candidate
"fused" kernel of every notebook (the lab's own backends still run beside it).
"""
from __future__ import annotations

import html
import json
import os
import re
import shutil
import sys
import time
import traceback
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tqdm import tqdm

__all__ = ["NotebookSpec", "NOTEBOOKS", "DEFAULT_BACKENDS", "notebooks_dir", "default_out", "gpu_slug",
           "ensure_kernel", "notebook_parameters", "declared_parameters", "discover", "reproduce", "write_index",
           "add_target_jupyter_path"]

#: The lab's own backends, run in every notebook; a user's --backend is added to them.
DEFAULT_BACKENDS = ["two_kernel", "fused_shipped", "fused_fixed"]


@dataclass(frozen=True)
class NotebookSpec:
    """One notebook: its file stem in notebooks/, a title, and the parameters that differ from its own defaults
    (which are the CPU run's) in a ``--quick`` smoke run and on a CUDA device."""

    name: str
    title: str
    quick: dict[str, Any] = field(default_factory=dict)
    cuda: dict[str, Any] = field(default_factory=dict)
    #: Peer backends added to ``backends`` on CUDA when registered there (e.g. flash-linear-attention's "fla").
    gpu_peers: tuple[str, ...] = ()


_TINY = {"H": 1, "HV": 1, "K": 64, "V": 64}
_CUTEDSL = {"H": 4, "HV": 8, "K": 128, "V": 128}

NOTEBOOKS: tuple[NotebookSpec, ...] = (
    NotebookSpec(
        "01_seq_len_sweep", "Sequence-length sweep: the report's first table, extended",
        quick=dict(fit_decays=[0.001], sweep_shape=_TINY, sweep_chunks=[1, 2, 4], grid_decays=[0.001, 1.0],
                   grid_chunks=[1, 2]),
        cuda=dict(sweep_shape=_CUTEDSL, sweep_chunks=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024],
                  fit_decays=[None, 1.0, 0.1, 0.03, 0.01, 0.003, 0.001, 0.0003, 0.0001],
                  fit_h0_scales=[0.02, 0.05, 0.1], grid_decays=[None, 1.0, 0.1, 0.01, 0.003, 0.001, 0.0001],
                  grid_chunks=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024], grid_shape=_CUTEDSL),
        gpu_peers=("fla",)),
    NotebookSpec(
        "02_bv_sweep", "BV sweep at seq_len 128",
        quick=dict(bvs=[32, 64], shape=_TINY), cuda=dict(shape=_CUTEDSL, num_warps=8)),
    NotebookSpec(
        "03_isolation", "Isolation: where the fused kernel's error enters", quick=dict(shape=_TINY),
        gpu_peers=("fla",)),
    NotebookSpec(
        "04_root_cause", "Root cause: ablation over the fused kernel's switches",
        quick=dict(seq_lens=[64, 128], shape=_TINY),
        cuda=dict(seq_lens=[63, 64, 128, 192, 1024, 8192])),
)


def discover(nb_dir: Path, known: Sequence[NotebookSpec] = NOTEBOOKS) -> list[NotebookSpec]:
    """Every notebook in ``nb_dir`` in name order: the known ones with their presets, any other with none (its
    title read from its first Markdown heading)."""
    import nbformat

    by_name = {s.name: s for s in known}
    specs = []
    for path in sorted(nb_dir.glob("*.ipynb")):
        if path.stem in by_name:
            specs.append(by_name[path.stem])
            continue
        nb = nbformat.read(path, as_version=4)
        heads = [ln.lstrip("# ").strip() for c in nb.cells if c.cell_type == "markdown"
                 for ln in c.source.splitlines() if ln.startswith("#")]
        specs.append(NotebookSpec(path.stem, heads[0] if heads else path.stem))
    return specs


def declared_parameters(path: Path) -> list[str]:
    """Names assigned in the notebook's cell tagged ``parameters`` (papermill passes only these)."""
    import ast

    import nbformat
    nb = nbformat.read(path, as_version=4)
    for c in nb.cells:
        if c.cell_type == "code" and "parameters" in c.metadata.get("tags", []):
            tree = ast.parse(c.source)
            return [t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
                    for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                    if isinstance(t, ast.Name)]
    return []


def notebooks_dir() -> Path:
    """The repository's notebooks/ folder (the package is installed editable from the repository)."""
    return Path(__file__).resolve().parents[1] / "notebooks"


def gpu_slug(name: str) -> str:
    """A folder name for a GPU: ``"NVIDIA H200"`` -> ``"h200"``."""
    s = re.sub(r"^(nvidia|amd)\s+", "", name.strip(), flags=re.I)
    s = re.sub(r"[^a-z0-9]+", "-", s.lower()).strip("-")
    return s or "gpu"


def default_out(device: str) -> Path:
    """reports/ on the CPU, reports/<gpu-name-slug>/ on CUDA."""
    if device == "cuda":
        import torch
        return Path("reports") / gpu_slug(torch.cuda.get_device_name())
    return Path("reports")


def _spec_runs_here(argv0: str) -> bool:
    return argv0 in ("python", "python3", sys.executable) or \
        Path(argv0).parent.absolute() == Path(sys.executable).parent.absolute()


def ensure_kernel(name: str = "gdnlab") -> str:
    """Name of a Jupyter kernel that runs this Python: ``name``, registered (sys-prefix) when missing or pointing at
    another Python; falls back to ``python3`` if a user-level spec of that name shadows ours."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    def usable(n: str) -> bool:
        try:
            return _spec_runs_here(KernelSpecManager().get_kernel_spec(n).argv[0])
        except NoSuchKernel:
            return False

    if usable(name):
        return name
    from ipykernel.kernelspec import install
    install(kernel_name=name, display_name=f"{name} ({Path(sys.prefix).name})", prefix=sys.prefix)
    if usable(name):
        return name
    if usable("python3"):
        print(f"gdnlab: kernel {name!r} points at another Python; using 'python3'", file=sys.stderr)
        return "python3"
    raise RuntimeError(f"no Jupyter kernel runs {sys.executable}; run `{sys.executable} -m ipykernel install "
                       f"--sys-prefix --name {name}`")


def notebook_parameters(spec: NotebookSpec, *, device: str, quick: bool, out_dir: Path | str,
                        backend: str | None = None, plugins: Sequence[str] = ()) -> dict[str, Any]:
    """The papermill parameters of one notebook run."""
    from gdnlab.backends import BACKENDS

    p: dict[str, Any] = dict(device=device, quick=quick, out_dir=str(out_dir), progress=False, plugins=list(plugins))
    if device == "cuda":
        p.update(spec.cuda)
    if quick:
        p.update(spec.quick)
    extra = [b for b in spec.gpu_peers if device == "cuda" and b in BACKENDS]
    if backend is not None:
        p["candidate"] = backend
        extra.append(backend)
    if extra:
        p["backends"] = list(dict.fromkeys(DEFAULT_BACKENDS + extra))
    return p


# ----------------------------------------------------------------------------------------------------- running

def _files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for sub in ("figures", "tables") for p in (root / sub).glob("*")
                  if p.is_file())


def _export_html(nb_path: Path, html_path: Path, exclude_input: bool) -> None:
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(nb_path, as_version=4)
    exporter = HTMLExporter(exclude_input=exclude_input, exclude_input_prompt=exclude_input,
                            exclude_output_prompt=exclude_input)
    body, _ = exporter.from_notebook_node(nb)
    html_path.write_text(body, encoding="utf-8")


def _run_one(spec: NotebookSpec, params: dict[str, Any], nb_dir: Path, out: Path, tmp: Path,
             kernel: str, previous: dict[str, Any] | None, timeout: int | None) -> dict[str, Any]:
    """Execute one notebook into ``tmp`` and, on success, move its results into ``out``. Returns its manifest
    entry."""
    import papermill as pm

    t0 = time.time()
    declared = declared_parameters(nb_dir / f"{spec.name}.ipynb")
    params = {k: v for k, v in params.items() if k in declared}
    entry: dict[str, Any] = dict(title=spec.title, parameters={k: v for k, v in params.items() if k != "out_dir"},
                                 ran_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    executed = tmp / f"{spec.name}.ipynb"
    try:
        tmp.mkdir(parents=True)
        pm.execute_notebook(str(nb_dir / f"{spec.name}.ipynb"), str(executed), parameters=params,
                            kernel_name=kernel, language="python", cwd=str(nb_dir), progress_bar=False, log_output=False,
                            execution_timeout=timeout, extra_arguments=["--IPKernelApp.log_level=ERROR"])
        _export_html(executed, tmp / f"{spec.name}.html", exclude_input=True)
        found = _findings(executed)
        files = _files_under(tmp)
        for old in (previous or {}).get("files", []):
            if old not in files:
                (out / old).unlink(missing_ok=True)
        for f in files:
            (out / f).parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp / f, out / f)
        os.replace(tmp / f"{spec.name}.html", out / f"{spec.name}.html")
        (out / "failed" / f"{spec.name}.html").unlink(missing_ok=True)
        entry.update(status="ok", seconds=round(time.time() - t0, 1), html=f"{spec.name}.html", files=files,
                     findings=found)
    except Exception as e:  # noqa: BLE001 - any failure is recorded; the other notebooks still run
        entry.update(status="failed", seconds=round(time.time() - t0, 1), error=_first_error(e))
        if executed.exists():
            (out / "failed").mkdir(parents=True, exist_ok=True)
            try:
                _export_html(executed, out / "failed" / f"{spec.name}.html", exclude_input=False)
                entry["failed_html"] = f"failed/{spec.name}.html"
            except Exception:  # noqa: BLE001
                pass
        if previous and previous.get("files") is not None:
            entry["files"] = previous["files"]
            entry["html"] = previous.get("html")
            entry["previous_ok_at"] = previous.get("ran_at") if previous.get("status") == "ok" \
                else previous.get("previous_ok_at")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return entry


def _findings(nb_path: Path) -> list[str]:
    """The claims a notebook displayed (gdnlab.findings.Finding renders as Markdown "**Finding.** ...")."""
    import nbformat
    nb = nbformat.read(nb_path, as_version=4)
    return [out["data"]["text/markdown"].removeprefix("**Finding.**").strip() for c in nb.cells
            if c.cell_type == "code" for out in c.get("outputs", [])
            if out.get("data", {}).get("text/markdown", "").startswith("**Finding.**")]


def _first_error(e: BaseException) -> str:
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    ename = getattr(e, "ename", type(e).__name__)
    evalue = getattr(e, "evalue", None)
    if evalue:
        return f"{ename}: {evalue}"[:2000]
    return (lines[-1] if lines else "".join(traceback.format_exception_only(type(e), e)).strip())[:2000]


def _load_manifest(out: Path) -> dict[str, Any]:
    try:
        return json.loads((out / "manifest.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {"notebooks": {}}


def _environment(device: str) -> dict[str, str]:
    import torch
    from gdnlab.experiments import device_name
    from gdnlab.interp import triton_version
    return dict(device=device_name(device), torch=torch.__version__, triton=triton_version(),
                python=sys.version.split()[0])


def add_target_jupyter_path(package_file: str | Path | None = None) -> Path | None:
    """Put the `share/jupyter` folder next to nbconvert on JUPYTER_PATH: `pip install --target DIR` (how wheels are
    carried to a machine without a registry) leaves nbconvert's HTML templates in DIR/share/jupyter, where Jupyter
    does not look. Returns the folder added, or None."""
    if package_file is None:
        import nbconvert
        package_file = nbconvert.__file__
    share = Path(package_file).resolve().parents[1] / "share" / "jupyter"
    paths = [p for p in os.environ.get("JUPYTER_PATH", "").split(os.pathsep) if p]
    if not (share / "nbconvert" / "templates").is_dir() or str(share) in paths:
        return None
    os.environ["JUPYTER_PATH"] = os.pathsep.join(paths + [str(share)])
    return share


def reproduce(*, device: str = "cpu", backend: str | None = None, plugins: Sequence[str] = (), quick: bool = False,
              out: str | Path | None = None, only: Sequence[str] = (), jobs: int | None = None,
              kernel: str | None = None, specs: Sequence[NotebookSpec] | None = None,
              nb_dir: str | Path | None = None, timeout: int | None = None, progress: bool = True) -> int:
    """Run the notebooks of ``nb_dir`` (default notebooks/; those whose name contains one of ``only``, default
    all) and write the reports. ``specs`` None: :func:`discover` them.

    Returns 0 when every notebook ran, 1 when any failed, 2 on a usage error.
    """
    from gdnlab import backends as _backends
    from gdnlab.experiments import load_plugins

    if device not in ("cpu", "cuda"):
        print(f"gdnlab reproduce: --device must be cpu or cuda, got {device!r}", file=sys.stderr)
        return 2
    if device == "cuda":
        import torch
        if not torch.cuda.is_available():
            print("gdnlab reproduce: --device cuda but no CUDA device is available", file=sys.stderr)
            return 2
    add_target_jupyter_path()
    # Plugins must import both here (to check --backend) and in each notebook's kernel, which starts in notebooks/.
    os.environ["PYTHONPATH"] = os.pathsep.join([os.getcwd(), *filter(None, [os.environ.get("PYTHONPATH")])])
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        load_plugins(plugins)
    except ImportError as e:
        print(f"gdnlab reproduce: --plugin: {e}", file=sys.stderr)
        return 2
    if backend is not None and backend not in _backends.BACKENDS:
        print(f"gdnlab reproduce: --backend {backend!r} is not registered (known: {', '.join(_backends.BACKENDS)});"
              f" name the module that registers it with --plugin", file=sys.stderr)
        return 2
    nb_dir = Path(nb_dir).resolve() if nb_dir is not None else notebooks_dir()
    specs = list(specs) if specs is not None else discover(nb_dir)
    chosen = [s for s in specs if not only or any(o in s.name for o in only)]
    if not chosen:
        print(f"gdnlab reproduce: --only {list(only)} matches none of {[s.name for s in specs]}", file=sys.stderr)
        return 2

    out = Path(out) if out is not None else default_out(device)
    out.mkdir(parents=True, exist_ok=True)
    out = out.resolve()
    kernel = kernel or ensure_kernel()
    jobs = jobs or (min(2, os.cpu_count() or 1) if device == "cpu" else 1)
    if jobs > 1:
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # notebooks in parallel: one core each, not two threads each
    manifest = _load_manifest(out)
    manifest.setdefault("notebooks", {})
    run_tag = uuid.uuid4().hex[:8]

    t0 = time.time()
    results: dict[str, dict[str, Any]] = {}
    bar = tqdm(total=len(chosen), desc="notebooks", unit="nb", disable=not progress)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futs = {}
        for s in chosen:
            tmp = out / f".tmp-{s.name}-{run_tag}"
            params = notebook_parameters(s, device=device, quick=quick, out_dir=tmp, backend=backend,
                                         plugins=plugins)
            futs[pool.submit(_run_one, s, params, nb_dir, out, tmp, kernel, manifest["notebooks"].get(s.name),
                             timeout)] = s
        for f in as_completed(futs):
            s = futs[f]
            results[s.name] = f.result()
            bar.set_postfix_str(f"{s.name}: {results[s.name]['status']} ({results[s.name]['seconds']}s)")
            bar.update()
    bar.close()

    for s in specs:  # keep the manifest in notebook order
        if s.name in results:
            manifest["notebooks"][s.name] = results[s.name]
    manifest["notebooks"] = {s.name: manifest["notebooks"][s.name] for s in specs if s.name in manifest["notebooks"]}
    manifest.update(generated_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    environment=_environment(device), quick=quick, candidate=backend or "fused_shipped",
                    command="gdnlab reproduce " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["reproduce"]
                    else "gdnlab reproduce", seconds=round(time.time() - t0, 1))
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, default=str) + "\n")
    write_index(out, manifest)
    failed = [n for n, r in results.items() if r["status"] != "ok"]
    for n in failed:
        print(f"gdnlab reproduce: {n} FAILED: {results[n].get('error')}", file=sys.stderr)
    print(f"gdnlab reproduce: {len(results) - len(failed)}/{len(results)} notebooks ok in "
          f"{time.time() - t0:.0f}s -> {out / 'index.html'}", file=sys.stderr)
    return 1 if failed else 0


# -------------------------------------------------------------------------------------------------------- index

_CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.6em 0}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}.ok{color:#176f2c;font-weight:600}
.failed{color:#b00020;font-weight:600}img{max-width:320px;border:1px solid #ddd;margin:.3em}code{background:#f4f4f4}
.small{color:#666;font-size:.9em}"""


def _headline(out: Path) -> str:
    path = out / "tables" / "report_table.csv"
    if not path.exists():
        return "<p>(no headline table yet: notebook 01 has not run successfully)</p>"
    import pandas as pd
    from gdnlab.experiments import report_view
    t = pd.read_csv(path)
    view = report_view(t)
    first = t.iloc[0]
    regime = f"regime <code>{html.escape(str(first.regime))}</code>" + (
        f", gate mean(-g) = {first.decay:g}" if pd.notna(first.get("decay")) else "") + \
        f", initial state scale {first.h0_scale:g}"
    fmt = {c: ("{:.1f}" if c.startswith("ratio") or c == "worst factor" else "{:.2e}") for c in view.columns}
    body = view.to_html(formatters={c: (lambda f: (lambda v: f.format(v)))(f) for c, f in fmt.items()},
                        border=0)
    return (f"<p>The report's first table, measured here on <b>{html.escape(str(first.device))}</b> (torch "
            f"{html.escape(str(first.torch))}, Triton {html.escape(str(first.triton))}, seed {first.seed}) with "
            f"{regime}; {html.escape(str(t.baseline.iloc[0]))} vs {html.escape(str(t.candidate.iloc[0]))}, "
            f"max abs error of the output against the float64 reference. The report's numbers are its own "
            f"(gfx1151).</p>{body}")


def write_index(out: Path, manifest: dict[str, Any]) -> Path:
    """Write ``out/index.html`` from the manifest and the files present."""
    e = manifest.get("environment", {})
    rows, claimed = [], set()
    for name, r in manifest.get("notebooks", {}).items():
        claimed.update(r.get("files", []))
        status = f"<span class='{r['status']}'>{r['status'].upper()}</span>"
        if r["status"] != "ok":
            status += f"<br><span class='small'>{html.escape(r.get('error', ''))}</span>"
            if r.get("failed_html"):
                status += f"<br><a href='{r['failed_html']}'>executed notebook with traceback</a>"
        link = f"<a href='{r['html']}'>{html.escape(r['title'])}</a>" if r.get("html") and (out / r["html"]).exists() \
            else html.escape(r["title"])
        if r["status"] != "ok" and r.get("html"):
            link += f"<br><span class='small'>previous report (from {r.get('previous_ok_at') or 'an earlier run'})</span>"
        files = r.get("files", [])
        figs = "".join(f"<a href='{f}'><img src='{f}' alt='{f}'></a>" for f in files if f.endswith(".png"))
        tabs = " ".join(f"<a href='{f}'>{Path(f).name}</a>" for f in files if f.endswith(".csv"))
        claims = "".join(f"<li>{html.escape(c)}</li>" for c in r.get("findings", []))
        claims = f"<ul class='small'>{claims}</ul>" if claims and r["status"] == "ok" else ""
        rows.append(f"<tr><td>{name}</td><td>{link}</td><td>{status}</td><td>{r.get('seconds', '')} s</td>"
                    f"<td style='text-align:left'>{tabs}</td></tr><tr><td></td><td colspan=4 style='text-align:left'>"
                    f"{claims}{figs}</td></tr>")
    other = [str(p.relative_to(out)) for p in sorted((out / "tables").glob("*.csv")) if str(p.relative_to(out))
             not in claimed] if (out / "tables").exists() else []
    subs = []
    for d in sorted(p for p in out.iterdir() if p.is_dir() and not p.name.startswith(".")
                    and p.name not in ("figures", "tables", "failed")):
        target = next((f for f in ("index.html",) if (d / f).exists()), None)
        listing = [str(f.relative_to(out)) for f in sorted(d.rglob("*")) if f.suffix in (".html", ".csv", ".md", ".json")]
        if target:
            subs.append(f"<li><a href='{d.name}/{target}'>{d.name}/</a></li>")
        elif listing:
            subs.append(f"<li>{d.name}/: " + ", ".join(f"<a href='{f}'>{Path(f).name}</a>" for f in listing[:30]) + "</li>")
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>gdnlab reports</title>
<style>{_CSS}</style></head><body>
<h1>gdnlab reports</h1>
<p class="small">Generated {html.escape(str(manifest.get('generated_at', '')))} by <code>{html.escape(str(manifest.get('command', '')))}</code>
in {manifest.get('seconds', '?')} s on {html.escape(e.get('device', '?'))} (torch {html.escape(e.get('torch', '?'))},
Triton {html.escape(e.get('triton', '?'))}, Python {html.escape(e.get('python', '?'))}){' &mdash; <b>quick smoke run</b>' if manifest.get('quick') else ''}.
Candidate fused kernel: <code>{html.escape(str(manifest.get('candidate', '')))}</code>.</p>
<h2>Headline: the report's first table</h2>
{_headline(out)}
<h2>Notebooks</h2>
<table><tr><th></th><th>report</th><th>status</th><th>time</th><th>tables</th></tr>
{''.join(rows)}</table>
{'<h2>Other tables</h2><p>' + ' '.join(f"<a href='{f}'>{Path(f).name}</a>" for f in other) + '</p>' if other else ''}
{'<h2>Other devices and tools</h2><ul>' + ''.join(subs) + '</ul>' if subs else ''}
</body></html>
"""
    path = out / "index.html"
    path.write_text(page, encoding="utf-8")
    return path
