"""gdnlab.instruction_mix: static SASS and TTGIR counts of a kernel as a recorded call launches it (sm_90 builds)."""
from __future__ import annotations

import collections
import pytest

from gdnlab import instruction_mix as im


def test_opcodes_are_read_without_modifiers_or_predicates():
    sass = ("        /*0010*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;\n"
            "        /*0020*/              @!P0 BAR.SYNC.DEFER_BLOCKING 0x0 ;\n"
            "        /*0030*/              @UP1 LDS.U16 R2, [R3] ;\n")
    m = im.Mix(collections.Counter(o.split(".")[0] for o in im._OPCODE.findall(sass)), 0, 0, 0)
    assert m.opcodes == {"HMMA": 1, "BAR": 1, "LDS": 1}
    g = m.groups()
    assert (g["matrix"], g["barriers"], g["shared memory"], g["other"], g["total"]) == (1, 1, 1, 0, 3)


def test_refuses_a_kernel_the_call_does_not_launch_or_a_constexpr_it_lacks():
    with pytest.raises(ValueError, match="launches no 'fused_kernel'"):
        im.recorded_spec("fast", "fused_kernel")
    with pytest.raises(ValueError, match="no constexpr 'NOPE'"):
        im.mix("fast", "prologue_kernel", replace={"NOPE": 1}, prologue_warps=2)


@pytest.mark.skipif(not im.available(), reason="this Triton ships no nvdisasm")
def test_the_solve_is_what_the_identity_form_drops():
    """fast's 2-warp prologue against the same build with no solve (SOLVE="identity"): the same matrix
    instructions (the solve's 16x16 products are fp32, on FMA), fewer dots, layout conversions and barriers."""
    full = im.mix("fast", "prologue_kernel", prologue_warps=2, prologue_solve="blocks")
    none = im.mix("fast", "prologue_kernel", replace={"SOLVE": "identity"}, prologue_warps=2,
                  prologue_solve="blocks")
    assert full.opcodes["HMMA"] == none.opcodes["HMMA"] > 0
    assert full.dots > none.dots and full.convert_layouts > none.convert_layouts
    assert full.groups()["barriers"] > none.groups()["barriers"] and full.total > none.total


def _mix(conv=0, dots=1, **ops):
    return im.Mix(collections.Counter(ops), convert_layouts=conv, local_allocs=2, dots=dots)


def test_solve_cost_is_asserted_and_the_table_draws():
    tab = im.table({"blocks": _mix(HMMA=10, FFMA=50, BAR=9, LDS=7, conv=5, dots=4),
                    "no solve": _mix(HMMA=10, FFMA=5, BAR=2, conv=1, dots=1)})
    assert list(tab.index) == ["blocks", "no solve"] and tab.loc["blocks", "total"] == 76
    assert "4 layout conversions" in str(im.solve_cost(tab))
    on_tensor_cores = im.table({"blocks": _mix(HMMA=12, BAR=9, conv=5), "no solve": _mix(HMMA=10, BAR=2, conv=1)})
    with pytest.raises(AssertionError, match="solve_cost"):
        im.solve_cost(on_tensor_cores)
    assert len(im.figure(tab).axes[0].patches) == 2 * (len(im.GROUPS) + 1)
