"""The field's GDN prefill kernels as lab backends: FlashInfer, FlashQLA and flash-linear-attention (FLA).

Each peer is an adapter with the lab's entry-point signature. The lab validates the call (gdnlab.validate) before
it reaches the adapter; the adapter converts the lab's layout to the peer's and back, and does nothing else:

- ``flashinfer``: FlashInfer's ``gdn_prefill.chunk_gated_delta_rule`` (the kernel vLLM runs on Hopper). It takes
  packed ``[tokens, heads, D]`` inputs, ``cu_seqlens`` always, the gate as linear ``alpha = exp(g)`` (as vLLM calls
  it; ``gate_domain="log"`` passes ``g`` itself), ``beta`` in fp32, and a state laid out ``[N, HV, V, K]``.
- ``flashqla``: FlashQLA's ``chunk_gated_delta_rule`` (TileLang, Qwen). Same layout as the lab's; ``auto_cp``
  (its intra-card context parallelism) is on as FlashQLA ships it.
- ``fla``: FLA's ``chunk_gated_delta_rule`` pinned to FLA's own Triton path. FLA's entry point hands the call to
  FlashQLA when ``flash_qla`` imports (unless ``FLA_FLASH_QLA=0``); the adapter sets that variable for the call
  and :func:`implementation` reports which implementation FLA's dispatcher would pick.

``poison=True`` fills the output with NaN before the call where the peer takes a preallocated output
(FlashInfer), and otherwise leaves a NaN-filled block of the output's size in torch's caching allocator just before
the call: best effort, since the peer may allocate other buffers into that block before its output (FLA does), so
for FlashQLA and FLA "every element written" is weaker evidence than for the lab's kernels and FlashInfer.

A peer that cannot run here (package missing, no CUDA, not Hopper) is not registered;
``gdnlab.registry.UNAVAILABLE`` says why, and asking for it raises an error that gives the reason.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from gdnlab.registry import UNAVAILABLE, register_backend

__all__ = ["PEERS", "Peer", "peer_status", "implementation", "register_peers", "installed_version",
           "dependency_versions"]


def installed_version(distribution: str) -> str:
    """The installed version of `distribution`, or "not installed (<why>)"."""
    try:
        from importlib.metadata import version
        return version(distribution)
    except Exception as e:  # noqa: BLE001 - any failure is reported, not raised
        return f"not installed ({type(e).__name__})"


@dataclass(frozen=True)
class Peer:
    """One peer backend: the package it needs, the compute capabilities it runs on and its adapter."""

    name: str
    package: str
    distribution: str
    capabilities: tuple[int, ...]
    run: Callable[..., tuple[torch.Tensor, torch.Tensor | None]]

    def version(self) -> str:
        """The installed distribution's version, or why it is not importable."""
        return installed_version(self.distribution)

    def why_not(self) -> str | None:
        """None when the peer can run on this machine, else the reason it cannot."""
        if not torch.cuda.is_available():
            return "needs a CUDA GPU (none here)"
        major = torch.cuda.get_device_capability()[0]
        if major not in self.capabilities:
            return f"needs compute capability {'/'.join(f'{c}.x' for c in self.capabilities)}, this GPU is {major}.x"
        try:
            importlib.import_module(self.package)
        except Exception as e:  # noqa: BLE001
            return f"package {self.distribution!r} does not import: {type(e).__name__}: {str(e)[:160]}"
        return None


# ---- helpers the adapters share ------------------------------------------------------------------------------

def _need_head_dims(name: str, q: torch.Tensor, v: torch.Tensor, dims: tuple[int, ...]) -> None:
    """Refuse head sizes the peer does not build, naming the argument (the peer's own error would not)."""
    if q.shape[-1] not in dims:
        raise ValueError(f"backend {name!r}: q/k head size K must be one of {dims}, got {q.shape[-1]}")
    if v.shape[-1] not in dims:
        raise ValueError(f"backend {name!r}: v head size V must be one of {dims}, got {v.shape[-1]}")


