"""The speed notes' adoption rules as findings: a candidate configuration of fast against fast, from the tables of
one device run (bench.csv for time, conformance.csv and sweep.csv for accuracy). A rule is written in
docs/speed-notes.md before its run; these functions apply it to the run's data and raise when it fails, so a notebook
that states an adoption is recomputed, and fails, with its data.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from gdnlab.backends import fast_options
from gdnlab.field import in_budget
from gdnlab.findings import Finding, _fail
from gdnlab.speed import _ratio

def _true(col: pd.Series) -> pd.Series:
    """A CSV column of booleans (read as bool or as text) as bool; missing is False."""
    return col.astype(str).eq("True")


def shapes_where(shapes: Mapping[str, Sequence[int]], *, HV: int, V: int, sms: int, **taken: Any) -> list[str]:
    """The labels of `shapes` (label -> sequence lengths) at which fast's options (gdnlab.backends.fast_options)
    include every `taken` option with its value: the class of shapes a size rule gives an option."""
    return [label for label, lengths in shapes.items()
            if all(fast_options(lengths, HV=HV, V=V, sms=sms).get(k) == v for k, v in taken.items())]


def _replays_equal(bench: pd.DataFrame, candidate: str, shapes: Sequence[str], rule: str) -> None:
    """Raise (naming `rule`) unless `candidate` was timed at every one of `shapes` and every replay there equalled
    its output."""
    rows = bench[(bench.backend == candidate) & bench["shape"].isin(list(shapes))]
    if set(shapes) - set(rows["shape"]):
        raise _fail(f"{rule}: no {candidate} rows at {', '.join(sorted(set(shapes) - set(rows['shape'])))}",
                    sorted(set(bench.backend)))
    if "replays_equal" not in rows or not _true(rows.replays_equal).all():
        raise _fail(f"{rule}: {candidate}'s replays do not all equal its output", rows.get("replays_equal"))


def fast_takes(options: Mapping[str, Any], cls: Sequence[str], shapes: Mapping[str, Sequence[int]], *, HV: int,
               V: int, sms: int) -> Finding:
    """The last step of an adoption: fast as the code is now (gdnlab.backends.fast_options) takes every one of
    `options` at each shape of the class `cls` (labels of `shapes`, label -> sequence lengths) the rule was decided
    for; raises where it does not, so a notebook stating the adoption fails when the code stops following it."""
    taken = shapes_where(shapes, HV=HV, V=V, sms=sms, **options)
    missing = [s for s in cls if s not in taken]
    if not cls or missing:
        raise _fail(f"fast_takes: fast does not take {dict(options)} at {', '.join(missing) or 'an empty class'}",
                    taken)
    return Finding(f"fast takes {', '.join(f'{k}={v!r}' for k, v in options.items())} at {', '.join(cls)}.",
                   {"class": list(cls), "taken at": taken})


def runs_as(bench: pd.DataFrame, candidate: str, shapes: Sequence[str]) -> Finding:
    """After an adoption, on the device: fast's output is bit-equal to `candidate`'s at every shape of the class (the
    bench's bit_equal_fast) and both replay equal to their output, so fast computes what the rule judged."""
    rows = bench[(bench.backend == candidate) & bench["shape"].isin(list(shapes))]
    missing = sorted(set(shapes) - set(rows["shape"]))
    if not len(shapes) or missing or "bit_equal_fast" not in rows or not _true(rows.bit_equal_fast).all():
        raise _fail(f"runs_as: fast is not bit-equal to {candidate} at every one of {', '.join(shapes)}",
                    rows.set_index("shape").get("bit_equal_fast"))
    for b in (candidate, "fast"):
        _replays_equal(bench, b, shapes, "runs_as")
    return Finding(f"fast's output is bit-equal to {candidate}'s at {', '.join(shapes)}, and both replay equal.",
                   dict(shapes=list(shapes)))


def speed_rule(bench: pd.DataFrame, candidate: str, shapes: Sequence[str], *, baseline: str = "fast",
               worst: float = 1.01, best: float = 0.97, timing: str = "graph_ms") -> Finding:
    """The speed half of an adoption rule: at every shape of the class (labels as gdnlab.speed.load_bench gives
    them) `candidate` takes at most `worst` times `baseline`'s time and at one or more at most `best`, and its
    replays (plan, CUDA graph) equal its own output."""
    r = _ratio(bench, candidate, baseline, timing)
    missing = sorted(set(shapes) - set(r.index))
    if missing:
        raise _fail(f"speed_rule: no {candidate} / {baseline} time at {', '.join(missing)}", sorted(r.index))
    r = r.loc[list(shapes)]
    _replays_equal(bench, candidate, shapes, "speed_rule")
    if r.max() > worst or r.min() > best:
        raise _fail(f"speed_rule: {candidate} misses the rule (at most {worst}x at every shape, at most {best}x at "
                    f"one or more)", r.round(4).to_dict())
    return Finding(f"{candidate} takes {r.min():.3f}-{r.max():.3f}x {baseline}'s {timing} at {', '.join(shapes)} "
                   f"(rule: at most {worst}x at every one, at most {best}x at one or more), replays equal.",
                   r.round(4).to_dict())


def shortest_from(bench: pd.DataFrame, candidate: str, lengths: Mapping[str, int], *, longest: int,
                  best: float = 0.97, baseline: str = "fast", timing: str = "graph_ms") -> Finding:
    """A length rule's speed half: the smallest L of `lengths` (shape label -> tokens, one sequence each), at most
    `longest`, such that at every one of those shapes of at least L tokens `candidate` takes at most `best` times
    `baseline`'s time, its replays equal to its output. Numbers: "from" (L) and each shape's ratio; raises when no
    such L exists (a miss)."""
    r = _ratio(bench, candidate, baseline, timing)
    missing = sorted(set(lengths) - set(r.index))
    if missing:
        raise _fail(f"shortest_from: no {candidate} / {baseline} time at {', '.join(missing)}", sorted(r.index))
    ratios = {s: round(float(r[s]), 4) for s in sorted(lengths, key=lengths.get)}
    for s in ratios:
        tail = [t for t in ratios if lengths[t] >= lengths[s]]
        if lengths[s] <= longest and all(r[t] <= best for t in tail):
            _replays_equal(bench, candidate, tail, "shortest_from")
            return Finding(f"{candidate} takes at most {best}x {baseline}'s {timing} at every bench length from "
                           f"{lengths[s]} tokens ({', '.join(tail)}: {min(r[t] for t in tail):.3f}-"
                           f"{max(r[t] for t in tail):.3f}x).", {"from": lengths[s], **ratios})
    raise _fail(f"shortest_from: {candidate} is above {best}x {baseline}'s {timing} at some length of every tail "
                f"starting at or below {longest} tokens", ratios)


def accuracy_rule(conformance: pd.DataFrame, sweep: pd.DataFrame, candidate: str, *, baseline: str = "fast",
                  factor: float = 1.10, chunks: int | Sequence[int] = 1024, error: str = "max_abs_err") -> Finding:
    """The accuracy half of an adoption rule: `candidate` passes every conformance case `baseline` was run on
    (gdnlab.field.in_budget), and its output error (the sweep's column `error`: one element's maximum, or
    mean_abs_err) at each of `chunks` chunks in each sweep regime and initial state is at most `factor` times
    `baseline`'s."""
    base_cases = set(conformance[conformance.backend == baseline].case)
    got = conformance[conformance.backend == candidate]
    if not base_cases or set(got.case) != base_cases:
        raise _fail(f"accuracy_rule: {candidate} was not run on {baseline}'s conformance cases",
                    sorted(base_cases ^ set(got.case)))
    failed = got[~in_budget(got)]
    if len(failed):
        raise _fail(f"accuracy_rule: {candidate} fails conformance cases", sorted(failed.case))
    counts = [chunks] if isinstance(chunks, int) else list(chunks)
    at = sweep[sweep.n_chunks.isin(counts)].pivot_table(index=["regime", "initial_state", "n_chunks"],
                                                        columns="backend", values=error)
    where = " and ".join(map(str, counts))
    if candidate not in at or baseline not in at or set(at.index.get_level_values("n_chunks")) != set(counts):
        raise _fail(f"accuracy_rule: the sweep has no {where}-chunk {error} of both", list(at.columns))
    ratio = (at[candidate] / at[baseline]).dropna()
    if ratio.empty or ratio.max() > factor:
        raise _fail(f"accuracy_rule: {candidate}'s {error} at {where} chunks is above {factor}x {baseline}'s",
                    ratio.round(4).to_dict())
    return Finding(f"{candidate} passes all {len(got)} conformance cases; its {error} at {where} chunks "
                   f"is {ratio.min():.3f}-{ratio.max():.3f}x {baseline}'s (rule: at most {factor}x).",
                   {" / ".join(map(str, k)): v for k, v in ratio.round(4).items()})


def _class_ratios(bench: pd.DataFrame, candidate: str, baseline: str, shapes: Sequence[str],
                  timing: str = "graph_ms") -> pd.Series:
    """candidate's time over baseline's at each shape of the class (NaN where either was not timed)."""
    return _ratio(bench, candidate, baseline, timing).reindex(list(shapes))


def _geomean(ratios: pd.Series) -> float:
    return float(ratios.prod() ** (1 / len(ratios)))


def best_candidate(bench: pd.DataFrame, candidates: Sequence[str], shapes: Sequence[str], *,
                   baseline: str = "fast", bit_equal: bool = True, **rule: Any) -> tuple[Finding, pd.DataFrame]:
    """A rule among several candidates: the one with the lowest geometric-mean time over `baseline`'s at the class
    `shapes` among those that pass speed_rule (with `rule`'s bounds) and, if the rule asks it (`bit_equal`), are
    bit-equal to `baseline` at every shape of the class (bench.csv's bit_equal_fast). Returns the finding (numbers:
    "best", the winner, and each candidate's geometric mean) and the table of every candidate's ratios and verdict
    (a miss stays in it as a miss); raises when none passes."""
    rows = []
    for c in candidates:
        r = _class_ratios(bench, c, baseline, shapes, rule.get("timing", "graph_ms"))
        sel = bench[(bench.backend == c) & bench["shape"].isin(shapes)]
        equal = "bit_equal_fast" in sel and len(sel) > 0 and bool(_true(sel.bit_equal_fast).all())
        try:
            speed_rule(bench, c, shapes, baseline=baseline, **rule)
            why = "" if equal or not bit_equal else "not bit-equal"
        except AssertionError as e:
            why = str(e).splitlines()[0].split(": ", 1)[-1].replace(f"{c} ", "", 1)
        rows.append({"candidate": c, **r.round(4).to_dict(), "geomean": _geomean(r),
                     "bit_equal": equal, "passes": not why, "why not": why})
    table = pd.DataFrame(rows).set_index("candidate")
    passed = table[table.passes]
    if passed.empty:
        raise _fail("best_candidate: no candidate passes the rule", table.to_dict("index"))
    best = passed.geomean.idxmin()
    return Finding(f"{best} has the lowest geometric-mean time, {passed.geomean.min():.3f}x {baseline}'s, of the "
                   f"candidates {f'bit-equal to {baseline} and ' if bit_equal else ''}within the speed bounds at "
                   f"{', '.join(shapes)}; {len(table) - len(passed)} of {len(table)} miss.",
                   {"best": best, **table.geomean.round(4).to_dict()}), table


#: The parts of a candidate rule of the speed notes (items 70, 72, 73), in the order a verdict lists its misses.
RULE_PARTS = ("conformance", "speed", "max_abs_err", "mean_abs_err")


def _each_regime(conformance: pd.DataFrame, sweep: pd.DataFrame, candidate: str, accuracy: Mapping[str, float],
                 baseline: str, error: str) -> list[Finding]:
    """accuracy_rule in each sweep regime of `accuracy` (regime -> factor); with more than one, each finding and
    miss names its regime."""
    found = []
    for regime, factor in accuracy.items():
        named = "" if len(accuracy) == 1 else f"{regime}: "
        try:
            f = accuracy_rule(conformance, sweep[sweep.regime == regime], candidate, baseline=baseline,
                              factor=factor, error=error)
        except AssertionError as miss:
            raise _fail(named + str(miss).splitlines()[0], {"regime": regime}) from miss
        found.append(Finding(named + f.claim, f.numbers))
    return found


def judge_rule(bench: pd.DataFrame, conformance: pd.DataFrame, sweep: pd.DataFrame, candidates: Sequence[str],
               shapes: Sequence[str], *, worst: float, best: float | None,
               accuracy: Mapping[str, float] | None = None, baseline: str = "fast") -> tuple[pd.DataFrame, str | None]:
    """A candidate rule as the speed notes write it from item 70 on: fast takes the best of `candidates`
    (best_candidate over the class `shapes`, not asking bit-equality) if it is within the speed bounds (`worst`,
    `best`: speed_rule; `best` None asks no gain, only the cost bound `worst`), in budget in every conformance case,
    and in each sweep regime of `accuracy` (regime -> factor; default {"slow_gate": 1.0}) at most that factor times
    fast's max and mean error at 1024 chunks (accuracy_rule, judged on the cases both passed, so that a failed case
    does not hide the error comparison). Returns one row per candidate with each of RULE_PARTS ("met: " and the
    findings, or "MISS: " and the first line of the first miss), its geometric-mean time over fast's and `misses`
    (the parts missed, in RULE_PARTS's order), and the candidate adopted: the speed rule's best, where it misses no
    part; None otherwise."""
    accuracy = dict(accuracy or {"slow_gate": 1.0})
    best = worst if best is None else best
    rows = {}
    for c in candidates:
        got = conformance[conformance.backend == c]
        failed = sorted(got[~in_budget(got)].case) if len(got) else ["(not run)"]
        parts = {"conformance": (f"MISS: out of budget or not run: {', '.join(failed)}" if failed else
                                 f"met: all {len(got)} cases in budget")}
        both = conformance[~conformance.case.isin(failed)]
        checks = {"speed": lambda: [speed_rule(bench, c, shapes, baseline=baseline, worst=worst, best=best)]}
        for err in ("max_abs_err", "mean_abs_err"):
            checks[err] = lambda err=err: _each_regime(both, sweep, c, accuracy, baseline, err)
        for part, check in checks.items():
            try:
                parts[part] = "met: " + " ".join(f.claim for f in check())
            except AssertionError as miss:
                parts[part] = "MISS: " + str(miss).splitlines()[0]
        rows[c] = {**parts, "geomean": _geomean(_class_ratios(bench, c, baseline, shapes)),
                   "misses": ", ".join(p for p in RULE_PARTS if parts[p].startswith("MISS"))}
    table = pd.DataFrame.from_dict(rows, orient="index")
    pick = speed_pick(table)
    return table, (pick if pick is not None and not table.loc[pick, "misses"] else None)


def speed_pick(table: pd.DataFrame) -> str | None:
    """The candidate a judge_rule table's speed part picks: the lowest geometric-mean time among those within the
    speed bounds (best_candidate's pick, without a second speed_rule); None when none is."""
    fast_enough = table[table.speed.str.startswith("met")]
    return None if fast_enough.empty else fast_enough.geomean.idxmin()


def tests_passed(pytest_tail: str, *, at_least: int = 1) -> Finding:
    """A run's pytest summary line (the tail of `pytest -q`) as a finding: at least `at_least` passed and none
    failed or errored."""
    counts = {w: int(n) for n, w in re.findall(r"(\d+) (passed|failed|errors?|skipped|deselected)", pytest_tail)}
    bad = counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
    if bad or counts.get("passed", 0) < at_least:
        raise _fail("tests_passed: the run's tests did not all pass", counts)
    return Finding(f"{counts['passed']} GPU tests passed in the run, none failed.", counts)
