"""`gdnlab reproduce`: run every notebook with papermill and write the shareable reports.

For each notebook in :data:`NOTEBOOKS`: execute it (working directory notebooks/, the project's Jupyter kernel) in
a process of its own (``python -m gdnlab.reproduce --worker``) into a temporary folder ``.tmp-*`` inside the output
folder, with ``out_dir`` pointing there so that its tables and figures land beside it; export HTML without code
(nbconvert, ``exclude_input=True``; titled, linking back to the index); and only when all of that succeeded, move
``<name>.html``, ``figures/*.png``, ``tables/*.csv`` and ``timings/*`` into the output folder, replacing that
notebook's previous files. A notebook that fails leaves its previous files in place, gets ``failed/<name>.html``
(the executed notebook with code and traceback) and is marked failed in ``index.html``; the others still run, and
the command returns 1. A cell past ``--timeout`` fails its notebook with "timed out after N s in cell K".

Interrupts: Ctrl-C (SIGINT) or SIGTERM cancels the notebooks not yet started, kills the running ones (their kernels
exit with them), keeps every notebook that had finished, writes a manifest that says the run was interrupted, and
returns 130 within seconds; the notebooks that did not finish keep their previous reports. Temporary folders a killed
run (SIGKILL) left behind are removed when the next run starts.

``manifest.json`` records, per notebook, its status, parameters, files and findings; ``index.html`` is written from
it: the answers to the report's questions and the candidate's verdict first, then the headline table, every
notebook's labelled findings, figures and tables, the other tables found in ``tables/``, and the reports of other
devices in subfolders (e.g. ``h200/``). Neither holds a date or a wall time, so rerunning unchanged code leaves them
(and git) unchanged; wall times go to ``timings.json`` and ``timings/``, which are not committed.

A user's kernel: a module that calls ``gdnlab.backends.register_backend("my_kernel", fn)``, named with
``--plugin my_module`` (importable from the current directory), and ``--backend my_kernel`` makes it the candidate
"fused" kernel of every notebook (the lab's own backends still run beside it); each notebook judges it with
:func:`gdnlab.verdict.verdict` and asserts the verdict. Its reports go to ``reports/my_kernel/`` (``--out`` to
choose), never over the lab's own.
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
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tqdm import tqdm

__all__ = ["NotebookSpec", "NOTEBOOKS", "DEFAULT_BACKENDS", "DEFAULT_CANDIDATE", "notebooks_dir", "default_out",
           "gpu_slug", "ensure_kernel", "notebook_parameters", "declared_parameters", "discover", "reproduce",
           "write_index", "add_target_jupyter_path", "broken_links", "ANSWERS"]

#: The lab's own backends, run in every notebook; a user's --backend is added to them.
DEFAULT_BACKENDS = ["two_kernel", "fused_shipped", "fused_fixed"]
#: The candidate the lab's own reports judge (--backend's default).
DEFAULT_CANDIDATE = "fused_shipped"


@dataclass(frozen=True)
class NotebookSpec:
    """One notebook: its file stem in notebooks/, a title, and the parameters that differ from its own defaults
    (which are the CPU run's) in a ``--quick`` smoke run and on a CUDA device."""

    name: str
    title: str
    quick: dict[str, Any] = field(default_factory=dict)
    cuda: dict[str, Any] = field(default_factory=dict)
    #: Add the field's kernels (gdnlab.peers: FLA, FlashQLA, FlashInfer) to ``backends`` on CUDA, those registered.
    with_peers: bool = False


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
        with_peers=True),
    NotebookSpec(
        "02_bv_sweep", "BV sweep at seq_len 128",
        quick=dict(bvs=[32, 64], shape=_TINY), cuda=dict(shape=_CUTEDSL, num_warps=8)),
    NotebookSpec(
        "03_isolation", "Isolation: where the fused kernel's error enters", quick=dict(shape=_TINY),
        with_peers=True),
    NotebookSpec(
        "04_root_cause", "Root cause: ablation over the fused kernel's switches",
        quick=dict(seq_lens=[64, 128], shape=_TINY),
        cuda=dict(seq_lens=[63, 64, 128, 192, 1024, 8192])),
    NotebookSpec(
        "09_error_budget", "Where the error comes from: the two-kernel path's roundings, one at a time",
        quick=dict(tokens=256)),
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


