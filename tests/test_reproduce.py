"""`gdnlab reproduce` when it is stopped: Ctrl-C returns within seconds and leaves the reports as they were, stale
temporary folders are removed, a cell timeout names its cell; plugin runs write to their own folder. Tiny notebooks
(no kernels run), so each test costs a few kernel starts."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gdnlab.reproduce import default_out, reproduce
from test_experiments import _notebook  # tests/ is on sys.path (rootdir conftest, no package)


def _tree(out: Path) -> dict[str, str]:
    """Every committed-kind file under out (not timings) -> its hash."""
    return {str(p.relative_to(out)): hashlib.sha1(p.read_bytes()).hexdigest() for p in sorted(out.rglob("*"))
            if p.is_file() and p.name != "timings.json" and "timings" not in p.parts}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.xdist_group("notebooks")
def test_ctrl_c_and_sigterm_return_fast_and_leave_reports_intact(tmp_path):
    nbs, out, slow = tmp_path / "nb", tmp_path / "out", tmp_path / "be-slow"
    nbs.mkdir()
    table = ("import pandas as pd\nfrom gdnlab.experiments import save_table\n"
             "save_table(pd.DataFrame({{'x': [{v}]}}), out_dir, '{name}')\n")
    # A styled table (pandas names it with random hex) and a printed temporary path: both must read the same on rerun.
    _notebook(nbs / "a_quick.ipynb", table.format(v=1, name="a") +
              "display(pd.DataFrame({'x': [1.0]}).style.format('{:.2f}'))\nprint(out_dir)")
    _notebook(nbs / "b_slow.ipynb", f"import os, time, pathlib\n"
              f"pathlib.Path({str(tmp_path / 'kernel.pid')!r}).write_text(str(os.getpid()))\n"
              f"while os.path.exists({str(slow)!r}):\n    time.sleep(0.2)\n" + table.format(v=2, name="b"))
    assert reproduce(out=out, nb_dir=nbs, progress=False, jobs=2) == 0
    # A twice-rerun of unchanged notebooks leaves every committed file byte-identical.
    before = _tree(out)
    assert reproduce(out=out, nb_dir=nbs, progress=False, jobs=2) == 0
    assert _tree(out) == before
    slow.write_text("")
    for sig in (signal.SIGINT, signal.SIGTERM):  # Ctrl-C, and what a scheduler or `kill` sends
        _interrupt(sig, tmp_path, nbs, out, before)


def _interrupt(sig: int, tmp_path: Path, nbs: Path, out: Path, before: dict[str, str]) -> None:
    """Start a run whose second notebook waits, send ``sig`` once its kernel runs, and check the run stopped within
    seconds, left every report file as it was, removed its temporary folders, said so, and stopped the kernel."""
    (out / ".tmp-b_slow-deadbeef").mkdir()  # what a SIGKILLed run leaves
    script = (f"import sys; from gdnlab.reproduce import reproduce; "
              f"sys.exit(reproduce(out={str(out)!r}, nb_dir={str(nbs)!r}, progress=False, jobs=2))")
    pid_file = tmp_path / "kernel.pid"
    pid_file.unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not pid_file.exists() and time.time() < deadline:
        time.sleep(0.2)
    assert pid_file.exists(), "the slow notebook never started"
    time.sleep(0.5)
    assert not list(out.glob(".tmp-b_slow-deadbeef")), "a stale temporary folder was not removed at start"
    t0 = time.time()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    took = time.time() - t0
    assert proc.returncode == 130, err[-2000:]
    assert took < 10, f"{signal.Signals(sig).name} took {took:.1f} s"
    assert not list(out.glob(".tmp-*")), list(out.glob(".tmp-*"))
    man = json.loads((out / "manifest.json").read_text())
    assert "interrupted" in man and man["notebooks"]["b_slow"]["status"] in ("interrupted", "cancelled")
    after = _tree(out)
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    assert changed <= {"manifest.json", "index.html"}, changed  # every report file as it was
    assert "INTERRUPTED" in (out / "index.html").read_text() or "CANCELLED" in (out / "index.html").read_text()
    kernel = int(pid_file.read_text())
    deadline = time.time() + 10
    while _pid_alive(kernel) and time.time() < deadline:
        time.sleep(0.2)
    assert not _pid_alive(kernel), "the interrupted notebook's kernel is still running"


@pytest.mark.xdist_group("notebooks")
def test_timeout_names_the_cell(tmp_path):
    nbs, out = tmp_path / "nb", tmp_path / "out"
    nbs.mkdir()
    _notebook(nbs / "c_hangs.ipynb", "import time\ntime.sleep(60)")
    t0 = time.time()
    assert reproduce(out=out, nb_dir=nbs, progress=False, timeout=2) == 1
    assert time.time() - t0 < 50
    err = json.loads((out / "manifest.json").read_text())["notebooks"]["c_hangs"]["error"]
    assert err.startswith("timed out after 2 s in cell ") and "(import time)" in err, err
    assert (out / "failed" / "c_hangs.html").exists()


def test_plugin_reports_go_to_their_own_folder():
    assert default_out("cpu") == Path("reports")
    assert default_out("cpu", "fused_shipped") == Path("reports")  # the candidate the lab's reports judge
    assert default_out("cpu", "fused_fixed") == Path("reports") / "fused_fixed"  # another: never over them
    assert default_out("cpu", "my_kernel") == Path("reports") / "my_kernel"


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_lab_installs_only_when_needed_and_runs_as_root(tmp_path):
    """`make lab` installs JupyterLab once (a stamp), not on every start, and passes --allow-root exactly when run
    as root (Jupyter refuses root otherwise)."""
    root = Path(__file__).resolve().parents[1]
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / ".installed").touch()
    cmd = ["make", "-n", "-C", str(root), "lab", f"VENV={venv}"]
    first = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    assert "pip install" in first and "jupyter lab" in first  # not installed yet: installs
    (venv / ".lab-installed").touch()
    again = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    assert "pip install" not in again and "jupyter lab" in again
    assert ("--allow-root" in again) == (os.geteuid() == 0)


@pytest.mark.parametrize("deaths, ok", [(1, True), (3, False)])
def test_a_kernel_that_dies_before_it_answers_is_started_again(tmp_path, monkeypatch, deaths, ok):
    """A notebook whose kernel dies at start (two kernels racing for a port) is run again, up to KERNEL_STARTS
    starts; any other error, or a kernel dying every time, fails the notebook with that error."""
    import papermill

    from gdnlab import reproduce as rp
    calls = []

    def execute(nb, out, **kw):
        calls.append(out)
        if len(calls) <= deaths:
            raise RuntimeError(rp.KERNEL_DIED)
        Path(out).write_text("{}")

    monkeypatch.setattr(papermill, "execute_notebook", execute)
    monkeypatch.setattr(rp, "_export_html", lambda *a, **k: None)
    monkeypatch.setattr(rp, "_findings", lambda nb: [])
    job = tmp_path / "job.json"
    job.write_text(json.dumps(dict(tmp=str(tmp_path), name="n", nb="n.ipynb", params={}, kernel="python3",
                                   cwd=str(tmp_path), timeout=None, title="n")))
    assert rp._worker(str(job)) == (0 if ok else 1)
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["ok"] is ok and len(calls) == min(deaths + 1, rp.KERNEL_STARTS)
    assert ok or rp.KERNEL_DIED in result["error"]


def test_printed_lines_render_the_same_however_the_kernel_split_them(tmp_path):
    """The same printed text, sent as one stream message or as two, exports to the same page; stdout and stderr
    and outputs between them stay apart."""
    import nbformat

    from gdnlab import reproduce as rp

    def page(outputs):
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell("print('a'); print('b')", id="c0", outputs=outputs)]
        src, html_path = tmp_path / "n.ipynb", tmp_path / "n.html"
        nbformat.write(nb, src)
        rp._export_html(src, html_path, exclude_input=True)
        return html_path.read_text()

    out = nbformat.v4.new_output
    one = page([out("stream", name="stdout", text="line a\nline b\n")])
    two = page([out("stream", name="stdout", text="line a\n"), out("stream", name="stdout", text="line b\n")])
    assert one == two
    apart = page([out("stream", name="stdout", text="line a\n"), out("stream", name="stderr", text="line b\n")])
    assert apart != one
    assert rp._merged_streams([out("stream", name="stdout", text="x"), out("display_data", data={"text/plain": "d"}),
                               out("stream", name="stdout", text="y")])[2]["text"] == "y"
