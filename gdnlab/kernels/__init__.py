"""The lab's Triton kernels: a shared prologue, the two-kernel path and the fused kernel (variants are switches),
and the pipeline that assembles them (gdnlab.kernels.pipeline)."""
from gdnlab.kernel_params import BT, FIXED, SHIPPED
from gdnlab.kernels.fused import fused
from gdnlab.kernels.prologue import ChunkPlan, Prologue, alloc, l2norm, run_prologue
from gdnlab.kernels.two_kernel import two_kernel

__all__ = ["BT", "ChunkPlan", "FIXED", "Prologue", "SHIPPED", "alloc", "fused", "l2norm", "run_prologue",
           "two_kernel"]
