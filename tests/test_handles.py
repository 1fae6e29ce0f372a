"""gdnlab.handles on the CPU: what it keys compiled kernels on, the argument tail it hands the launcher, and when it
steps aside for Triton's own launch path (the launches themselves run on the device: tests/test_gpu.py)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from gdnlab import handles


@triton.jit
def _probe(x_ptr, n, A: tl.constexpr, B: tl.constexpr = 3, C: tl.constexpr = False):
    pass


def test_spec_follows_what_triton_specialises_on():
    x = torch.zeros(8, dtype=torch.bfloat16)
    assert handles._spec(x) == (torch.bfloat16, True)
    assert handles._spec(x[1:]) == (torch.bfloat16, False)  # 2-byte offset: not 16-byte aligned
    assert handles._spec(x.float()) != handles._spec(x)
    assert len({handles._spec(n) for n in (1, 16, 17, 2 ** 31)}) == 4
    assert handles._spec(True) != handles._spec(1)
    assert handles._spec(None) != handles._spec(0.5)


def test_tail_is_the_rest_of_the_signature_in_order():
    assert handles._tail(_probe, 2, dict(A=4)) == (4, 3, False)
    assert handles._tail(_probe, 2, dict(C=True, A=1, B=7)) == (1, 7, True)


def test_a_hook_slot_counts_only_when_it_holds_a_hook():
    class Chain:
        def __init__(self, calls):
            self.calls = calls

    assert not handles._hook_set(None) and not handles._hook_set(Chain([]))
    assert handles._hook_set(Chain([print])) and handles._hook_set(print)


def test_direct_path_only_on_checked_tritons(monkeypatch):
    monkeypatch.setattr(triton, "__version__", "3.5.1")
    assert not handles.direct_supported()
    monkeypatch.setattr(triton, "__version__", handles.DIRECT_TRITONS[0] + ".0")
    assert handles.direct_supported()
