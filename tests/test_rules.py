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


@pytest.mark.parametrize("item", sorted(rules.RULES))
def test_each_rule_is_the_one_its_item_wrote_before_the_run(item):
    r, text = rules.get(item), _item(item)
    written = text.split("Measured")[0]  # the rule, before any measurement
    assert f'--backends "{",".join(r.backends)}"' in written
    assert f"--shapes {','.join(r.shapes)}" in written and f"--parts {','.join(r.parts)}" in written
    assert f"at most {r.worst}x" in written and f"at most {r.best}x" in written and "slow-gate" in written
    assert r.factor == 1.0 and "at most fast's" in written  # the errors: fast's, no factor
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


def test_a_rule_describes_its_bounds():
    r = rules.get(72)
    assert "<= 1.01x" in r.describe() and "<= 0.97x" in r.describe() and "<= fast's" in r.describe()
    assert "<= 1.1x fast's" in dataclasses.replace(r, factor=1.1).describe()


def test_the_device_command_runs_the_rule_s_tests_then_its_benchmarks():
    cmd = rules.get(73).device_command()
    assert cmd.index("-k 'walk-ws or walk_ws'") < cmd.index("python -m benchmarks --out $OUT/item73 --rule 73")
    assert len(cmd) < 2000  # a device call's command line
    assert [r.item for r in rules.pending()] == [i for i, r in rules.RULES.items() if r.recorded is None]


def test_a_rule_refuses_what_cannot_be_a_rule():
    base = rules.get(72)
    for bad in (dict(candidates=()), dict(candidates=("fast",)), dict(best=1.02), dict(worst=0.99),
                dict(recorded=("time",))):
        with pytest.raises(ValueError):
            dataclasses.replace(base, **bad)
    with pytest.raises(KeyError, match="70, 72, 73"):
        rules.get(71)


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
