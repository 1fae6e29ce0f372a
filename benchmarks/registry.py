"""Part name -> experiment: the module that runs it (its `run(ctx)` returns a table) and the file the table goes to."""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from benchmarks.context import Context


@dataclass(frozen=True)
class Experiment:
    """One part of a run: `module` (under benchmarks) holds `run(ctx) -> DataFrame` and either `OUTPUT` (a file
    name) or `output(ctx)` (a name that depends on the run's choices)."""

    name: str
    module: str
    summary: str

    def load(self) -> ModuleType:
        """The experiment's module (imported on first use; importing needs no GPU)."""
        return importlib.import_module(f"benchmarks.{self.module}")

    def output(self, ctx: Context) -> str:
        """The file name its table is written to under --out."""
        mod = self.load()
        return mod.output(ctx) if hasattr(mod, "output") else mod.OUTPUT


EXPERIMENTS: dict[str, Experiment] = {e.name: e for e in (
    Experiment("conformance", "conformance", "every case on every backend against the float64 reference"),
    Experiment("sweep", "sweep", "error vs chunk count to 1024 chunks in the report's regimes, every backend"),
    Experiment("mma_hardware", "mma_hardware", "the Hopper matrix-unit model against the tensor cores"),
    Experiment("prologue", "prologue_variants", "the prologue per solve form, warps and l2-norm placement"),
    Experiment("bench", "bench", "eager and graph time of every backend at every bench shape"),
    Experiment("breakdown", "breakdown", "kernel-level times per BV and warps"),
    Experiment("stages", "stages", "every stage alone, the fastest bit-equal config of each, against FLA"),
    Experiment("variants", "variants", "one study of candidate changes to fast (--study)"),
    Experiment("fla_tuning", "fla_tuning", "FLA's time after each re-tune of its autotuner"),
    Experiment("in_situ", "in_situ", "per-kernel device time inside whole graph-replayed calls"),
    Experiment("host", "host", "host time per eager call, and a cProfile of fast's"),
    Experiment("auto_overhead", "auto_overhead", "auto's dispatch cost and auto against fast+fn eagerly"),
    Experiment("concurrency", "concurrency", "two independent calls side by side on two streams against in turn"),
    Experiment("ncu", "ncu", "hardware counters of each kernel of one call (Nsight Compute)"),
)}
#: Earlier names of parts, still accepted on the command line.
ALIASES: dict[str, str] = {"mma": "mma_hardware"}
#: What a run does when --parts is not given.
DEFAULT_PARTS = ("conformance", "mma_hardware", "prologue", "bench", "breakdown")


def get(name: str) -> Experiment:
    """The experiment behind a part name (or alias); ValueError naming the known ones otherwise."""
    name = ALIASES.get(name, name)
    if name not in EXPERIMENTS:
        raise ValueError(f"part: unknown {name!r}; known: {', '.join(EXPERIMENTS)}")
    return EXPERIMENTS[name]
