"""Where a chunked kernel's output error comes from: the chunked algorithm in float64 with the two-kernel path's
bf16 roundings switched on one at a time (an emulation, not a kernel).

The lab's two-kernel path (and fast, the same kernels) rounds to bf16 at these places, by its code
(gdnlab/kernels/prologue.py, two_kernel.py, tiles.py):

- ``qk_norm``: the l2-normalised q and k (stored by the l2-norm kernel);
- ``wu``: W and U (stored by the prologue);
- ``state_for_w``: the state as the operand of W·S (V_new = U - W·S, in the state kernel);
- ``absorb``: V_new·exp(G_last - G), the term the state absorbs from a chunk;
- ``v_new``: V_new as stored for the output kernel;
- ``state_for_output``: each chunk's state as stored for the output kernel (the Q·S product);
- ``scores``: the gated, masked Q·Kᵀ before its product with V_new;
- ``output``: the output itself.

:func:`emulate` runs one sequence through the chunk recurrence in float64 with a chosen set of these rounded (each
product is exact, so this leaves out the fp32 accumulation inside the kernels' dots and the prologue's own
intermediate roundings); :func:`budget` measures, against the float64 recurrence, the error with all of them, with
all but one, with only the output's and (asked for) with none. A rounding whose removal lowers the error most is the
one a more accurate kernel would have to avoid first (issue 20's hint: a kernel that keeps the state in fp32 through
the output product avoids ``state_for_output``).
"""
from __future__ import annotations

from collections.abc import Collection, Iterable

import pandas as pd
import torch

from gdnlab.findings import Finding, Summary, _fail
from gdnlab.inputs import GDNInputs
from gdnlab.kernel_params import BT
from gdnlab.reference import chunk_gated_delta_rule_ref, l2norm, recurrent_gated_delta_rule_ref

__all__ = ["ROUNDINGS", "PROLOGUE_ROUNDINGS", "WALK_T_ROUNDINGS", "SPLIT_ROUNDINGS", "KNOWN_ROUNDINGS", "emulate",
           "configurations", "built_configurations", "fold_configurations", "budget", "savings", "largest_saving",
           "state_in_fp32", "against_device", "built_against_device", "lowers", "EXACT_TOL", "exact_without_roundings"]

#: The bf16 rounding points of the two-kernel path, in the order the data meets them.
ROUNDINGS = ("qk_norm", "wu", "state_for_w", "absorb", "v_new", "state_for_output", "scores", "output")
#: Two more roundings inside the prologue, modelled only when asked for (budget's default sets leave them out):
#: T = (I + A)^-1 rounded before W = T·(beta exp(G) K) and U = T·(beta V) (``solve``), and those two operands
#: rounded (``wu_operands``).
PROLOGUE_ROUNDINGS = ("solve", "wu_operands")
#: The rounding of walk_t's form (docs/speed-notes.md item 43), whose presence selects that form: the walk forms
#: V_new = T·(beta (V - exp(G) K·S)) with the bracket rounded (``bracket``) and T as ``solve`` rounds it; W and U
#: are never formed, so ``wu`` and ``wu_operands`` do not apply there.
WALK_T_ROUNDINGS = ("bracket",)
#: split_scores's form of ``scores`` (docs/speed-notes.md item 74): the gated scores enter their product with V_new
#: as two bf16 terms, their rounding and the remainder's (``scores_split``, about 16 significant bits); it takes
#: the place of ``scores``, never beside it.
SPLIT_ROUNDINGS = ("scores_split",)
#: Every rounding point emulate knows, in the order the data meets them.
KNOWN_ROUNDINGS = ROUNDINGS + PROLOGUE_ROUNDINGS + WALK_T_ROUNDINGS + SPLIT_ROUNDINGS


def _bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).to(x.dtype)


def _bf16x2(x: torch.Tensor) -> torch.Tensor:
    """x as the sum of two bf16 terms: its rounding and the rounding of the remainder (tiles.split_dot's operand)."""
    hi = _bf16(x)
    return hi + _bf16(x - hi)


