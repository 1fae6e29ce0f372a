"""gdnlab.rules: each rule's data is the rule the speed notes wrote before its run, its call is what benchmarks runs,
and a recorded verdict is recomputed from its run (item 70's H100 run)."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from gdnlab import rules

NOTES = (Path(__file__).resolve().parents[1] / "docs" / "speed-notes.md").read_text()


def _item(n: int) -> str:
    """Item n of the speed notes, as one line of text."""
    m = re.search(rf"^{n}\. \*\*(.*?)(?=^\d+\. \*\*|^## )", NOTES, re.M | re.S)
    assert m, n
    return " ".join(m.group(1).split())


#: How the speed notes name each sweep regime in a rule.
_REGIME = {"slow_gate": "slow-gate", "cutedsl_gate": "CuteDSL-gate"}


def _rule_text(text: str) -> str:
    """The rule's own sentence of an item: from "Rule, written now" to "Otherwise"."""
    return text.split("Rule, written now", 1)[1].split("Otherwise", 1)[0]


def _bound(regime: str, factor: float, many: bool) -> str:
    """The words that bound the errors in one regime, as the notes write them: with one regime "at most fast's" and
    the regime apart; with several, each factor followed by its regime."""
    at_most = "at most fast's" if factor == 1.0 else f"at most {factor}x fast's"
    return f"{at_most} in the {{sweep's }}{_REGIME[regime]} regime" if many else at_most


@pytest.mark.parametrize("item", sorted(rules.RULES))
def test_each_rule_is_the_one_its_item_wrote_before_the_run(item):
    r, text = rules.get(item), _item(item)
    written = text.split("Measured")[0]  # the rule, before any measurement
    rule = _rule_text(written)
    assert f'--backends "{",".join(r.backends)}"' in written
    assert f"--shapes {','.join(r.shapes)}" in written and f"--parts {','.join(r.parts)}" in written
    assert f"at most {r.worst}x" in rule
    gain = re.search(r"at most (0\.\d+)x at one or more", rule)
    assert (r.best is None) == (gain is None) and (gain is None or float(gain.group(1)) == r.best)
    named = {g for g, words in _REGIME.items() if words in rule}
    assert named == {g for g, _ in r.accuracy}, (named, r.accuracy)  # no regime dropped or added
    many = len(r.accuracy) > 1
    for i, (regime, factor) in enumerate(r.accuracy):
        bound = _bound(regime, factor, many)
        assert bound.replace("{sweep's }", "sweep's " if i == 0 else "") in rule, bound
    planned = re.search(r"-k ([\w-]+)", re.sub(r"(\w)- (\w)", r"\1-\2", written))  # a line broke "wu-apart"
    assert planned and planned.group(1) in r.tests.split(" or "), (planned, r.tests)
    assert (r.recorded is None) == ("Measured" not in text)


def test_benchmarks_takes_a_rule_and_refuses_it_with_what_it_sets():
    from benchmarks.__main__ import arguments
    a = arguments(["--out", "d", "--rule", "72"])
    assert a.backends == "fast,fast[wu_apart=True;wu_warps=4],fast[wu_apart=True;wu_warps=8]"
    assert a.shapes == "1x4096,1x8192,1x32768,1x65536" and a.parts == "conformance,sweep,bench,in_situ"
    from benchmarks.registry import DEFAULT_PARTS
    assert arguments(["--out", "d"]).parts == ",".join(DEFAULT_PARTS) and arguments(["--out", "d"]).backends == ""
    for bad in (["--rule", "72", "--shapes", "1x512"], ["--rule", "71"]):
        with pytest.raises(SystemExit):
            arguments(["--out", "d", *bad])


def test_every_shape_is_the_bench_s():
    from benchmarks.inputs import SHAPES
    from gdnlab.speed import shape_label
    assert rules.EVERY_SHAPE == tuple(shape_label(B, T) for B, T in SHAPES)


def test_a_rule_describes_its_bounds():
    r = rules.get(72)
    assert "<= 1.01x" in r.describe() and "<= 0.97x" in r.describe() and "slow_gate <= fast's" in r.describe()
    other = dataclasses.replace(r, best=None, accuracy=(("cutedsl_gate", 0.95), ("slow_gate", 1.0)))
    assert "0.97" not in other.describe() and "cutedsl_gate <= 0.95x fast's; slow_gate <= fast's" in other.describe()


def test_the_device_command_runs_the_rule_s_tests_then_its_benchmarks():
    cmd = rules.get(73).device_command()
    assert cmd.index("-k 'walk-ws or walk_ws'") < cmd.index("python -m benchmarks --out $OUT/item73 --rule 73")
    assert len(cmd) < 2000  # a device call's command line
    assert [r.item for r in rules.pending()] == [i for i, r in rules.RULES.items() if r.recorded is None]


def test_a_rule_refuses_what_cannot_be_a_rule():
    base = rules.get(72)
    for bad in (dict(candidates=()), dict(candidates=("fast",)), dict(best=1.02), dict(worst=0.99),
                dict(recorded=("time",)), dict(accuracy=()), dict(accuracy=(("slow_gate", 0),))):
        with pytest.raises(ValueError):
            dataclasses.replace(base, **bad)
    with pytest.raises(KeyError, match="70, 72, 73, 74"):
        rules.get(71)


def test_confirm_judges_the_candidate_the_rule_picks():
    import pandas as pd
    table = pd.DataFrame({"speed": ["MISS: too slow", "met: fast enough"], "geomean": [0.90, 0.95],
                          "misses": ["speed", ""]}, index=["a", "b"])
    assert dataclasses.replace(rules.get(72), recorded=()).confirm(table, "b").numbers["adopted"] == "b"
    with pytest.raises(AssertionError, match="differs"):
        dataclasses.replace(rules.get(72), recorded=("speed",)).confirm(table, "b")


def test_item_70s_verdict_is_recomputed_from_its_run_and_a_different_record_fails():
    from gdnlab import runs
    from gdnlab.speed import load_bench
    rid, dev, r = "2026-12-07T2227-check", "h100", rules.get(70)
    table, adopted = r.judge(load_bench(runs.path(rid, "bench.csv", dev)), runs.load(rid, "conformance.csv", dev),
                             runs.load(rid, "sweep.csv", dev))
    tw = r.candidates[0]
    assert "var_16short" in table.loc[tw, "conformance"] and table.loc[tw, "mean_abs_err"].startswith("met: ")
    assert r.confirm(table, adopted).numbers["missed"] == ["conformance", "speed", "max_abs_err"]
    for other in (("speed",), ()):
        with pytest.raises(AssertionError, match="differs from the recorded"):
            dataclasses.replace(r, recorded=other).confirm(table, adopted)
    with pytest.raises(AssertionError, match="no verdict is recorded"):
        dataclasses.replace(r, recorded=None).confirm(table, adopted)
