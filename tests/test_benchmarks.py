"""The device benchmarks import and register on a CPU machine (their CUDA work is inside functions)."""
from __future__ import annotations

import ast
import importlib
import os
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
MODULES = sorted(p.stem for p in BENCH.glob("*.py") if p.stem not in ("h200",))


@pytest.mark.parametrize("name", MODULES)
def test_every_module_imports_without_a_gpu(name):
    importlib.import_module(f"benchmarks.{name}")


def test_every_part_names_a_module_with_run_and_an_output():
    from benchmarks.context import Context
    from benchmarks.registry import ALIASES, DEFAULT_PARTS, EXPERIMENTS, get
    ctx = Context(env={}, out="unused")
    for name, exp in EXPERIMENTS.items():
        mod = exp.load()
        assert callable(mod.run), name
        assert exp.output(ctx).endswith(".csv"), name
    assert set(DEFAULT_PARTS) <= set(EXPERIMENTS) and set(ALIASES.values()) <= set(EXPERIMENTS)
    assert get("mma") is EXPERIMENTS["mma_hardware"]
    with pytest.raises(ValueError, match="unknown"):
        get("nope")
    assert len({e.output(ctx) for e in EXPERIMENTS.values()}) == len(EXPERIMENTS)


def test_no_module_imports_another_scripts_private_names():
    for p in BENCH.glob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("benchmarks"):
                assert not [a.name for a in node.names if a.name.startswith("_")], (p.name, node.module)


def test_the_command_line_parses_every_part():
    from benchmarks.__main__ import parser
    from benchmarks.registry import EXPERIMENTS
    args = parser().parse_args(["--out", "x", "--parts", ",".join(EXPERIMENTS), "--variants", "depth"])
    assert args.study == "depth" and args.parts.split(",") == list(EXPERIMENTS)


def test_shapes_are_chosen_by_label_and_an_unknown_one_is_refused(tmp_path):
    from benchmarks.__main__ import main
    from benchmarks.context import Context
    from benchmarks.inputs import SHAPES, select_shapes
    assert select_shapes("") == SHAPES
    assert select_shapes("varlen,1x512") == [(1, 512), ("varlen", None)]  # in SHAPES' order
    with pytest.raises(ValueError, match="unknown 2x512; known: 1x512"):
        select_shapes("1x512,2x512")
    with pytest.raises(SystemExit):  # refused before anything runs or is written
        main(["--out", str(tmp_path / "run"), "--parts", "bench", "--shapes", "8x8"])
    assert not (tmp_path / "run").exists()
    ctx = Context(env={}, out=str(tmp_path), shapes=[(8, 2048)])
    assert ctx.bench_shapes() == [(8, 2048)] and Context(env={}, out="x").bench_shapes() == SHAPES


NCU_TEXT = """==PROF== Connected to process 4242 (/usr/bin/python3.12)
==PROF== Profiling "prologue_kernel" - 0: 0%....50%....100% - 38 passes
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","4242","python3.12","127.0.0.1","prologue_kernel","1","7","(64, 1, 1)","(512, 32, 1)","0","9.0","GPU Speed Of Light Throughput","DRAM Throughput","%","24.51"
"0","4242","python3.12","127.0.0.1","prologue_kernel","1","7","(64, 1, 1)","(512, 32, 1)","0","9.0","GPU Speed Of Light Throughput","Duration","us","1,942.15"
"1","4242","python3.12","127.0.0.1","fwd_h_kernel(int, float)","1","7","(128, 1, 1)","(4, 32, 1)","0","9.0","Launch Statistics","Registers Per Thread","register/thread","255"
"1","4242","python3.12","127.0.0.1","fwd_h_kernel(int, float)","1","7","(128, 1, 1)","(4, 32, 1)","0","9.0","Occupancy","Occupancy Limit Registers","block","n/a"
==PROF== Disconnected from process 4242
"""


