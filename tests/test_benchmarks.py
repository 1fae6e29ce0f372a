"""The device benchmarks import and register on a CPU machine (their CUDA work is inside functions)."""
from __future__ import annotations

import ast
import importlib
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
