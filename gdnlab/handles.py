"""Kernel launches through compiled-kernel handles: the host half of a call's time at small sizes.

``kernel[grid](*args, **kwargs)`` re-derives on every call what a repeated call already knew: it binds the arguments to
the signature, specialises every argument (dtype, 16-byte alignment, integers equal to 1 or divisible by 16), hashes
that into a cache key, looks the compiled kernel up and only then calls its launcher. :func:`launch` keys its own
cache on exactly what Triton specialises on, keeps the compiled kernel (its handle) and the argument tail (constexprs
and defaults in signature order) it was built with, and from the second call on hands the arguments straight to the
handle's launcher (its C entry when the kernel needs no scratch memory). The first call of every key goes through Triton's own path, so compilation, its cache and its
errors are Triton's.

The launcher's calling convention is Triton-internal; the direct path is taken only on the Triton versions in
:data:`DIRECT_TRITONS`, where it was checked on the device (docs/speed-notes.md), and only while no launch hook
(a profiler's) is installed. Everywhere else :func:`launch` is ``kernel[grid](*args, **kwargs)``.
"""
from __future__ import annotations

import inspect
from typing import Any, Sequence

import torch
import triton

try:
    from triton import knobs
except ImportError:  # Tritons before knobs: no direct path there (DIRECT_TRITONS)
    knobs = None

#: Triton versions (major.minor) whose launcher convention the direct path follows:
#: ``run(grid0, grid1, grid2, stream, function, packed_metadata, launch_metadata, enter_hook, exit_hook, *params)``
#: with every parameter of the signature, constexprs included.
DIRECT_TRITONS = ("3.6",)
#: Launch options of ``kernel[grid](...)`` that are not kernel parameters.
LAUNCH_OPTIONS = frozenset({"num_warps", "num_stages", "num_ctas", "maxnreg", "launch_pdl"})
#: Compiled launches by (id of the kernel, device, grid length, keyword arguments, argument specialisation).
_HANDLES: dict[tuple, tuple[Any, tuple]] = {}
_LIMIT = 1024
#: The kernels keyed by id in _HANDLES.
_KERNELS: dict[int, Any] = {}


def direct_supported() -> bool:
    """True when this Triton's launcher convention is the one the direct path calls."""
    return triton.__version__.startswith(DIRECT_TRITONS)


_DIRECT = direct_supported()


def _spec(a: Any) -> Any:
    """What Triton specialises a runtime argument on (a superset: equal keys give the same compiled kernel).
    :func:`launch` computes the same inline (a function call per argument costs more than the rest of the key)."""
    return _specs((a,))[0]


def _specs(args: Sequence[Any]) -> tuple:
    """_spec of every argument, in one comprehension."""
    return tuple([(a.dtype, not a.data_ptr() & 15) if a.__class__ is _Tensor
                  else ("i", a == 1, not a % 16, -2 ** 31 <= a < 2 ** 31) if a.__class__ is int
                  else ("b", a) if a.__class__ is bool
                  else (a.dtype, not a.data_ptr() & 15) if isinstance(a, torch.Tensor)
                  else type(a) for a in args])


_Tensor = torch.Tensor


def _tail(kernel: Any, n_args: int, kwargs: dict[str, Any]) -> tuple:
    """The parameters after the positional ones, in signature order: given keywords, else the defaults."""
    params = list(inspect.signature(kernel.fn).parameters.values())[n_args:]
    return tuple(kwargs[p.name] if p.name in kwargs else p.default for p in params)


def _hook_set(hook: Any) -> bool:
    """Whether a launch hook slot holds a hook: None, or (Triton 3.6) an empty HookChain, holds none."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _hooks_installed() -> bool:
    runtime = knobs.runtime
    return _hook_set(runtime.launch_enter_hook) or _hook_set(runtime.launch_exit_hook)


def _stream() -> tuple[int, int]:
    """The current CUDA device and its current raw stream, as Triton's own launch path asks for them."""
    device = torch._C._cuda_getDevice()
    return device, torch._C._cuda_getCurrentRawStream(device)


def _entry(compiled: Any, tail: tuple) -> tuple[Any, tuple, tuple]:
    """What a cached launch calls: the compiled launcher's own C entry when the kernel needs no scratch memory
    (the launcher's Python wrapper would only pass None for it), else the wrapper; the arguments that precede the
    grid-independent ones; and the argument tail."""
    run = compiled.run
    if not getattr(run, "global_scratch_size", 1) and not getattr(run, "profile_scratch_size", 1):
        return run.launch, (compiled.function, run.launch_cooperative_grid, run.launch_pdl, None, None,
                            compiled.packed_metadata, None, None, None), tail
    return run, (compiled.function, compiled.packed_metadata, None, None, None), tail


def _key(kernel: Any, device: int, grid: Sequence[int], args: Sequence[Any], kwargs: dict[str, Any]) -> tuple:
    return id(kernel), device, len(grid), tuple(kwargs.items()), _specs(args)


def entry(kernel: Any, grid: Sequence[int], args: Sequence[Any], kwargs: dict[str, Any]) -> tuple | None:
    """The cached ``(call, head, tail)`` of a launch that :func:`launch` has made before with arguments that
    specialise alike, on the current device (a launch is ``call(grid0, grid1, grid2, stream, *head, *args,
    *tail)``); None when the direct path is off or there is none yet."""
    if not _DIRECT:
        return None
    return _HANDLES.get(_key(kernel, torch._C._cuda_getDevice(), grid, args, kwargs))


def launch(kernel: Any, grid: Sequence[int], args: Sequence[Any], kwargs: dict[str, Any]) -> None:
    """Launch a ``@triton.jit`` kernel on the current CUDA stream, through its cached handle when this Triton allows."""
    if not _DIRECT or _hooks_installed():
        kernel[tuple(grid)](*args, **kwargs)
        return
    device, stream = _stream()
    key = _key(kernel, device, grid, args, kwargs)
    entry = _HANDLES.get(key)
    if entry is None:
        compiled = kernel[tuple(grid)](*args, **kwargs)
        if len(_HANDLES) >= _LIMIT:
            _HANDLES.pop(next(iter(_HANDLES)))
        _HANDLES[key] = _entry(compiled, _tail(kernel, len(args),
                                               {k: v for k, v in kwargs.items() if k not in LAUNCH_OPTIONS}))
        _KERNELS[id(kernel)] = kernel  # keeps id(kernel) from being reused while its handles are cached
        return
    call, head, tail = entry
    n = len(grid)
    call(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, stream, *head, *args, *tail)


def hooks_installed() -> bool:
    """Whether a launch hook (a profiler's) is installed: launches then go through Triton's own path."""
    return knobs is not None and _hooks_installed()


def cached_handles() -> int:
    """How many compiled handles are cached (for tests and the host-time benchmark)."""
    return len(_HANDLES)
