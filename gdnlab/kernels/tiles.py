"""Device functions shared by every chunked kernel, so that each path rounds in exactly the same place.

Token buffers are row-major over flattened tokens: row `t` of head `h` of a `[tokens, heads, D]` tensor starts at
`(t * heads + h) * D`. Callers pass `ptr` already offset to the head and `stride = heads * D`.
"""
import torch
import triton
import triton.language as tl


@triton.jit
def as_index(x, I64: tl.constexpr):
    """A loaded row or chunk index, widened to int64 when some buffer's element offsets can pass 2^31 (I64), else
    left int32: 64-bit address arithmetic on every tile costs the chunk loops time."""
    if I64:
        return x.to(tl.int64)
    else:
        return x


@triton.jit
def l2_norm_of_rows(x):
    """sqrt(sum(x^2) + 1e-6) per row of an fp32 tile: the one l2-norm denominator of every kernel."""
    return tl.sqrt(tl.sum(x * x, 1) + 1e-6)


@triton.jit
def load_rows(ptr, rows, mrow, stride, col0, NCOL: tl.constexpr, COLS: tl.constexpr):
    """A [rows, NCOL] tile starting at column col0; masked rows and columns past COLS read as zero."""
    c = col0 + tl.arange(0, NCOL)
    return tl.load(ptr + rows[:, None] * stride + c[None, :], mask=mrow[:, None] & (c[None, :] < COLS), other=0.0)


@triton.jit
def load_tile(ptr, desc, rows, mrow, stride, r0, col0, NCOL: tl.constexpr, COLS: tl.constexpr, TMA: tl.constexpr):
    """load_rows, or with TMA the same tile through `desc`, a tensor descriptor over the sequence's rows (r0: the
    tile's first row within them). A descriptor reads zeros outside its shape, as load_rows's masks do, so both
    give the same tile; on Hopper it is a TMA copy, and the tile's addresses are never held in registers."""
    if TMA:
        return desc.load([r0, col0])
    else:
        return load_rows(ptr, rows, mrow, stride, col0, NCOL, COLS)


@triton.jit
def store_tile(ptr, desc, rows, mrow, stride, r0, col0, val, NCOL: tl.constexpr, COLS: tl.constexpr,
               TMA: tl.constexpr):
    """store_rows, or with TMA through `desc` (as load_tile): a descriptor skips what lies outside its shape, as
    store_rows's masks do."""
    if TMA:
        desc.store([r0, col0], val.to(ptr.dtype.element_ty))
    else:
        store_rows(ptr, rows, mrow, stride, col0, val, NCOL, COLS)