def test_ncu_output_parses_to_one_row_per_kernel_and_metric():
    from benchmarks import ncu
    df = ncu.parse(NCU_TEXT)
    assert list(df.kernel) == ["prologue_kernel", "prologue_kernel", "fwd_h_kernel", "fwd_h_kernel"]
    assert df.value.iloc[1] == 1942.15 and df.value.iloc[2] == 255 and df.value.isna().iloc[3]
    assert list(df.launch) == [0, 0, 1, 1] and df.unit.iloc[0] == "%"
    with pytest.raises(ValueError, match="no CSV header"):
        ncu.parse("==PROF== No kernels were profiled.\n")


def test_ncu_part_records_a_missing_profiler_instead_of_stopping(monkeypatch):
    from benchmarks import ncu
    from benchmarks.context import Context
    monkeypatch.setattr(ncu, "ncu_path", lambda: None)
    env = dict(device="cpu", torch="t", triton="3", date="d")
    df = ncu.run(Context(env=env, out="unused", backends=["fast"]))
    assert len(df) == len(ncu.SHAPES) and df.error.str.contains("ncu not found").all()
    cmd = ncu.command("/x/ncu", "fast", 1, 32768)
    assert cmd[:3] == ["/x/ncu", "--clock-control", "none"] and cmd[-4:] == ["--target", "fast", "1", "32768"]
    assert "--metrics" in cmd and "--metrics" not in ncu.command("/x/ncu", "fast", 1, 32768, stalls=False)
    text = '"ID","Metric Name"\n==ERROR== Failed to find metric smsp__x_per_issue_active.ratio\n==PROF== done'
    assert ncu.metric_errors(text) == ["==ERROR== Failed to find metric smsp__x_per_issue_active.ratio"]
    assert ncu.metric_errors(NCU_TEXT) == []


def test_in_situ_rows_name_the_output_layout_fast_ran():
    """The in-situ part labels each fast row with the output blocks and the fusion fast's size rule picks there
    (for gdnlab.traffic), the caller's options over the rule, and nothing for other backends."""
    from benchmarks.in_situ import output_layout
    fused = dict(out_chunks=1, fused_output=True, walk_t=True)
    plain = dict(out_chunks=1, fused_output=False, walk_t=False)
    assert output_layout("fast", 8, 2048, 132) == fused and output_layout("fast", "varlen", 10900, 132) == fused
    assert output_layout("fast", 1, 32768, 132) == plain
    assert output_layout("fast[out_chunks=2]", 8, 2048, 132) == dict(plain, out_chunks=2)
    assert output_layout("fla", 8, 2048, 132) == dict(out_chunks=None, fused_output=None, walk_t=None)


def test_env_records_the_host_it_ran_on():
    from benchmarks.env import host_info
    h = host_info()
    assert h["cpus"] == os.cpu_count() and isinstance(h["cpu"], str) and h["cpu"] and h["name"]
    assert len(h["load_average"]) in (0, 3)


def test_peer_modes_keeps_the_scenarios_that_ran_when_stopped(tmp_path, monkeypatch):
    """modes.csv is written after every scenario: a call cut off (here Ctrl-C in the second scenario's process)
    keeps the first one's rows, and a scenario whose process failed is a row naming its exit status."""
    import subprocess
    import pandas as pd
    from benchmarks import peer_modes
    calls = []

    def fake_run(cmd, env):
        scenario = cmd[cmd.index("--child") + 1]
        calls.append(scenario)
        if scenario == "grad":
            raise KeyboardInterrupt
        if scenario == "alone":
            (tmp_path / "alone.json").write_text('[{"scenario": "alone", "backend": "two_kernel", "sha256": "ab"}]')
        return subprocess.CompletedProcess(cmd, 0 if scenario == "alone" else 3)

    monkeypatch.setattr(peer_modes.subprocess, "run", fake_run)
    with pytest.raises(KeyboardInterrupt):
        peer_modes.main(["--out", str(tmp_path), "--backend", "two_kernel", "--scenarios", "alone,after-small,grad",
                         "--device", "cpu"])
    rows = pd.read_csv(tmp_path / "modes.csv")
    assert calls == ["alone", "after-small", "grad"] and list(rows.scenario) == ["alone", "after-small"]
    assert rows.sha256[0] == "ab" and rows.error[1] == "process exited 3" and rows.kernels[0] == 0


