"""The bench shapes and their inputs: the Qwen3-Next layer's head shape, one sequence of 512-65536 tokens, a batch of
eight, and a ragged batch; several input sets per shape so that timed calls read their inputs cold."""
from __future__ import annotations

from typing import Any

from gdnlab.inputs import GDNInputs, make_inputs

DEV = "cuda"
#: Heads and head dims of one Qwen3-Next GDN layer.
QWEN = dict(H=16, HV=32, K=128, V=128)
#: (B, T) of every bench shape; ("varlen", None) is the ragged batch VARLEN.
SHAPES: list[tuple[Any, Any]] = [(1, 512), (1, 1024), (1, 2048), (1, 4096), (1, 8192), (1, 32768), (1, 65536),
                                 (8, 2048), (4, 8192), ("varlen", None)]
#: The ragged batch's sequence lengths (one token to 4096, unaligned to the chunk).
VARLEN = [3000, 17, 512, 1, 4096, 700, 64, 129, 2048, 333]


def parse_label(label: str) -> tuple[str, dict[str, Any]]:
    """A backend label as the command line gives it: "fused_fixed[downcast=False;BV=32]" is backend fused_fixed
    with those options (True/False/ints parsed), a plain name is the backend with none."""
    if "[" not in label:
        return label, {}
    if not label.endswith("]"):
        raise ValueError(f"backend label: expected NAME[opt=value;...], got {label!r}")
    name, body = label[:-1].split("[", 1)
    opts: dict[str, Any] = {}
    for item in filter(None, body.split(";")):
        key, _, value = item.partition("=")
        opts[key] = {"True": True, "False": False}.get(value, int(value) if value.lstrip("-").isdigit() else value)
    return name, opts


def select_shapes(labels: str) -> list[tuple[Any, Any]]:
    """The bench shapes (SHAPES, in their order) named by a comma list of labels (gdnlab.speed.shape_label); "" is
    all of them. An unknown label is refused with the known ones."""
    from gdnlab.speed import shape_label
    wanted = [w for w in labels.split(",") if w]
    known = {shape_label(B, T): (B, T) for B, T in SHAPES}
    unknown = [w for w in wanted if w not in known]
    if unknown:
        raise ValueError(f"shapes: unknown {', '.join(unknown)}; known: {', '.join(known)}")
    return [bt for label, bt in known.items() if not wanted or label in wanted]


def lengths_of(B: Any, T: Any) -> list[int]:
    """The sequence lengths of a bench shape (B sequences of T tokens, or the ragged batch's)."""
    return list(VARLEN) if B == "varlen" else [T] * B


def tokens_of(B: Any, T: Any) -> int:
    """Tokens of a bench shape (B x T, or the ragged batch's total)."""
    return sum(lengths_of(B, T))


def bench_inputs(B: Any, T: Any, seed: int) -> GDNInputs:
    """Seeded inputs of one bench shape on the GPU."""
    if B == "varlen":
        return make_inputs(seqlens=VARLEN, seed=seed, device=DEV, **QWEN)
    return make_inputs(B=B, T=T, seed=seed, device=DEV, **QWEN)


def floor_bytes(inp: GDNInputs) -> int:
    """Bytes a call must move at least: q, k, v, g, beta read, o written once, and the states read and written."""
    q = inp.q
    toks = q.shape[0] * q.shape[1]
    H, K, HV, V = q.shape[2], q.shape[3], inp.v.shape[2], inp.v.shape[3]
    n = inp.n_seqs if hasattr(inp, "n_seqs") else q.shape[0]
    return toks * (2 * H * K * 2 + HV * V * 2 + HV * 4 + HV * 2 + HV * V * 2) + 2 * n * HV * K * V * 4


def input_sets(B: Any, T: Any, set_bytes_target: int = 512 * 1024 ** 2) -> list[GDNInputs]:
    """Two to eight input sets of one shape, together about `set_bytes_target` bytes (more than the L2 cache), so
    that calls rotating through them read cold inputs as a model's layers do."""
    one = bench_inputs(B, T, 0)
    size = sum(x.numel() * x.element_size() for x in (one.q, one.k, one.v, one.g, one.beta))
    n = int(min(8, max(2, -(-set_bytes_target // max(size, 1)))))
    return [one] + [bench_inputs(B, T, s) for s in range(1, n)]


def call_kwargs(inp: GDNInputs, be: str) -> dict[str, Any]:
    """A call's arguments; the lab's backends get cu_seqlens on the host, which makes a varlen call capturable."""
    kw = inp.kwargs()
    if kw.get("cu_seqlens") is not None and parse_label(be)[0] != "fla":
        kw["cu_seqlens"] = kw["cu_seqlens"].cpu()
    return kw