@triton.jit
def sequence_rows(ptr, bos, n_rows, stride, COLS: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
    """A tensor descriptor over one sequence's rows of a token buffer (`ptr` offset to the head, `n_rows` rows from
    `bos`) in [BR, BC] blocks. TMA needs the rows' start and stride 16-byte aligned (tma_ok)."""
    return tl.make_tensor_descriptor(ptr + bos * stride, shape=[n_rows, COLS], strides=[stride, 1],
                                     block_shape=[BR, BC])


def tma_ok(*rows: torch.Tensor) -> bool:
    """Whether token buffers ``[tokens, heads, D]`` can be read through tensor descriptors: contiguous, their start
    and each head's row 16-byte aligned (a TMA copy's requirement), and a Triton with device-side descriptors."""
    return hasattr(tl, "make_tensor_descriptor") and all(
        x.is_contiguous() and not x.data_ptr() % 16 and not (x.shape[-1] * x.element_size()) % 16 for x in rows)


def _descriptor_memory(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    """Global memory for the descriptors a kernel builds on the device (Triton asks its allocator for it)."""
    return torch.empty(size, dtype=torch.int8, device="cuda" if torch.cuda.is_available() else "cpu")


def use_descriptors() -> None:
    """Give Triton the allocator that kernels building tensor descriptors on the device need."""
    triton.set_allocator(_descriptor_memory)


@triton.jit
def store_rows(ptr, rows, mrow, stride, col0, val, NCOL: tl.constexpr, COLS: tl.constexpr):
    """Store a [rows, NCOL] tile at column col0, skipping masked rows and columns past COLS."""
    c = col0 + tl.arange(0, NCOL)
    tl.store(ptr + rows[:, None] * stride + c[None, :], val.to(ptr.dtype.element_ty),
             mask=mrow[:, None] & (c[None, :] < COLS))


@triton.jit
def state_tile_ptrs(base, k0, v0, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, V_FIRST: tl.constexpr):
    """Pointers and mask of the [64, BV] (K-first view) tile of a K x V state stored K-first or V-first."""
    ik = k0 + tl.arange(0, 64)
    iv = v0 + tl.arange(0, BV)
    if V_FIRST:
        p = base + iv[None, :] * K + ik[:, None]
    else:
        p = base + ik[:, None] * V + iv[None, :]
    return p, (ik[:, None] < K) & (iv[None, :] < V)


@triton.jit
def load_state(base, k0, v0, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, V_FIRST: tl.constexpr):
    """A [64, BV] fp32 tile of a stored state (any float dtype, either layout)."""
    p, m = state_tile_ptrs(base, k0, v0, K, V, BV, V_FIRST)
    return tl.load(p, mask=m, other=0.0).to(tl.float32)


@triton.jit
def store_state(base, k0, v0, val, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, V_FIRST: tl.constexpr):
    """Store a [64, BV] tile into a state buffer (either layout), converting to the buffer's dtype."""
    p, m = state_tile_ptrs(base, k0, v0, K, V, BV, V_FIRST)
    tl.store(p, val.to(base.dtype.element_ty), mask=m)


@triton.jit
def inter_and_scores(q_ptr, k_ptr, rows, mrow, sqk, k0, h, K: tl.constexpr, q_norm=1.0,
                     NORM_Q: tl.constexpr = False, qd=None, kd=None, r0=0, TMA: tl.constexpr = False):
    """Q.h (inter-chunk term, fp32) and Q.K^T (raw scores) for one 64-wide K tile. h is [64, BV], bf16 or fp32.
    With NORM_Q, q is read as given and divided by its rows' l2 norms `q_norm` (fp32, l2_norm_of_rows of the whole
    row), then rounded back to q's dtype: the same numbers an l2-norm kernel would have stored. With TMA q and k
    come through the descriptors qd and kd (load_tile)."""
    q = load_tile(q_ptr, qd, rows, mrow, sqk, r0, k0, 64, K, TMA)
    if NORM_Q:
        q = (q.to(tl.float32) / q_norm[:, None]).to(q.dtype)
    k = load_tile(k_ptr, kd, rows, mrow, sqk, r0, k0, 64, K, TMA)
    return tl.dot(q.to(h.dtype), h, input_precision="ieee"), tl.dot(q, tl.trans(k))


@triton.jit
def split_dot(a, b):
    """a @ b for fp32 a and bf16 b, with a as the sum of two bf16 terms (its rounding and the remainder's): about
    16 significant bits of a instead of 8, two tensor-core dots."""
    hi = a.to(tl.bfloat16)
    return tl.dot(hi, b) + tl.dot((a - hi.to(tl.float32)).to(tl.bfloat16), b)


@triton.jit
def chunk_output(o_inter, scores, g_row, g_col, rows, mrow, operand, scale, SPLIT: tl.constexpr = False):
    """O = scale * [(Q h) * exp(G) + (tril(Q K^T * exp(G_i - G_j))) operand]; operand is bf16 [BT, BV]. The gates
    of the rows (g_row: Q h and the scores' rows) and of the scores' columns (g_col) are both G but where a
    kernel folds the q and k norms into them (fwd_o_kernel's FOLD). The gated scores are rounded to bf16 for their
    product, or with SPLIT taken as two bf16 terms (split_dot): where the state decays within a chunk, that
    rounding is the largest of the output's below its own (docs/speed-notes.md item 74)."""
    o_inter = o_inter * tl.exp(g_row)[:, None]
    causal = (rows[:, None] >= rows[None, :]) & mrow[:, None] & mrow[None, :]
    gdiff = tl.where(causal, g_row[:, None] - g_col[None, :], 0.0)
    scores = tl.where(causal, scores * tl.exp(gdiff), 0.0)
    if SPLIT:
        return o_inter * scale + split_dot(scores, operand) * scale
    else:
        return o_inter * scale + tl.dot(scores.to(operand.dtype), operand) * scale


@triton.jit
def w_times_h(w_ptr, rows, mrow, sw, k0, h_bf16, K: tl.constexpr):
    """W.h for one K tile: the part of the chunk's state contribution that V_new subtracts."""
    return rows_times_h(w_ptr, rows, mrow, sw, k0, h_bf16, K)[1]


@triton.jit
def rows_times_h(w_ptr, rows, mrow, sw, k0, h_bf16, K: tl.constexpr, desc=None, r0=0, TMA: tl.constexpr = False):
    """w_times_h's rows tile and product, the tile for a caller that uses it again (absorb_tiles); with TMA the
    tile comes through `desc` (load_tile)."""
    w = load_tile(w_ptr, desc, rows, mrow, sw, r0, k0, 64, K, TMA)
    return w, tl.dot(w, h_bf16)


@triton.jit
def gated_delta(v_new, g_cum, g_last, mrow):
    """V_new * exp(G_last - G), rounded to bf16: what the state absorbs from this chunk."""
    return tl.where(mrow[:, None], v_new * tl.exp(g_last - g_cum)[:, None], 0.0).to(tl.bfloat16)


@triton.jit
def absorb(s, k_ptr, rows, mrow, sqk, k0, vg, eg, K: tl.constexpr, V_FIRST: tl.constexpr, desc=None, r0=0,
           TMA: tl.constexpr = False):
    """Carry one K tile of the state across a chunk: S = exp(G_last) S + K_tile^T vg ([BV, 64] when V_FIRST); with
    TMA the K tile comes through `desc` (load_tile)."""
    return absorb_tile(s, load_tile(k_ptr, desc, rows, mrow, sqk, r0, k0, 64, K, TMA), vg, eg, V_FIRST)


@triton.jit
def absorb_tile(s, k, vg, eg, V_FIRST: tl.constexpr):
    """absorb() with the K tile's rows `k` already loaded."""
    if V_FIRST:
        return s * eg + tl.dot(tl.trans(vg), k)
    else:
        return s * eg + tl.dot(tl.trans(k), vg)


@triton.jit
def absorb_all(s0, s1, s2, s3, k_ptr, rows, mrow, sqk, vg, eg, K: tl.constexpr, V_FIRST: tl.constexpr, desc=None,
               r0=0, TMA: tl.constexpr = False):
    """absorb() on every 64-wide K tile of the state (tiles past K stay as they are)."""
    s0 = absorb(s0, k_ptr, rows, mrow, sqk, 0, vg, eg, K, V_FIRST, desc, r0, TMA)
    if K > 64:
        s1 = absorb(s1, k_ptr, rows, mrow, sqk, 64, vg, eg, K, V_FIRST, desc, r0, TMA)
    if K > 128:
        s2 = absorb(s2, k_ptr, rows, mrow, sqk, 128, vg, eg, K, V_FIRST, desc, r0, TMA)
    if K > 192:
        s3 = absorb(s3, k_ptr, rows, mrow, sqk, 192, vg, eg, K, V_FIRST, desc, r0, TMA)
    return s0, s1, s2, s3


@triton.jit
def absorb_tiles(s0, s1, s2, s3, k0, k1, k2, k3, vg, eg, K: tl.constexpr, V_FIRST: tl.constexpr):
    """absorb_all() with K's tiles already loaded (k_i: columns 64 i ...; those past K are not read)."""
    s0 = absorb_tile(s0, k0, vg, eg, V_FIRST)
    if K > 64:
        s1 = absorb_tile(s1, k1, vg, eg, V_FIRST)
    if K > 128:
        s2 = absorb_tile(s2, k2, vg, eg, V_FIRST)
    if K > 192:
        s3 = absorb_tile(s3, k3, vg, eg, V_FIRST)
    return s0, s1, s2, s3