def test_peer_modes_hashes_the_same_computation_alike_and_refuses_bad_shapes(tmp_path, monkeypatch):
    from benchmarks import peer_modes
    for bad in ("32768", "1x", "0x64", "ax64"):
        with pytest.raises(ValueError, match="BxT"):
            peer_modes.parse_shape(bad)
    heads = dict(H=1, HV=2, K=16, V=16)
    alone = peer_modes.run_scenario("alone", "two_kernel", [(1, 20)], heads, "cpu")
    grad = peer_modes.run_scenario("grad", "two_kernel", [(1, 20)], heads, "cpu")
    other = peer_modes.run_scenario("alone", "reference", [(1, 20)], heads, "cpu")
    assert alone[0]["sha256"] == grad[0]["sha256"] and not alone[0]["error"]  # the same kernels, the same bits
    monkeypatch.setitem(peer_modes.SCENARIOS, "tiny-first", {"before": [(1, 8, heads)]})
    assert alone[0]["before"] == 0 and peer_modes.run_scenario("tiny-first", "two_kernel", [(1, 20)], heads,
                                                               "cpu")[0]["before"] == 1
    assert other[0]["sha256"] != alone[0]["sha256"]  # another computation, another hash
    with pytest.raises(SystemExit):
        peer_modes.main(["--out", str(tmp_path), "--scenarios", "nope", "--device", "cpu"])
    assert peer_modes.main(["--out", str(tmp_path), "--scenarios", "alone", "--backend", "two_kernel",
                            "--shapes", "1x20", "--heads", "1,2,16,16", "--device", "cpu"]) == 0
    import pandas as pd
    rows = pd.read_csv(tmp_path / "modes.csv")  # the child process's row, as run_scenario gives it in this one
    assert list(rows.scenario) == ["alone"] and rows.sha256[0] == alone[0]["sha256"]
    assert rows.kernels[0] == 0  # the lab's kernels leave no TileLang cache
    for name, text in (("a/device_kernel.cu", "x"), ("b/device_kernel.cu", "y"), ("b/host_kernel.cu", "z")):
        (tmp_path / "cache" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "cache" / name).write_text(text)
    n, digest = peer_modes.kernel_sources(str(tmp_path / "cache"))
    (tmp_path / "cache" / "a").rename(tmp_path / "cache" / "c")  # another entry name, the same sources
    assert n == 2 and digest and peer_modes.kernel_sources(str(tmp_path / "cache")) == (2, digest)
    (tmp_path / "cache" / "c" / "device_kernel.cu").write_text("w")
    assert peer_modes.kernel_sources(str(tmp_path / "cache"))[1] != digest


def test_env_names_the_card_and_tolerates_a_missing_nvidia_smi(monkeypatch):
    """card_info reads nvidia-smi's fields by name, in order; without nvidia-smi every field is empty, never an
    error (a CPU machine, or a driver that does not answer)."""
    import subprocess
    from benchmarks import env

    asked = []

    def smi(cmd, **kw):
        asked.append(cmd)
        assert cmd[-2] == "--query-gpu=" + ",".join(env.CARD_FIELDS)
        return subprocess.CompletedProcess(cmd, 0, stdout="GPU-1234, 00000000:19:00.0, 96.00.AF, Enabled, 700.00 W, "
                                                         "1980 MHz\nGPU-other, x, y, z, w, v\n", stderr="")

    monkeypatch.setattr(env.subprocess, "run", smi)
    card = env.card_info()
    assert card["uuid"] == "GPU-1234" and card["pci.bus_id"] == "00000000:19:00.0"
    assert card["clocks.applications.graphics"] == "1980 MHz" and "--id" not in " ".join(asked[-1])
    env.card_info("1234-abcd")  # torch's uuid names the device: nvidia-smi is asked for that one
    assert asked[-1][1] == "--id=GPU-1234-abcd"

    def failing(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 6, stdout="No devices were found\n", stderr="")

    def missing(cmd, **kw):
        raise FileNotFoundError(cmd[0])

    for run in (failing, missing):
        monkeypatch.setattr(env.subprocess, "run", run)
        assert env.card_info() == dict.fromkeys(env.CARD_FIELDS, "")