def default_out(device: str, backend: str | None = None) -> Path:
    """reports/ on the CPU, reports/<gpu-name-slug>/ on CUDA; any candidate but the default (the shipped fused
    kernel, the one the lab's reports judge) gets a folder of its own below that, reports/[<gpu>/]<backend>/, so
    that it never overwrites the lab's reports."""
    root = Path("reports")
    if device == "cuda":
        import torch
        root = root / gpu_slug(torch.cuda.get_device_name())
    if backend is not None and backend != DEFAULT_CANDIDATE:
        root = root / re.sub(r"[^A-Za-z0-9_.-]+", "-", backend)
    return root


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
    from gdnlab.peers import PEERS

    p: dict[str, Any] = dict(device=device, quick=quick, out_dir=str(out_dir), progress=False, plugins=list(plugins))
    if device == "cuda":
        p.update(spec.cuda)
    if quick:
        p.update(spec.quick)
    extra = [b for b in PEERS if spec.with_peers and device == "cuda" and not quick and b in BACKENDS]
    if backend is not None:
        p["candidate"] = backend
        extra.append(backend)
    if extra:
        p["backends"] = list(dict.fromkeys(DEFAULT_BACKENDS + extra))
    return p


# ----------------------------------------------------------------------------------------------------- running

#: Files under these subfolders of a notebook's out_dir are its results; timings/ is volatile (not committed).
RESULT_DIRS = ("figures", "tables", "timings")
#: How a kernel that never came up reads (jupyter_client; two kernels started at once can race for a port): the
#: notebook ran no cell, so it is started again, up to KERNEL_STARTS times in all.
KERNEL_DIED = "Kernel died before replying to kernel_info"
KERNEL_STARTS = 3
#: Extra CSS for every notebook page: wide tables scroll inside the page instead of overflowing it.
_PAGE_CSS = ("<style>.jp-OutputArea-output table, .jp-RenderedHTMLCommon table{display:block;max-width:100%;"
             "overflow-x:auto}.gdnlab-nav{font-family:system-ui,sans-serif;margin:.5em 1em;font-size:.95em}</style>")


def _files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for sub in RESULT_DIRS for p in (root / sub).glob("*") if p.is_file())