def emulate(inputs: GDNInputs, rounded: Collection[str] = ROUNDINGS, chunk: int = BT) -> torch.Tensor:
    """The output ``[T, HV, V]`` (float64) of one dense sequence (B = 1, no cu_seqlens) by the chunked form, with
    the rounding points in `rounded` (a subset of :data:`ROUNDINGS`) rounded to bf16."""
    unknown = set(rounded) - set(KNOWN_ROUNDINGS)
    if unknown:
        raise ValueError(f"rounded: unknown rounding points {sorted(unknown)}; known: {', '.join(KNOWN_ROUNDINGS)}")
    walk_t = "bracket" in rounded
    if {"scores", "scores_split"} <= set(rounded):
        raise ValueError("rounded: scores_split is split_scores's form of scores, not a rounding beside it")
    if inputs.q.shape[0] != 1 or inputs.cu_seqlens is not None:
        raise ValueError("inputs: emulate takes one dense sequence (B = 1, no cu_seqlens)")

    def r(name: str, x: torch.Tensor) -> torch.Tensor:
        return _bf16(x) if name in rounded else x

    f64 = torch.float64
    q, k = inputs.q[0].to(f64), inputs.k[0].to(f64)                      # [T, H, K]
    v, g, beta = inputs.v[0].to(f64), inputs.g[0].to(f64), inputs.beta[0].to(f64)
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    if inputs.use_qk_l2norm_in_kernel:
        q, k = r("qk_norm", l2norm(q)), r("qk_norm", l2norm(k))
    rep = HV // H
    q, k = q.repeat_interleave(rep, 1).transpose(0, 1), k.repeat_interleave(rep, 1).transpose(0, 1)  # [HV, T, K]
    v, g, beta = v.transpose(0, 1), g.transpose(0, 1), beta.transpose(0, 1)                          # [HV, T, .]
    scale = inputs.scale if inputs.scale is not None else K ** -0.5
    S = (inputs.initial_state[0].to(f64).clone() if inputs.initial_state is not None
         else torch.zeros(HV, K, V, dtype=f64))
    o = torch.empty(HV, T, V, dtype=f64)
    for t0 in range(0, T, chunk):
        t1 = min(t0 + chunk, T)
        qc, kc, vc, bc = q[:, t0:t1], k[:, t0:t1], v[:, t0:t1], beta[:, t0:t1].unsqueeze(-1)
        G = g[:, t0:t1].cumsum(-1)
        n = t1 - t0
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        decay = (G.unsqueeze(-1) - G.unsqueeze(-2)).masked_fill(~causal, float("-inf")).exp()
        A = (bc * (kc @ kc.transpose(-1, -2)) * decay).tril(-1)
        eG = G.exp().unsqueeze(-1)
        operands = torch.cat([bc * eG * kc, bc * vc], -1)
        inv = None  # T itself, where some form rounds it or applies it apart from W and U
        if walk_t or set(PROLOGUE_ROUNDINGS) & set(rounded):
            eye = torch.eye(n, dtype=f64).expand_as(A)
            inv = r("solve", torch.linalg.solve_triangular(A, eye, upper=False, unitriangular=True))
        if walk_t:
            v_new = inv @ r("bracket", bc * (vc - eG * (kc @ r("state_for_w", S))))
        else:
            WU = (inv @ r("wu_operands", operands) if inv is not None
                  else torch.linalg.solve_triangular(A, operands, upper=False, unitriangular=True))
            W, U = r("wu", WU[..., :K]), r("wu", WU[..., K:])
            v_new = U - W @ r("state_for_w", S)
        scores = r("scores", (qc @ kc.transpose(-1, -2)) * decay)
        scores = _bf16x2(scores) if "scores_split" in rounded else scores
        o[:, t0:t1] = r("output", scale * ((qc @ r("state_for_output", S)) * eG
                                           + scores @ r("v_new", v_new)))
        G_last = G[:, -1:]
        S = G_last.exp().unsqueeze(-1) * S + kc.transpose(-1, -2) @ r(
            "absorb", v_new * (G_last - G).exp().unsqueeze(-1))
    return o.transpose(0, 1)