def _poison_allocator(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> None:
    """Leave a NaN-filled block of this size at the head of torch's caching allocator (see the module docstring)."""
    torch.empty(shape, dtype=dtype, device=device).fill_(float("nan"))


@functools.lru_cache(maxsize=64)
def _device_offsets(offsets: tuple[int, ...], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A device copy of host sequence offsets, made once per distinct batch layout: a repeated call then copies
    nothing from the host, so it can be captured in a CUDA graph."""
    return torch.tensor(offsets, dtype=dtype, device=device)


def _offsets(cu_seqlens: torch.Tensor | None, B: int, T: int, device: torch.device,
             dtype: torch.dtype = torch.int32) -> tuple[torch.Tensor, torch.Tensor]:
    """(host offsets, device offsets) of the batch: ``cu_seqlens`` as given, or ``B`` sequences of ``T`` rows.
    Host ``cu_seqlens`` (as the lab's benchmarks pass them) cost no device-to-host copy."""
    host = torch.arange(0, B + 1, dtype=dtype) * T if cu_seqlens is None else cu_seqlens.to("cpu", dtype)
    return host, _device_offsets(tuple(host.tolist()), device, dtype)


def _rows_end(cu_seqlens: torch.Tensor | None, rows: int) -> int:
    """Tokens covered by the sequences (rows past it are padding)."""
    return rows if cu_seqlens is None else int(cu_seqlens[-1])


def _zero_padding(o: torch.Tensor, end: int) -> torch.Tensor:
    """The lab's contract: output rows past the last sequence are zero."""
    if end < o.shape[1]:
        o[:, end:] = 0
    return o


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    """Set an environment variable for the duration of a call."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


# ---- FlashInfer ------------------------------------------------------------------------------------------------

def _flashinfer(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                use_qk_l2norm_in_kernel=False, cu_seqlens=None, state_v_first=False, *, poison: bool = False,
                gate_domain: str = "linear", use_cp: Any = "auto", **options: Any):
    """FlashInfer's GDN prefill in the lab's layout (see the module docstring)."""
    from flashinfer.gdn_prefill import chunk_gated_delta_rule as fi_chunk
    _need_head_dims("flashinfer", q, v, (128,))
    if gate_domain not in ("linear", "log"):
        raise ValueError(f"gate_domain: must be 'linear' or 'log', got {gate_domain!r}")
    if options:
        raise TypeError(f"options: backend 'flashinfer' takes poison, gate_domain, use_cp; got {sorted(options)}")
    B, T, HV, V = v.shape
    dev = q.device
    cu, cu_dev = _offsets(cu_seqlens, B, T, dev)
    end, n = int(cu[-1]), cu.numel() - 1

    def packed(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        return x.reshape(B * T, *x.shape[2:])[:end].to(dtype or x.dtype).contiguous()

    gate = packed(g, torch.float32)
    if gate_domain == "linear":
        gate = gate.exp()
    h0 = None
    if initial_state is not None:  # FlashInfer's state is [N, HV, V, K]
        h0 = (initial_state if state_v_first else initial_state.transpose(-1, -2)).contiguous()
    out = torch.empty((B * T, HV, V), dtype=q.dtype, device=dev)  # FlashInfer writes its first `end` rows
    if poison:
        out.fill_(float("nan"))
    ht = None
    if output_final_state:
        ht = torch.empty((n, HV, V, q.shape[-1]), dtype=torch.float32, device=dev)
        if poison:
            ht.fill_(float("nan"))
    fi_chunk(packed(q), packed(k), packed(v), gate, packed(beta, torch.float32), scale=scale, initial_state=h0,
             output_final_state=output_final_state, cu_seqlens=cu_dev, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
             output=out[:end], output_state=ht, use_cp=use_cp, gate_domain=gate_domain, cu_seqlens_cpu=cu,
             max_seqlen=int(cu.diff().max()) if n else 0)
    out[end:] = 0  # padding rows
    if ht is not None and not state_v_first:
        ht = ht.transpose(-1, -2).contiguous()
    return out.view(B, T, HV, V), ht


# ---- FlashQLA --------------------------------------------------------------------------------------------------

def _flashqla(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, cu_seqlens=None, state_v_first=False, *, poison: bool = False,
              auto_cp: bool = True, **options: Any):
    """FlashQLA's chunk_gated_delta_rule in the lab's layout (the same as FlashQLA's own)."""
    import flash_qla
    _need_head_dims("flashqla", q, v, (128,))
    if options:
        raise TypeError(f"options: backend 'flashqla' takes poison, auto_cp; got {sorted(options)}")
    end = _rows_end(cu_seqlens, q.shape[1])
    if poison:
        _poison_allocator(v.shape, q.dtype, q.device)
    o, ht = flash_qla.chunk_gated_delta_rule(
        q, k, v, g.float(), beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        cu_seqlens=None if cu_seqlens is None else _offsets(cu_seqlens, 1, 0, q.device, torch.long)[1],
        state_v_first=state_v_first, auto_cp=auto_cp)
    return _zero_padding(o, end), (ht.float() if ht is not None else None)


# ---- flash-linear-attention, its own Triton path ----------------------------------------------------------------

def _fla(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
         use_qk_l2norm_in_kernel=False, cu_seqlens=None, state_v_first=False, *, poison: bool = False,
         **options: Any):
    """FLA's chunk_gated_delta_rule with its hand-off to FlashQLA turned off (FLA_FLASH_QLA=0)."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk
    end = _rows_end(cu_seqlens, q.shape[1])
    h0 = initial_state.transpose(-1, -2).contiguous() if (initial_state is not None and state_v_first) \
        else initial_state
    if poison:
        _poison_allocator(v.shape, q.dtype, q.device)
    with _env("FLA_FLASH_QLA", "0"):
        o, ht = fla_chunk(q, k, v, g, beta, scale=scale, initial_state=h0, output_final_state=output_final_state,
                          cu_seqlens=cu_seqlens.to(q.device, torch.long) if cu_seqlens is not None else None,
                          use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, **options)
    if ht is not None and state_v_first:
        ht = ht.transpose(-1, -2).contiguous()
    return _zero_padding(o, end), (ht.float() if ht is not None else None)


#: Every peer the lab knows, by backend name.
PEERS: dict[str, Peer] = {
    "fla": Peer("fla", "fla.ops.gated_delta_rule", "fla-core", (7, 8, 9, 10, 12), _fla),
    "flashqla": Peer("flashqla", "flash_qla", "flash-qla", (9, 10, 12), _flashqla),
    "flashinfer": Peer("flashinfer", "flashinfer.gdn_prefill", "flashinfer-python", (9,), _flashinfer),
}


def implementation(name: str) -> str:
    """What really runs behind a peer backend here: the distribution and version, and for ``fla`` the backend
    FLA's dispatcher picks for a K = V = 128 bf16 call with the adapter's FLA_FLASH_QLA=0 ("triton" when none of
    its alternative backends accepts the call)."""
    peer = PEERS[name]
    label = f"{peer.distribution} {peer.version()}"
    if name != "fla":
        return label
    try:
        from fla.backends import _get_operation_registry  # FLA's registry of alternative backends
        reg = _get_operation_registry("gated_delta_rule")
        with _env("FLA_FLASH_QLA", "0"):
            active = [b.backend_type for b in reg._get_sorted_backends() if b.is_available() and b.is_enabled()]
    except Exception as e:  # noqa: BLE001
        return f"{label} (dispatch unknown: {type(e).__name__})"
    return f"{label} ({'candidates ' + ','.join(active) if active else 'triton'})"


#: Distributions the peers compile their kernels with at run time; a peer's speed can change with these while its
#: own version stays, so device runs record them beside the peers'.
PEER_DEPENDENCIES = ("tilelang", "apache-tvm-ffi", "nvidia-cutlass-dsl", "cuda-python")


def dependency_versions() -> dict[str, str]:
    """installed_version of each of PEER_DEPENDENCIES."""
    return {d: installed_version(d) for d in PEER_DEPENDENCIES}


def peer_status() -> dict[str, str]:
    """For every peer: "available: <implementation>" or "unavailable: <reason>"."""
    reasons = {n: UNAVAILABLE.get(n) or p.why_not() for n, p in PEERS.items()}
    return {n: (f"unavailable: {r}" if r else f"available: {implementation(n)}") for n, r in reasons.items()}


def _on_cuda(name: str, run: Callable[..., Any]) -> Callable[..., Any]:
    """The adapter as registered: CUDA tensors only (the adapters themselves stay device-agnostic, so the tests can
    check their layout conversion on the CPU against stand-ins for the peers)."""
    def call(q: torch.Tensor, *args: Any, **kw: Any) -> Any:
        if not q.is_cuda:
            raise ValueError(f"backend {name!r}: runs on CUDA tensors only; got {q.device.type} tensors")
        return run(q, *args, **kw)
    call.__name__ = call.__qualname__ = f"{name}_on_cuda"
    return call


def register_peers() -> None:
    """Register every peer that can run here; record why each other one cannot (gdnlab.registry.UNAVAILABLE)."""
    for name, peer in PEERS.items():
        reason = peer.why_not()
        if reason is None:
            register_backend(name, _on_cuda(name, peer.run), overwrite=True)
        else:
            UNAVAILABLE[name] = reason
