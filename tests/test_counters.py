"""gdnlab.counters on an ncu.csv written as benchmarks.ncu writes one (its parse of ncu's CSV, then the shape)."""
from __future__ import annotations

import pandas as pd
import pytest

from gdnlab import counters

HEAD = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
        '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def _line(launch, kernel, section, metric, unit, value):
    return (f'"{launch}","1","python","h","{kernel}","1","7","(64, 1, 1)","(512, 32, 1)","0","9.0","{section}",'
            f'"{metric}","{unit}","{value}"')


def _ncu(prologue_long=3.0, duration=("ms", "1.25")):
    from benchmarks import ncu
    lines = [HEAD]
    for launch, kernel, stall in ((0, "prologue_kernel", prologue_long), (1, "fwd_h_kernel", 0.5),
                                  (2, "fwd_h_kernel", 0.25)):
        lines += [_line(launch, kernel, "GPU Speed Of Light Throughput", "Duration", *duration),
                  _line(launch, kernel, "GPU Speed Of Light Throughput", "DRAM Throughput", "%", "24.5"),
                  _line(launch, kernel, "GPU Speed Of Light Throughput", "Compute (SM) Throughput", "%", "31"),
                  _line(launch, kernel, "Launch Statistics", "Registers Per Thread", "register/thread", "255"),
                  _line(launch, kernel, "Occupancy", "Theoretical Occupancy", "%", "12.5"),
                  _line(launch, kernel, "Occupancy", "Achieved Occupancy", "%", "11.9"),
                  _line(launch, kernel, "Warp State Statistics", "Warp Cycles Per Issued Instruction", "cycle",
                        "20.1")]
        for reason, v in (("long_scoreboard", stall), ("math_pipe_throttle", 1.0), ("wait", 0.7),
                          ("selected", 9.0)):
            lines.append(_line(launch, kernel, "Command line profiler metrics",
                               f"{counters.STALL_PREFIX}{reason}{counters.STALL_SUFFIX}", "", v))
    return ncu.parse("\n".join(lines)).assign(backend="fast", B=1, T=32768)


def test_table_keeps_the_metrics_and_the_longest_stall():
    t = counters.table(_ncu())
    assert list(t.kernel) == ["prologue_kernel", "fwd_h_kernel", "fwd_h_kernel"]  # two launches stay two rows
    assert list(t.launch) == [0, 1, 2]
    p = t.iloc[0]
    assert p.duration_us == 1250.0 and p.registers == 255 and p.achieved_occupancy_pct == 11.9
    # "selected" (the issuing warp, 9.0 here) is no stall: neither the top reason nor in the share's total
    assert p.top_stall == "long_scoreboard" and p.top_stall_share == pytest.approx(3.0 / 4.7)
    assert t.iloc[1].top_stall == "math_pipe_throttle"
    assert counters.table(_ncu(duration=("usecond", "980"))).duration_us.iloc[0] == 980.0
    assert "longest stall long_scoreboard" in str(counters.counters_summary(t))


def test_refuses_what_is_not_a_profile():
    with pytest.raises(ValueError, match="unknown unit"):
        counters.table(_ncu(duration=("fortnight", "1")))
    with pytest.raises(ValueError, match="no kernel was profiled"):
        counters.table(pd.DataFrame(dict(backend=["fast"], B=[1], T=[512], error=["RuntimeError('ncu not found')"])))
    with pytest.raises(ValueError, match="not an ncu.csv"):
        counters.table(pd.DataFrame(dict(a=[1])))


def test_stalls_figure_has_a_panel_per_shape():
    two = pd.concat([_ncu(), _ncu().assign(B=8, T=2048)], ignore_index=True)
    fig = counters.stalls_figure(two, top=2)
    assert len(fig.axes) == 2 and fig.axes[0].get_title() == "1 x 32768"


def test_register_bound_needs_the_register_limit_to_bind_and_memory_to_stall():
    def limited(registers, long_stall):
        extra = [_line(0, "prologue_kernel", "Occupancy", f"Block Limit {n}", "block", v)
                 for n, v in (("Registers", registers), ("Shared Mem", 5), ("Warps", 32))]
        from benchmarks import ncu
        return pd.concat([_ncu(prologue_long=long_stall),
                          ncu.parse("\n".join([HEAD, *extra])).assign(backend="fast", B=1, T=32768)])
    f = counters.register_bound(limited(4, 3.0))
    assert f.numbers["1x32768"]["programs_by_registers"] == 4
    for registers, long_stall in ((6, 3.0), (4, 0.5)):  # shared memory binds; the math pipe stalls longest
        with pytest.raises(AssertionError, match="register_bound"):
            counters.register_bound(limited(registers, long_stall))
