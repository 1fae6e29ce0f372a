"""The speed notes' candidate rules as data, each written once: the candidates, the class of shapes and the bounds a
rule of docs/speed-notes.md names before its run, the device call that measures it and, once the run is in, the
verdict recorded in the notes. `python -m benchmarks --rule N` runs the call; `CandidateRule.judge` applies the rule
to the run's tables (gdnlab.adoption.judge_rule), and `CandidateRule.confirm` raises where a rerun of the verdict
disagrees with the recorded one, so a notebook that states a verdict fails with its data.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass

import pandas as pd

from gdnlab.adoption import RULE_PARTS, judge_rule, speed_pick
from gdnlab.findings import Finding, _fail

#: One sequence from 4096 tokens: the class where fast's prologue runs more than eight programs a multiprocessor
#: (32 value heads on 132), which items 70, 72 and 73 are decided for.
ONE_LONG_SEQUENCE = ("1x4096", "1x8192", "1x32768", "1x65536")
#: Every bench shape (benchmarks.inputs.SHAPES, labelled), for a rule that holds at every call.
EVERY_SHAPE = ("1x512", "1x1024", "1x2048", "1x4096", "1x8192", "1x32768", "1x65536", "8x2048", "4x8192", "varlen")


@dataclass(frozen=True)
class CandidateRule:
    """A rule of the speed notes' form from item 70 on: fast takes the fastest of `candidates` at the class `shapes`
    if it is at most `worst` times fast's graph time at every shape and at most `best` at one or more (None: no gain
    asked, `worst` is a cost bound; replays equal), in budget in every conformance case, and in each sweep regime of
    `accuracy` ((regime, factor), ...) at most that factor times fast's max and mean error at 1024 chunks. `tests`
    selects the GPU tests the call runs first (`pytest -k`). `recorded`: the parts the notes record as missed after
    the run (() for none: the rule adopted its candidate), None while it is not run."""

    item: int
    title: str
    candidates: tuple[str, ...]
    shapes: tuple[str, ...] = ONE_LONG_SEQUENCE
    worst: float = 1.01
    best: float | None = 0.97
    accuracy: tuple[tuple[str, float], ...] = (("slow_gate", 1.0),)
    tests: str = ""
    parts: tuple[str, ...] = ("conformance", "sweep", "bench", "in_situ")
    recorded: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if not self.candidates or "fast" in self.candidates:
            raise ValueError(f"item {self.item}: candidates are configurations of fast, not fast itself")
        if not (self.worst >= 1 and (self.best is None or 0 < self.best <= 1)):
            raise ValueError(f"item {self.item}: bounds need worst >= 1 and best None or in (0, 1], got {self.worst}, "
                             f"{self.best}")
        if not self.accuracy or any(f <= 0 for _, f in self.accuracy):
            raise ValueError(f"item {self.item}: accuracy needs (regime, factor > 0) pairs, got {self.accuracy}")
        if self.recorded is not None and set(self.recorded) - set(RULE_PARTS):
            raise ValueError(f"item {self.item}: recorded misses {self.recorded} are not parts of {RULE_PARTS}")

    @property
    def backends(self) -> tuple[str, ...]:
        """fast and the candidates, in the order the call checks and times them."""
        return ("fast", *self.candidates)

    def describe(self) -> str:
        """The rule in one line."""
        gain = "" if self.best is None else f", <= {self.best}x at one"
        errors = "; ".join(f"{regime} <= {'' if f == 1.0 else f'{f}x '}fast's" for regime, f in self.accuracy)
        return (f"graph time <= {self.worst}x fast's at every shape of the class{gain}; every conformance case in "
                f"budget; max and mean error at 1024 chunks: {errors}")

    def benchmarks_settings(self) -> dict[str, str]:
        """The options of `python -m benchmarks` that measure this rule (what its --rule sets)."""
        return {"parts": ",".join(self.parts), "shapes": ",".join(self.shapes), "backends": ",".join(self.backends)}

    def device_command(self, out: str = "$OUT") -> str:
        """The whole device call, as one shell line: the rule's GPU tests (their summary kept as pytest.txt), then
        `python -m benchmarks --rule N` into `out`/item<N>. `out` is left unquoted so that $OUT expands."""
        folder = f"{out}/item{self.item}"
        tests = (f"python -m pytest -q tests/test_gpu.py -k {shlex.quote(self.tests)} -p no:cacheprovider "
                 f"> {folder}/pytest.txt 2>&1; tail -3 {folder}/pytest.txt; ") if self.tests else ""
        return (f"mkdir -p {folder} && {tests}python -m benchmarks --out {folder} --rule {self.item} 2>&1 "
                f"| tee {folder}/log.txt")

    def judge(self, bench: pd.DataFrame, conformance: pd.DataFrame, sweep: pd.DataFrame
              ) -> tuple[pd.DataFrame, str | None]:
        """The rule applied to one run's tables: adoption.judge_rule's verdict table and the candidate adopted."""
        return judge_rule(bench, conformance, sweep, list(self.candidates), list(self.shapes), worst=self.worst,
                          best=self.best, accuracy=dict(self.accuracy))

    def confirm(self, table: pd.DataFrame, adopted: str | None) -> Finding:
        """The recorded verdict, recomputed: raises unless the candidate the rule picks (adoption.speed_pick, else
        the fastest) missed exactly the recorded parts (or, recorded clean, was adopted)."""
        if self.recorded is None:
            raise _fail(f"item {self.item}: no verdict is recorded yet; judge the run and record it first", None)
        fastest = speed_pick(table) or table.geomean.idxmin()
        missed = tuple(p for p in table.loc[fastest, "misses"].split(", ") if p)
        if missed != self.recorded or (adopted is not None) != (not self.recorded):
            raise _fail(f"item {self.item}: the run's verdict differs from the recorded one",
                        {"recorded": self.recorded, "missed": missed, "adopted": adopted})
        what = f"adopts {adopted}" if adopted else f"misses {', '.join(missed)} ({fastest})"
        return Finding(f"Item {self.item}'s rule {what}, as the speed notes record.",
                       {"adopted": adopted, "missed": list(missed), "geomean": float(table.loc[fastest, "geomean"])})


#: Every candidate rule of the speed notes in this form, by item.
RULES: dict[int, CandidateRule] = {r.item: r for r in (
    CandidateRule(70, "T and W stored, U's product in the walk (walk_tw)", ("fast[walk_tw=True]",), tests="walk_tw",
                  recorded=("conformance", "speed", "max_abs_err")),
    CandidateRule(72, "W and U formed apart from the solve (wu_apart)",
                  ("fast[wu_apart=True;wu_warps=4]", "fast[wu_apart=True;wu_warps=8]"), tests="wu-apart"),
    CandidateRule(73, "the W/U walk warp-specialised through tensor descriptors (walk_ws)",
                  ("fast[walk_ws=True]", "fast[walk_ws=True;num_stages=3]"), tests="walk-ws or walk_ws"),
    CandidateRule(74, "the gated scores as two bf16 terms (split_scores)", ("fast[split_scores=True]",),
                  shapes=EVERY_SHAPE, worst=1.02, best=None, accuracy=(("cutedsl_gate", 0.95), ("slow_gate", 1.0)),
                  tests="split-scores"),
)}


def get(item: int) -> CandidateRule:
    """The rule of speed-notes item `item`; a KeyError naming the items that have one."""
    if item not in RULES:
        raise KeyError(f"speed-notes item {item} has no candidate rule here (items with one: "
                       f"{', '.join(map(str, RULES))})")
    return RULES[item]


def pending() -> list[CandidateRule]:
    """The rules written and not yet run: the next device session's calls."""
    return [r for r in RULES.values() if r.recorded is None]