def configurations(include_none: bool = False) -> dict[str, frozenset[str]]:
    """The rounding sets :func:`budget` measures: "all", "all but X" for every point X, and "only output" (the floor
    no kernel with a bf16 output avoids); with `include_none`, "none" too (the float64 algorithm: zero error up to
    float64 roundoff)."""
    out = {"none": frozenset()} if include_none else {}
    out["all"] = frozenset(ROUNDINGS)
    out.update({f"all but {x}": frozenset(ROUNDINGS) - {x} for x in ROUNDINGS})
    out["only output"] = frozenset({"output"})
    return out


def built_configurations() -> dict[str, frozenset[str]]:
    """The lab's built configurations as rounding sets, the prologue's two inner roundings modelled too: the
    two-kernel path as it rounds, fold_norm (no normalised q or k rounded; docs/speed-notes.md items 27 and 29),
    fold_norm with split_wu (nor T, nor W's and U's operands), fold_norm with walk_t (T and the walk's bracket
    rounded, no W or U; item 43) and fold_norm with split_scores (the gated scores as two bf16 terms; item 74)."""
    every = frozenset(ROUNDINGS + PROLOGUE_ROUNDINGS)
    return {"two_kernel": every, "fold_norm": every - {"qk_norm"},
            "fold_norm + split_wu": every - {"qk_norm", *PROLOGUE_ROUNDINGS},
            "fold_norm + walk_t": (every - {"qk_norm", "wu", "wu_operands"}) | set(WALK_T_ROUNDINGS),
            "fold_norm + split_scores": (every - {"qk_norm", "scores"}) | set(SPLIT_ROUNDINGS)}


