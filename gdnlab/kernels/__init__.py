"""The lab's Triton kernels: a shared prologue, the two-kernel path and the fused kernel (variants are switches)."""
from gdnlab.kernels.fused import FIXED, SHIPPED, fused
from gdnlab.kernels.prologue import BT, ChunkPlan, Prologue, alloc, l2norm, run_prologue
from gdnlab.kernels.two_kernel import two_kernel

__all__ = ["BT", "ChunkPlan", "FIXED", "Prologue", "SHIPPED", "alloc", "fused", "l2norm", "run_prologue",
           "two_kernel"]
