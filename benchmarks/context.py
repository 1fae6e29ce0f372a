"""What every experiment of a run shares: the environment, the output folder and the command line's choices."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gdnlab


@dataclass
class Context:
    """One run of `python -m benchmarks`. `backends`: the backends to check and time (None: every registered one but
    the reference, read when a part starts, so that candidates a part registered are included)."""

    env: dict[str, Any]
    out: str
    backends: list[str] | None = None
    conformance_backends: list[str] | None = None
    study: str = "small"
    fla_tokens: tuple[int, ...] = (2048, 32768)
    probe_ok: set[tuple[str, int, int]] | None = None
    reps: int = 1000
    #: The bench shapes (B, T) the shape-by-shape parts run (None: all of benchmarks.inputs.SHAPES).
    shapes: list[tuple[Any, Any]] | None = None
    _bandwidth: list[float] = field(default_factory=list)

    def timed(self) -> list[str]:
        """The backends the timing parts run."""
        return self.backends or [b for b in gdnlab.BACKENDS if b != "reference"]

    def bench_shapes(self) -> list[tuple[Any, Any]]:
        """The bench shapes this run times."""
        from benchmarks.inputs import SHAPES
        return self.shapes if self.shapes is not None else list(SHAPES)

    def checkpoint(self, name: str, df: Any) -> None:
        """Write a part's rows so far to its output file, so that a run cut short (a device call's time limit)
        keeps the shapes it finished; the part's full table overwrites it when the part ends."""
        import os
        df.to_csv(os.path.join(self.out, name), index=False)

    def bandwidth(self) -> float:
        """The device's copy bandwidth (bytes/s), measured on first use."""
        if not self._bandwidth:
            from benchmarks.env import log
            from benchmarks.timing import copy_bandwidth
            self._bandwidth.append(copy_bandwidth())
            log("copy bandwidth GB/s", self._bandwidth[0] / 1e9)
        return self._bandwidth[0]