def _export_html(nb_path: Path, html_path: Path, exclude_input: bool, title: str = "", index: str = "index.html") -> None:
    """The notebook as HTML: titled, with a link back to the reports' index at the top, wide tables scrolling."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(nb_path, as_version=4)
    for i, c in enumerate(nb.cells):  # papermill gives its injected cell a random id: the page would change each run
        if "injected-parameters" in c.get("metadata", {}).get("tags", []):
            c["id"] = f"injected-parameters-{i}"
        if "outputs" in c:
            c["outputs"] = _merged_streams(c["outputs"])
    exporter = HTMLExporter(exclude_input=exclude_input, exclude_input_prompt=exclude_input,
                            exclude_output_prompt=exclude_input)
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": title or nb_path.stem}})
    nav = (f"<nav class='gdnlab-nav'><a href='{index}'>&larr; gdnlab reports (index)</a> &middot; "
           f"{html.escape(nb_path.stem)}</nav>")
    body = _stable_style_ids(body)
    body = body.replace("</head>", _PAGE_CSS + "</head>", 1)
    body = re.sub(r"(<body[^>]*>)", lambda m: m.group(1) + nav, body, count=1)
    html_path.write_text(body, encoding="utf-8")


def _merged_streams(outputs: list[Any]) -> list[Any]:
    """A cell's outputs with each run of consecutive stream outputs of one stream (stdout, stderr) joined into one:
    the kernel sends printed text in as many messages as its flushes happened to make, so an unchanged notebook
    could otherwise render the same lines as one block in one run and as two in the next."""
    merged: list[Any] = []
    for out in outputs:
        prev = merged[-1] if merged else None
        if (out.get("output_type") == "stream" and prev is not None and prev.get("output_type") == "stream"
                and prev.get("name") == out.get("name")):
            prev["text"] = prev["text"] + out["text"]
        else:
            merged.append(out)
    return merged


def _stable_style_ids(page: str) -> str:
    """pandas' Styler names each table ``T_<5 random hex digits>`` (ids and CSS selectors): renumber them in order of
    appearance, so that a rerun writes the same page."""
    ids: dict[str, str] = {}

    def sub(m: re.Match[str]) -> str:
        return ids.setdefault(m.group(1), f"T_s{len(ids):04d}")

    return re.sub(r"\b(T_[0-9a-f]{5})(?=[_\"' {.:,>])", sub, page)


class _Control:
    """What an interrupt needs: a flag every worker thread reads, and the notebook processes to stop.

    SIGINT (Ctrl-C) or SIGTERM sets ``cancelled`` and kills each running notebook's process group (the notebook's
    Jupyter kernel, in a session of its own, exits when its parent does: ipykernel polls its parent). Pending
    notebooks are never started. A notebook that had finished before the interrupt is moved into place whole.
    """

    def __init__(self) -> None:
        import threading
        self.cancelled = threading.Event()
        self._procs: set[Any] = set()
        self._lock = threading.Lock()

    def start(self, args: list[str]) -> Any:
        """Start a notebook process in a session of its own (a terminal's Ctrl-C reaches only this process), or
        return None once the run is cancelled."""
        import subprocess
        with self._lock:
            if self.cancelled.is_set():
                return None
            proc = subprocess.Popen(args, start_new_session=True, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, text=True)
            self._procs.add(proc)
            return proc

    def done(self, proc: Any) -> None:
        with self._lock:
            self._procs.discard(proc)

    def cancel(self, signum: int | None = None, _frame: Any = None) -> None:
        """Signal handler: cancel the run and kill every running notebook process."""
        import signal
        self.cancelled.set()
        with self._lock:
            for p in self._procs:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


def _kept(entry: dict[str, Any], previous: dict[str, Any] | None) -> dict[str, Any]:
    """A notebook that did not finish keeps its previous report, files and findings (recorded in its entry)."""
    if previous and previous.get("files") is not None:
        entry["files"] = previous["files"]
        entry["html"] = previous.get("html")
        entry["findings"] = previous.get("findings", [])
    return entry


def _run_one(spec: NotebookSpec, params: dict[str, Any], nb_dir: Path, out: Path, tmp: Path,
             kernel: str, previous: dict[str, Any] | None, timeout: int | None,
             ctl: _Control | None = None) -> tuple[dict[str, Any], float]:
    """Execute one notebook (in a process of its own) into ``tmp`` and, on success, move its results into ``out``.
    Returns its manifest entry and its wall time."""
    ctl = ctl or _Control()
    t0 = time.time()
    declared = declared_parameters(nb_dir / f"{spec.name}.ipynb")
    params = {k: v for k, v in params.items() if k in declared}
    entry: dict[str, Any] = dict(title=spec.title, parameters={k: v for k, v in params.items() if k != "out_dir"})
    if ctl.cancelled.is_set():
        entry.update(status="cancelled", error="not started: the run was interrupted")
        return _kept(entry, previous), 0.0
    try:
        tmp.mkdir(parents=True)
        job = tmp / "job.json"
        job.write_text(json.dumps(dict(name=spec.name, title=spec.title, nb=str(nb_dir / f"{spec.name}.ipynb"),
                                       tmp=str(tmp), params=params, kernel=kernel, cwd=str(nb_dir),
                                       timeout=timeout)))
        proc = ctl.start([sys.executable, "-m", "gdnlab.reproduce", "--worker", str(job)])
        if proc is None:
            entry.update(status="cancelled", error="not started: the run was interrupted")
            return _kept(entry, previous), 0.0
        try:
            _, err = proc.communicate()
        finally:
            ctl.done(proc)
        if ctl.cancelled.is_set():
            entry.update(status="interrupted", error="stopped by an interrupt before it finished")
            return _kept(entry, previous), time.time() - t0
        res_path = tmp / "result.json"
        last = [ln for ln in (err or "").strip().splitlines() if ln.strip()][-1:] or ["no message"]
        res = json.loads(res_path.read_text()) if res_path.exists() else dict(
            ok=False, error=f"notebook process exited with {proc.returncode}: {last[0]}"[:2000])
        if res.get("ok"):
            files = _files_under(tmp)
            for old in (previous or {}).get("files", []):
                if old not in files:
                    (out / old).unlink(missing_ok=True)
            for f in files:
                (out / f).parent.mkdir(parents=True, exist_ok=True)
                os.replace(tmp / f, out / f)
            os.replace(tmp / f"{spec.name}.html", out / f"{spec.name}.html")
            (out / "failed" / f"{spec.name}.html").unlink(missing_ok=True)
            entry.update(status="ok", html=f"{spec.name}.html", files=files, findings=res.get("findings", []))
        else:
            entry.update(status="failed", error=res.get("error", "failed"))
            if (tmp / "failed.html").exists():
                (out / "failed").mkdir(parents=True, exist_ok=True)
                os.replace(tmp / "failed.html", out / "failed" / f"{spec.name}.html")
                entry["failed_html"] = f"failed/{spec.name}.html"
            _kept(entry, previous)
    except Exception as e:  # noqa: BLE001 - any failure is recorded; the other notebooks still run
        entry.update(status="failed", error=_first_error(e))
        _kept(entry, previous)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return entry, time.time() - t0


def _cell_of_timeout(executed: Path, message: str) -> tuple[int | None, str]:
    """(1-based index among the executed notebook's code cells, first source line) of the cell nbclient's timeout
    ``message`` previews between its dashed lines (papermill marks a timed-out cell "completed")."""
    import nbformat
    parts = re.split(r"^-{5,}$", message, flags=re.M)
    preview = parts[1].strip() if len(parts) >= 3 else ""
    try:
        nb = nbformat.read(executed, as_version=4)
    except Exception:  # noqa: BLE001
        return None, ""
    code = [c for c in nb.cells if c.cell_type == "code"]
    head = [ln for ln in preview.splitlines() if ln.strip() not in ("...", "…")]
    for i, c in enumerate(code, 1):
        if head and c.source.strip().splitlines()[:len(head)] == head:
            return i, next((ln.strip() for ln in c.source.splitlines() if ln.strip()), "")
    return None, ""


def _worker(job_path: str) -> int:
    """Run one notebook as ``python -m gdnlab.reproduce --worker JOB.json``: execute it with papermill into the
    job's tmp folder, export its HTML, and write ``result.json`` (ok, findings or error). Exit status 0 or 1. A
    kernel that dies before it answers (KERNEL_DIED: no cell has run) is started again, KERNEL_STARTS times in all."""
    import papermill as pm
    from nbclient.exceptions import CellTimeoutError

    job = json.loads(Path(job_path).read_text())
    tmp, name = Path(job["tmp"]), job["name"]
    executed = tmp / f"{name}.ipynb"
    result: dict[str, Any]
    try:
        for start in range(1, KERNEL_STARTS + 1):
            try:
                pm.execute_notebook(job["nb"], str(executed), parameters=job["params"], kernel_name=job["kernel"],
                                    language="python", cwd=job["cwd"], progress_bar=False, log_output=False,
                                    execution_timeout=job["timeout"],
                                    extra_arguments=["--IPKernelApp.log_level=ERROR"])
                break
            except RuntimeError as e:
                if KERNEL_DIED not in str(e) or start == KERNEL_STARTS:
                    raise
        _export_html(executed, tmp / f"{name}.html", exclude_input=True, title=job["title"])
        result = dict(ok=True, findings=_findings(executed))
    except CellTimeoutError as e:
        k, line = _cell_of_timeout(executed, str(e))
        where = f"in cell {k} ({line[:80]})" if k else "in a cell"
        result = dict(ok=False, error=f"timed out after {job['timeout']} s {where}", detail=str(e)[:2000])
    except Exception as e:  # noqa: BLE001
        result = dict(ok=False, error=_first_error(e))
    if not result["ok"] and executed.exists():
        try:
            _export_html(executed, tmp / "failed.html", exclude_input=False, title=f"FAILED: {job['title']}",
                         index="../index.html")
        except Exception:  # noqa: BLE001
            pass
    (tmp / "result.json").write_text(json.dumps(result))
    return 0 if result["ok"] else 1


def _findings(nb_path: Path) -> list[dict[str, str]]:
    """The claims a notebook displayed (gdnlab.findings.Finding renders as Markdown "**Finding.** ..."), each with
    the section heading above it and the function that checked it (the Markdown output's metadata)."""
    import nbformat
    nb = nbformat.read(nb_path, as_version=4)
    found, section = [], ""
    for c in nb.cells:
        if c.cell_type == "markdown":
            heads = [ln.lstrip("#").strip() for ln in c.source.splitlines() if ln.startswith("#")]
            section = heads[-1] if heads else section
            continue
        for out in c.get("outputs", []):
            md = out.get("data", {}).get("text/markdown", "")
            meta = out.get("metadata", {}).get("text/markdown", {})
            if md.startswith("**Finding.**"):
                found.append(dict(text=md.removeprefix("**Finding.**").strip(), section=section,
                                  source=str(meta.get("gdnlab_source", "")) if isinstance(meta, dict) else ""))
    return found


def _first_error(e: BaseException) -> str:
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip() and not set(ln.strip()) <= set("-=")]
    ename = getattr(e, "ename", type(e).__name__)
    evalue = getattr(e, "evalue", None)
    if evalue:
        return f"{ename}: {evalue}"[:2000]
    return (lines[-1] if lines else "".join(traceback.format_exception_only(type(e), e)).strip())[:2000]


def _clean_stale(out: Path) -> list[str]:
    """Remove what a killed run left in ``out`` (``.tmp-*`` folders and files); returns their names. Two runs must
    not write into one folder at the same time."""
    gone = []
    for p in sorted(out.glob(".tmp-*")):
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        gone.append(p.name)
    return gone


def broken_links(root: Path) -> list[str]:
    """Every relative ``href``/``src`` in the HTML pages under ``root`` whose target file does not exist, as
    "page -> target" (absolute URLs, ``data:`` URIs and in-page anchors are not checked)."""
    from urllib.parse import unquote, urlparse
    bad = []
    for page in sorted(root.rglob("*.html")):
        if any(part.startswith(".tmp-") for part in page.relative_to(root).parts):
            continue
        text = page.read_text(encoding="utf-8", errors="replace")
        for link in re.findall(r"""(?:href|src)\s*=\s*["']([^"'#]+)""", text):
            u = urlparse(link)
            if u.scheme or u.netloc or link.startswith(("data:", "javascript:", "mailto:")):
                continue
            if not (page.parent / unquote(u.path)).exists():
                bad.append(f"{page.relative_to(root)} -> {link}")
    return bad


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".tmp-{path.name}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


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


def reproduce(**kw: Any) -> int:
    """Run the notebooks of ``nb_dir`` (default notebooks/; those whose name contains one of ``only``, default
    all) and write the reports. ``specs`` None: :func:`discover` them. Keywords: those of :func:`_reproduce`.

    SIGINT and SIGTERM are handled from the first line on (before the slow imports), so an interrupt at any moment
    stops the run the same way. Returns 0 when every notebook ran, 1 when any failed, 2 on a usage error, 130 when
    interrupted.
    """
    ctl = _Control()
    old_handlers = _install_handlers(ctl)
    try:
        return _reproduce(ctl, **kw)
    finally:
        _restore_handlers(old_handlers)


def _reproduce(ctl: _Control, *, device: str = "cpu", backend: str | None = None, plugins: Sequence[str] = (),
               quick: bool = False, out: str | Path | None = None, only: Sequence[str] = (), jobs: int | None = None,
               kernel: str | None = None, specs: Sequence[NotebookSpec] | None = None,
               nb_dir: str | Path | None = None, timeout: int | None = None, progress: bool = True) -> int:
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
    if backend is not None and backend in _backends.UNAVAILABLE:
        print(f"gdnlab reproduce: --backend {backend!r} cannot run here: {_backends.UNAVAILABLE[backend]}",
              file=sys.stderr)
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

    out = Path(out) if out is not None else default_out(device, backend)
    out.mkdir(parents=True, exist_ok=True)
    out = out.resolve()
    stale = _clean_stale(out)
    if stale:
        print(f"gdnlab reproduce: removed {len(stale)} temporary item(s) an interrupted run left in {out}",
              file=sys.stderr)
    kernel = kernel or ensure_kernel()
    jobs = jobs or (min(2, os.cpu_count() or 1) if device == "cpu" else 1)
    if jobs > 1:
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # notebooks in parallel: one core each, not two threads each
    os.environ.setdefault("MKL_CBWR", "COMPATIBLE")  # float64 results that do not depend on memory alignment
    manifest = _load_manifest(out)
    manifest.setdefault("notebooks", {})

    t0 = time.time()
    results: dict[str, dict[str, Any]] = {}
    walls: dict[str, float] = {}
    if ctl.cancelled.is_set():
        print("gdnlab reproduce: interrupted before any notebook started; nothing changed", file=sys.stderr)
        return 130
    bar = tqdm(total=len(chosen), desc="notebooks", unit="nb", disable=not progress)
    pool = ThreadPoolExecutor(max_workers=jobs)
    futs: dict[Any, NotebookSpec] = {}
    try:
        for s in chosen:
            tmp = out / f".tmp-{s.name}"  # the same path every run: a notebook that prints it reads the same
            params = notebook_parameters(s, device=device, quick=quick, out_dir=tmp, backend=backend,
                                         plugins=plugins)
            futs[pool.submit(_run_one, s, params, nb_dir, out, tmp, kernel, manifest["notebooks"].get(s.name),
                             timeout, ctl)] = s
        pending = set(futs)
        while pending:
            done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            for f in done:
                s = futs[f]
                results[s.name], walls[s.name] = f.result()
                bar.set_postfix_str(f"{s.name}: {results[s.name]['status']} ({walls[s.name]:.0f}s)")
                bar.update()
    except KeyboardInterrupt:  # raised where our handler is not installed (not the main thread): stop the same way
        ctl.cancel()
    finally:
        if ctl.cancelled.is_set():
            pool.shutdown(wait=True, cancel_futures=True)
            for f, s in futs.items():
                if s.name not in results and f.done() and not f.cancelled() and f.exception() is None:
                    results[s.name], walls[s.name] = f.result()
            for s in chosen:
                if s.name not in results:
                    results[s.name] = _kept(dict(title=s.title, status="cancelled",
                                                 error="not started: the run was interrupted"),
                                            manifest["notebooks"].get(s.name))
        else:
            pool.shutdown(wait=True)
        bar.close()
        _clean_stale(out)

    for s in specs:  # keep the manifest in notebook order
        if s.name in results:
            manifest["notebooks"][s.name] = results[s.name]
    manifest["notebooks"] = {s.name: manifest["notebooks"][s.name] for s in specs if s.name in manifest["notebooks"]}
    interrupted = ctl.cancelled.is_set()
    # Nothing in manifest.json or index.html changes from one run of the same code on the same machine to the next
    # (no dates, no wall times), so a rerun leaves git clean. Wall times go to timings.json, which is not committed.
    for volatile in ("generated_at", "seconds"):
        manifest.pop(volatile, None)
    manifest.update(environment=_environment(device), quick=quick, candidate=backend or DEFAULT_CANDIDATE,
                    command="gdnlab reproduce " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["reproduce"]
                    else "gdnlab reproduce")
    if interrupted:
        manifest["interrupted"] = ("The last run was interrupted: notebooks marked INTERRUPTED or CANCELLED keep "
                                   "their previous report.")
    else:
        manifest.pop("interrupted", None)
    _write_atomic(out / "manifest.json", json.dumps(manifest, indent=1, default=str) + "\n")
    timings = dict(finished_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                   seconds=round(time.time() - t0, 1), notebooks={n: round(w, 1) for n, w in walls.items()})
    _write_atomic(out / "timings.json", json.dumps(timings, indent=1) + "\n")
    write_index(out, manifest)
    if interrupted:
        kept = [n for n, r in results.items() if r["status"] == "ok"]
        print(f"gdnlab reproduce: interrupted; {len(kept)} notebook(s) finished and replaced "
              f"({', '.join(kept) or 'none'}), the others keep their previous reports -> {out / 'index.html'}",
              file=sys.stderr)
        return 130
    failed = [n for n, r in results.items() if r["status"] != "ok"]
    for n in failed:
        print(f"gdnlab reproduce: {n} FAILED: {results[n].get('error')}", file=sys.stderr)
    print(f"gdnlab reproduce: {len(results) - len(failed)}/{len(results)} notebooks ok in "
          f"{time.time() - t0:.0f}s -> {out / 'index.html'}", file=sys.stderr)
    return 1 if failed else 0


def _install_handlers(ctl: _Control) -> dict[int, Any] | None:
    """SIGINT and SIGTERM cancel the run (only possible from the main thread; elsewhere nothing is installed)."""
    import signal
    import threading
    if threading.current_thread() is not threading.main_thread():
        return None
    return {sig: signal.signal(sig, ctl.cancel) for sig in (signal.SIGINT, signal.SIGTERM)}


def _restore_handlers(old: dict[int, Any] | None) -> None:
    import signal
    for sig, h in (old or {}).items():
        signal.signal(sig, h)


# -------------------------------------------------------------------------------------------------------- index

_CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.6em 0;display:block;max-width:100%;overflow-x:auto}
td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}.ok{color:#176f2c;font-weight:600}
.failed,.interrupted,.cancelled{color:#b00020;font-weight:600}img{max-width:320px;border:1px solid #ddd;margin:.3em}
code{background:#f4f4f4}.small{color:#666;font-size:.9em}.answer{background:#f6f8fb;border-left:4px solid #4a6fa5;
padding:.4em 1em;margin:1em 0}.answer dt{font-weight:600;margin-top:.5em}.answer dd{margin-left:1em}
.pass{color:#176f2c;font-weight:700}.fail{color:#b00020;font-weight:700}"""

#: The report's questions, the finding that answers each (by the function that checks it) and the notebook whose
#: instance to prefer (its first one otherwise), in reading order.
ANSWERS: tuple[tuple[str, str, str], ...] = (
    ("Does the lab reproduce the report's numbers?", "reproduces_report", "01"),
    ("What causes the fused kernel's excess error?", "intra_operand_explains", "04"),
    ("Does the fix change any output?", "bit_equal_to_baseline", "03"),  # 03 compares the final state too
    ("What does the fix cost?", "fix_is_free", "07"),
    ("Is the defect specific to one GPU architecture?", "answer", "06"),
    ("What happens to BV = 8?", "bv8_by_release", "05"),
    ("Do the field's kernels (FLA, FlashQLA, FlashInfer) pass the same suite?", "peers_conform", "08"),
)


def _answer_block(out: Path, manifest: dict[str, Any]) -> str:
    """The findings that answer the report's questions, each linked to the notebook that computed it, and the
    candidate's verdict: the first thing on the index."""
    nbs = manifest.get("notebooks", {})
    items = []
    cand = str(manifest.get("candidate", ""))
    for q, source, prefer in ANSWERS:
        hits = [(n, f) for n, r in nbs.items() for f in r.get("findings", []) if isinstance(f, dict)
                and f.get("source") == source]
        hit = next((h for h in hits if h[0].startswith(prefer)), hits[0] if hits else None)
        if hit is None:
            continue
        n, f = hit
        href = nbs[n].get("html") or f"{n}.html"
        items.append(f"<dt>{html.escape(q)}</dt><dd>{html.escape(f['text'])} <a href='{href}'>({html.escape(n)})"
                     f"</a></dd>")
    verdict = ""
    said = next(((n, f["text"]) for n, r in nbs.items() if r.get("status") == "ok" for f in r.get("findings", [])
                 if isinstance(f, dict) and f.get("source") == "candidate_verdict"), None)
    refused = next(((n, r.get("error", "")) for n, r in nbs.items() if r.get("status") == "failed"
                    and "its verdict" in r.get("error", "")), None)
    if refused:  # a notebook asserted the verdict and it did not hold: that is the answer about this candidate
        n, text = refused
        href = nbs[n].get("failed_html") or nbs[n].get("html") or f"{n}.html"
        verdict = (f"<p><b>Candidate <code>{html.escape(cand)}</code>: <span class='fail'>FAIL</span></b> &mdash; "
                   f"{html.escape(text)} <a href='{href}'>({html.escape(n)})</a></p>")
    elif said:
        n, text = said
        word = "PASS" if ": PASS" in text else "FAIL"
        csv = " <a href='tables/verdict.csv'>verdict.csv</a>" if (out / "tables" / "verdict.csv").exists() else ""
        verdict = (f"<p><b>Candidate <code>{html.escape(cand)}</code>: <span class='{word.lower()}'>{word}</span>"
                   f"</b> &mdash; {html.escape(text)} <a href='{nbs[n].get('html') or n + '.html'}'>({html.escape(n)})"
                   f"</a>{csv}</p>")
    if not items and not verdict:
        return ""
    return (f"<div class='answer'><h2>What the lab found</h2>{verdict}"
            f"{'<dl>' + ''.join(items) + '</dl>' if items else ''}<p class='small'>Each answer is a finding "
            f"computed and asserted by the notebook it links to; the tables below are the evidence. A summary of the "
            f"report these questions come from: docs/report.md in the repository.</p></div>")


def _headline(out: Path, manifest: dict[str, Any]) -> str:
    path = out / "tables" / "report_table.csv"
    if not path.exists():
        if "01_seq_len_sweep" in manifest.get("notebooks", {}):
            return "<p>(no headline table: notebook 01 has not finished successfully in this folder)</p>"
        return "<p class='small'>(notebook 01, which measures this table, was not run into this folder)</p>"
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


def _claims_html(found: list[Any]) -> str:
    """A notebook's findings grouped under the section headings they appeared under."""
    groups: dict[str, list[str]] = {}
    for f in found:
        if isinstance(f, str):
            f = dict(text=f, section="")
        groups.setdefault(f.get("section", ""), []).append(f"<li>{html.escape(f['text'])}</li>")
    return "".join((f"<p class='small'><b>{html.escape(sec)}</b></p>" if sec else "") +
                   f"<ul class='small'>{''.join(items)}</ul>" for sec, items in groups.items())


def write_index(out: Path, manifest: dict[str, Any]) -> Path:
    """Write ``out/index.html`` from the manifest and the files present: the answers first, then the headline
    table, then every notebook with its labelled findings, figures and tables. Nothing in it depends on when or how
    fast the run went, so a rerun that changes nothing writes the same page."""
    e = manifest.get("environment", {})
    rows, claimed = [], set()
    for name, r in manifest.get("notebooks", {}).items():
        claimed.update(r.get("files", []))
        status = f"<span class='{r['status']}'>{r['status'].upper()}</span>"
        if r["status"] != "ok":
            status += f"<br><span class='small'>{html.escape(r.get('error', ''))}</span>"
            if r.get("failed_html") and (out / r["failed_html"]).exists():
                status += f"<br><a href='{r['failed_html']}'>executed notebook with traceback</a>"
        link = f"<a href='{r['html']}'>{html.escape(r['title'])}</a>" if r.get("html") and (out / r["html"]).exists() \
            else html.escape(r["title"])
        if r["status"] != "ok" and r.get("html"):
            link += "<br><span class='small'>previous report (kept from an earlier run)</span>"
        files = [f for f in r.get("files", []) if not f.startswith("timings/")]
        figs = "".join(f"<a href='{f}'><img src='{f}' alt='{f}'></a>" for f in files if f.endswith(".png"))
        tabs = " ".join(f"<a href='{f}'>{Path(f).name}</a>" for f in files if f.endswith(".csv"))
        claims = _claims_html(r.get("findings", [])) if r["status"] == "ok" else ""
        rows.append(f"<tr><td>{name}</td><td>{link}</td><td>{status}</td>"
                    f"<td style='text-align:left'>{tabs}</td></tr><tr><td></td><td colspan=3 style='text-align:left'>"
                    f"{claims}{figs}</td></tr>")
    other = [str(p.relative_to(out)) for p in sorted((out / "tables").glob("*.csv")) if str(p.relative_to(out))
             not in claimed] if (out / "tables").exists() else []
    subs = []
    for d in sorted(p for p in out.iterdir() if p.is_dir() and not p.name.startswith(".")
                    and p.name not in ("figures", "tables", "failed", "timings")):
        target = next((f for f in ("index.html",) if (d / f).exists()), None)
        listing = [str(f.relative_to(out)) for f in sorted(d.rglob("*")) if f.suffix in (".html", ".csv", ".md", ".json")]
        if target:
            subs.append(f"<li><a href='{d.name}/{target}'>{d.name}/</a></li>")
        elif listing:
            subs.append(f"<li>{d.name}/: " + ", ".join(f"<a href='{f}'>{Path(f).name}</a>" for f in listing[:30]) + "</li>")
    up = "<p class='small'><a href='../index.html'>&larr; the reports one folder up</a></p>" \
        if (out.parent / "index.html").exists() else ""
    warn = f"<p class='failed'>{html.escape(manifest['interrupted'])}</p>" if manifest.get("interrupted") else ""
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>gdnlab reports</title>
<style>{_CSS}</style></head><body>
{up}<h1>gdnlab reports</h1>
<p class="small">Written by <code>{html.escape(str(manifest.get('command', '')))}</code>
on {html.escape(e.get('device', '?'))} (torch {html.escape(e.get('torch', '?'))},
Triton {html.escape(e.get('triton', '?'))}, Python {html.escape(e.get('python', '?'))}){' &mdash; <b>quick smoke run</b>' if manifest.get('quick') else ''}.
Candidate fused kernel: <code>{html.escape(str(manifest.get('candidate', '')))}</code>.</p>
{warn}{_answer_block(out, manifest)}
<h2>Headline: the report's first table</h2>
{_headline(out, manifest)}
<h2>Notebooks</h2>
<table><tr><th></th><th>report</th><th>status</th><th>tables</th></tr>
{''.join(rows)}</table>
{'<h2>Other tables</h2><p>' + ' '.join(f"<a href='{f}'>{Path(f).name}</a>" for f in other) + '</p>' if other else ''}
{'<h2>Other devices and tools</h2><ul>' + ''.join(subs) + '</ul>' if subs else ''}
</body></html>
"""
    path = out / "index.html"
    _write_atomic(path, page)
    return path


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    sys.exit(_worker(sys.argv[2]))