def budget(inputs: GDNInputs, lengths: Iterable[int], configs: dict[str, frozenset[str]] | None = None,
           progress: bool = False) -> pd.DataFrame:
    """Max and mean absolute output error against the float64 recurrence of the first n tokens, for every n in
    `lengths` and every rounding set in `configs` (default :func:`configurations`): one long-format row each
    (config, rounded, seq_len, n_chunks, max_abs_err, mean_abs_err). One emulation per set; the error at n tokens
    is that of its first n output rows, as in the device sweep."""
    ref_fn = recurrent_gated_delta_rule_ref if inputs.q.shape[1] <= 4096 else chunk_gated_delta_rule_ref
    ref = ref_fn(**{**inputs.kwargs(), "output_final_state": False})[0][0].to(torch.float64)
    rows = []
    configs = configs or configurations()
    items = configs.items()
    if progress:
        from tqdm.auto import tqdm
        items = tqdm(items, total=len(configs), desc="rounding sets")
    for name, rounded in items:
        o = emulate(inputs, rounded)
        for n in lengths:
            rows.append(dict(config=name, rounded=",".join(x for x in KNOWN_ROUNDINGS if x in rounded),
                             seq_len=n, n_chunks=-(-n // BT), max_abs_err=float((o[:n] - ref[:n]).abs().max()),
                             mean_abs_err=float((o[:n] - ref[:n]).abs().mean())))
    return pd.DataFrame(rows)


def savings(df: pd.DataFrame, base: str = "all") -> pd.DataFrame:
    """At the longest length of a :func:`budget` table: each set's max error (but "none"'s) and its ratio to
    `base`'s ("vs_all"; below 1: leaving that rounding out lowers the error), smallest ratio first, with the same
    ratio for the mean error ("mean_vs_all") where the table has it."""
    last = df[df.seq_len == df.seq_len.max()].set_index("config")
    if base not in last.index:
        raise ValueError(f"savings: the table has no {base!r} row")
    out = pd.DataFrame(dict(max_abs_err=last.max_abs_err, vs_all=last.max_abs_err / last.max_abs_err[base]))
    if "mean_abs_err" in last:  # the mean error: every element's share, not one element's
        out["mean_vs_all"] = last.mean_abs_err / last.mean_abs_err[base]
    return out.drop(index=[base, "none"], errors="ignore").sort_values("vs_all").assign(
        n_chunks=int(df.n_chunks.max()))


def largest_saving(df: pd.DataFrame, base: str = "all", error: str = "max_abs_err") -> Summary:
    """Which rounding of the set `base` the kernel could leave out (every point but the bf16 output itself; rows
    "<base> but X") for the largest drop in `error` (max_abs_err or mean_abs_err) at the longest length: a
    descriptive summary (some point always wins)."""
    col = {"max_abs_err": "vs_all", "mean_abs_err": "mean_vs_all"}[error]
    s = savings(df, base)
    lead = f"{base} but "
    s = s[s.index.str.startswith(lead) & (s.index != f"{lead}output")].sort_values(col)
    best = s.index[0]
    n = int(df.n_chunks.max())
    what = "max" if error == "max_abs_err" else "mean"
    return Summary(f"At {n} chunks, leaving {best[len(lead):]} out of {base}'s roundings lowers the emulated {what} "
                   f"error most: {s[col].iloc[0]:.3f}x; the other points: "
                   + ", ".join(f"{i[len(lead):]} {v:.3f}x" for i, v in s[col].iloc[1:].items()) + ".",
                   dict(best=best[len(lead):], **{i[len(lead):]: float(v) for i, v in s[col].items()}))


def fold_configurations() -> dict[str, frozenset[str]]:
    """fast's rounding set (built_configurations's "fold_norm"), the same with each of its points but the output
    left out ("fold_norm but X"), with split_scores, and "only output": what each of fast's roundings costs."""
    built = built_configurations()
    fold = built["fold_norm"]
    points = [x for x in KNOWN_ROUNDINGS if x in fold and x != "output"]
    return {"fold_norm": fold, **{f"fold_norm but {x}": fold - {x} for x in points},
            "fold_norm + split_scores": built["fold_norm + split_scores"], "only output": frozenset({"output"})}


def state_in_fp32(df: pd.DataFrame) -> Summary:
    """What keeping the state in fp32 through the output product (all but state_for_output) does to the emulated
    max error at the longest length, and the floor a bf16 output sets (only output): a descriptive summary."""
    s = savings(df)
    r, floor = float(s.vs_all.get("all but state_for_output")), float(s.vs_all.get("only output"))
    return Summary(f"At {int(df.n_chunks.max())} chunks, keeping the state in fp32 through the output product "
                   f"leaves the emulated max error at {r:.3f}x of all roundings'; rounding only the output gives "
                   f"{floor:.3f}x.", dict(state_for_output=r, only_output=floor))


def _device_errors(sweep: pd.DataFrame, regime: str, initial_state: bool, n: int, caller: str) -> pd.Series:
    """Each backend's measured max error at `n` chunks in a device sweep's `regime` / `initial_state` rows,
    smallest first; ValueError (naming `caller`) where the sweep has none."""
    dev = sweep[(sweep.regime == regime) & (sweep.initial_state == initial_state) & (sweep.n_chunks == n)]
    dev = dev.groupby("backend").max_abs_err.max().sort_values()
    if dev.empty:
        raise ValueError(f"{caller}: the sweep has no {regime} rows at {n} chunks")
    return dev


def against_device(df: pd.DataFrame, sweep: pd.DataFrame, regime: str = "slow_gate",
                   initial_state: bool = True) -> Summary:
    """The emulation beside a device sweep (benchmarks.sweep's sweep.csv) at the table's longest length: the
    emulated error with all roundings and with the best single saving, against every backend's measured error on
    the same draw (`regime`, `initial_state`): a descriptive summary."""
    n = int(df.n_chunks.max())
    dev = _device_errors(sweep, regime, initial_state, n, "against_device")
    s = savings(df)
    best = largest_saving(df).numbers["best"]
    emulated = float(df[(df.config == "all") & (df.seq_len == df.seq_len.max())].max_abs_err.iloc[0])
    return Summary(f"At {n} chunks ({regime.replace('_', ' ')}, {'with' if initial_state else 'no'} initial "
                   f"state): emulated error {emulated:.3e} with every rounding, "
                   f"{float(s.loc['all but ' + best, 'max_abs_err']):.3e} without {best}; measured on the device: "
                   + ", ".join(f"{b} {v:.3e}" for b, v in dev.items()) + ".",
                   dict(emulated_all=emulated, **{f"device_{b}": float(v) for b, v in dev.items()}))


def built_against_device(df: pd.DataFrame, sweep: pd.DataFrame, regime: str = "slow_gate",
                         initial_state: bool = True) -> Summary:
    """A :func:`budget` table of :func:`built_configurations` at its longest length beside a device sweep's
    measured errors on the same draw (`regime`, `initial_state`): a descriptive summary."""
    n = int(df.n_chunks.max())
    dev = _device_errors(sweep, regime, initial_state, n, "built_against_device")
    emu = df[df.seq_len == df.seq_len.max()].set_index("config").max_abs_err
    return Summary(f"At {n} chunks ({regime.replace('_', ' ')}, {'with' if initial_state else 'no'} initial "
                   "state), emulated: " + ", ".join(f"{c} {v:.3e}" for c, v in emu.items())
                   + "; measured on the device: " + ", ".join(f"{b} {v:.3e}" for b, v in dev.items()) + ".",
                   {**{f"emulated_{c}": float(v) for c, v in emu.items()},
                    **{f"device_{b}": float(v) for b, v in dev.items()}})


def lowers(df: pd.DataFrame, config: str, than: str, *, at_most: float) -> Finding:
    """At the longest length of a :func:`budget` table, `config`'s max and mean error are each at most `at_most`
    times `than`'s; raises otherwise (NaN never passes)."""
    last = df[df.seq_len == df.seq_len.max()].set_index("config")
    missing = {config, than} - set(last.index)
    if missing:
        raise _fail(f"lowers: the table has no {', '.join(sorted(missing))} rows", sorted(last.index))
    r = {e: float(last.loc[config, e] / last.loc[than, e]) for e in ("max_abs_err", "mean_abs_err")}
    n = int(df.n_chunks.max())
    if not all(v <= at_most for v in r.values()):
        raise _fail(f"lowers: {config}'s error at {n} chunks is above {at_most}x {than}'s", r)
    return Finding(f"At {n} chunks {config}'s emulated max error is {r['max_abs_err']:.3f}x {than}'s and its mean "
                   f"error {r['mean_abs_err']:.3f}x (rule: each at most {at_most}x).", r)


#: How close the emulation without roundings must come to the float64 recurrence: float64 roundoff grown over the
#: chunk recurrence stays orders of magnitude below this, and a modelling mistake lands orders above.
EXACT_TOL = 1e-10


def exact_without_roundings(df: pd.DataFrame, tol: float = EXACT_TOL) -> Finding:
    """The emulation with no rounding (config "none") is the float64 recurrence: max error at most `tol` at every
    length. Raises otherwise: the emulation then models something other than the algorithm."""
    none = df[df.config == "none"]
    if none.empty:
        raise _fail("exact_without_roundings: the table has no 'none' rows", sorted(set(df.config)))
    worst = float(none.max_abs_err.max(skipna=False))  # NaN never passes
    if not worst <= tol:
        raise _fail(f"the emulation without roundings is {worst:.3e} from the float64 recurrence (> {tol:g})",
                    none.set_index("seq_len").max_abs_err.to_dict())
    return Finding(f"Without roundings the emulation is the float64 recurrence: max error {worst:.1e} at "
                   f"{none.n_chunks.min()}-{none.n_chunks.max()} chunks (rule: at most {tol:g}).",
                   dict(worst=worst))
