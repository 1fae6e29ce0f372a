"""gdnlab: accuracy and speed of chunked Gated DeltaNet prefill kernels, on GPU and on CPU."""
from gdnlab import reference
from gdnlab.backends import BACKENDS, chunk_gated_delta_rule, register_backend

__all__ = ["BACKENDS", "chunk_gated_delta_rule", "register_backend", "reference"]
