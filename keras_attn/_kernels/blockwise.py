"""Blockwise, memory-efficient attention with an online softmax, in `keras.ops`.

The algorithm is FlashAttention's (Dao et al., 2022; Rabe & Staats, 2021),
written with Keras's backend-agnostic control flow so that it runs on every
backend:

Forward. Queries are cut into blocks of `bq` rows and keys/values into blocks
of `bk` columns. An outer map (`keras.ops.scan`, see `_map`) walks the query
blocks; for each,
an inner `keras.ops.fori_loop` walks the key blocks keeping, per query row,
the running maximum `m` of the logits, the running sum `l` of
`exp(logit - m)` and the running weighted sum `acc` of the values; when the
maximum grows, `l` and `acc` are rescaled by `exp(m_old - m_new)`. The output
row is `acc / l`, and `lse = m + log(l)` (the log of the softmax
denominator) is kept, one float per query row. With `is_causal`, the inner
loop stops at the last key block that any row of the query block may see,
so the key blocks above the diagonal (fully masked) are never computed; the
bound depends on the query block, so it is a dynamic loop bound (a
`while_loop` on JAX and TensorFlow, a Python loop on PyTorch).

Memory. At any time one step holds `(..., bq, bk)` scores plus the
`(..., bq, d_v)` accumulators: linear in the sequence length for a fixed
block size. Nothing of size `T x S` is ever formed (unless the caller passes
a `T x S` mask or bias, which is then only read block by block).

Backward. A loop cannot be differentiated by storing its intermediates
without storing every block of scores again (`jax.lax.scan`'s and
TensorFlow's loop gradients keep the per-iteration residuals, i.e. `T x S`
probabilities in total, and a dynamic-bound `while_loop` is not
reverse-differentiable on JAX at all). So the function carries a custom
gradient (`keras.ops.custom_gradient`) that keeps only `q, k, v, bias, out`
and `lse` (linear memory) and recomputes the scores block by block:
`p = exp(s - lse)`, `dv += pᵀ do`, `ds = p * (do vᵀ - rowsum(do * out))`,
`dk += dsᵀ q * scale`, `dq += ds k * scale`, `dbias = ds`. Two passes avoid
scatter-updates of a shared buffer (which would copy it on PyTorch): one map
over key blocks accumulates `dk` and `dv` (each block computed transposed,
`k qᵀ`, so that `pᵀ` and `dsᵀ` come without a transposed copy), one map over
query blocks accumulates `dq` (and emits `dbias` tiles when there is a bias). The
backward pass therefore also needs memory linear in the sequence length,
plus the size of `bias` for its gradient.

Fully masked rows give a zero output row (`l == 0`) and zero, finite
gradients.
"""

import keras
from keras import ops

from keras_attn._kernels.blocks import (
    _Blocks,
    _from_k_blocks,
    _from_q_blocks,
    _k_blocks,
    _map,
    _q_blocks,
)
from keras_attn._kernels.common import group_size
from keras_attn._kernels.compiled import compiled
from keras_attn._shapes import (
    broadcast_lead,
    pad_axis,
    softmax_dtype,
    static_shape,
    sum_to,
    to_rank,
)
from keras_attn.options import KernelSpec

__all__ = ["blockwise_attention"]

_NEG_INF = float("-inf")


def _forward(q, k, v, bias, mask, g, *, sinks=None):
    """Output `(..., Tp, d_v)` and `lse` `(..., Tp, 1)`, in the dtype of `q`.

    `sinks` `(..., Tp, 1)`: each row's sink logit, which starts the running state
    (`m = sink`, `l = exp(sink - m) = 1`, `acc = 0`: a key of zero value), so that
    `lse` includes it and a row with no allowed key gives zeros and `lse = sink`.
    """
    dtype = q.dtype
    d_v = v.shape[-1]

    def q_step(xs):
        i, q_i = xs[:2]

        def kv_step(j, state):
            m, total, acc = state
            s, allowed, _ = g.logits(q_i, g.cols(k, j), bias, mask, i, j)
            if allowed is not None:
                s = ops.where(allowed, s, _NEG_INF)
            m_new = ops.maximum(m, ops.max(s, axis=-1, keepdims=True))
            m_safe = ops.where(ops.isfinite(m_new), m_new, ops.zeros_like(m_new))
            p = ops.exp(s - m_safe)
            correction = ops.exp(m - m_safe)
            total = total * correction + ops.sum(p, axis=-1, keepdims=True)
            acc = acc * correction + ops.matmul(p, g.cols(v, j))
            return m_new, total, acc

        if sinks is None:
            m0 = ops.full(list(g.lead) + [g.bq, 1], _NEG_INF, dtype=dtype)
            l0 = ops.zeros(list(g.lead) + [g.bq, 1], dtype=dtype)
        else:
            m0, l0 = xs[2], ops.ones(list(g.lead) + [g.bq, 1], dtype=dtype)
        acc0 = ops.zeros(list(g.lead) + [g.bq, d_v], dtype=dtype)
        m, total, acc = ops.fori_loop(*g.key_range(i), kv_step, (m0, l0, acc0))
        has_key = total > 0
        safe_l = ops.where(has_key, total, ops.ones_like(total))
        m_safe = ops.where(ops.isfinite(m), m, ops.zeros_like(m))
        out_i = acc / safe_l
        lse_i = ops.where(has_key, m_safe + ops.log(safe_l), ops.zeros_like(total))
        return out_i, lse_i

    steps = ops.arange(g.nq, dtype="int32")
    like = (ops.zeros(list(g.lead) + [g.bq, d_v], dtype), ops.zeros(list(g.lead) + [g.bq, 1], dtype))
    xs = (steps, _q_blocks(q, g)) + (() if sinks is None else (_q_blocks(sinks, g),))
    out, lse = _map(q_step, xs, like)
    return _from_q_blocks(out, g), _from_q_blocks(lse, g)


def _probabilities(g, q_i, k_j, bias, mask, lse_i, *, i, j, transposed=False):
    """Block `(i, j)` of the softmax weights, recomputed from the kept `lse`, and `d_cap`
    (`transposed`: `(..., bk, bq)`, with `lse_i` given as `(..., 1, bq)`)."""
    s, allowed, d_cap = g.logits(q_i, k_j, bias, mask, i, j, transposed=transposed)
    p = ops.exp(s - lse_i)
    if allowed is not None:
        p = ops.where(allowed, p, ops.zeros_like(p))
    return p, d_cap


def _t(x):
    """`x` with its last two axes swapped."""
    return ops.swapaxes(x, -1, -2)


def _uncap(ds, d_cap):
    """The gradient w.r.t. `q k^T * scale` from the one w.r.t. the (capped) logits."""
    return ds if d_cap is None else ds * d_cap


def _key_pass(q, k, v, bias, mask, g, *, lse, delta, d_out):
    """Pass 1: `dk`, `dv` of each key block, over the query blocks that see it."""
    dtype = q.dtype
    d_k, d_v = q.shape[-1], v.shape[-1]

    def k_step(xs):
        j, k_j, v_j = xs

        def q_inner(i, state):
            dk, dv = state
            q_i, do_i = g.rows(q, i), g.rows(d_out, i)
            lse_i, delta_i = g.rows(lse, i), g.rows(delta, i)  # (..., bq, 1)
            if flip:  # the block as (..., bk, bq): p^T and ds^T as the products take them
                lse_i, delta_i = _t(lse_i), _t(delta_i)  # (..., 1, bq)
                p, d_cap = _probabilities(g, q_i, k_j, bias, mask, lse_i, i=i, j=j, transposed=True)
                dp = ops.matmul(v_j, _t(do_i))  # (..., bk, bq)
            else:
                p, d_cap = _probabilities(g, q_i, k_j, bias, mask, lse_i, i=i, j=j)
                dp = ops.matmul(do_i, _t(v_j))  # (..., bq, bk)
            ds = _uncap(p * (dp - delta_i), d_cap)
            dv = dv + ops.matmul(p if flip else _t(p), do_i)  # (..., bk, d_v)
            dk = dk + ops.matmul(ds if flip else _t(ds), q_i) * g.scale  # (..., bk, d_k)
            return dk, dv

        return ops.fori_loop(*g.query_range(j), q_inner, init)

    # Transposed blocks save a copy per block in a loop; with one query block there
    # is no loop, and XLA shares the forward's `q k^T` with this pass, which a
    # transposed block would compute anew (JAX, B=8, H=8, T=128: 1.46x the time).
    flip = g.nq > 1

    init = (ops.zeros(list(g.lead) + [g.bk, d_k], dtype),
            ops.zeros(list(g.lead) + [g.bk, d_v], dtype))
    steps = ops.arange(g.nk, dtype="int32")
    dk, dv = _map(k_step, (steps, _k_blocks(k, g), _k_blocks(v, g)), init)
    return _from_k_blocks(dk, g), _from_k_blocks(dv, g)


def _query_pass(q, k, v, bias, mask, g, *, lse, delta, d_out):
    """Pass 2: `dq` of each query block, and the bias gradient tile by tile."""
    dtype = q.dtype
    d_k = q.shape[-1]

    def ds_block(q_i, do_i, lse_i, delta_i, i, j):
        """`(d logits, d (q k^T * scale), k_j)` of block `(i, j)`."""
        k_j = g.cols(k, j)
        p, d_cap = _probabilities(g, q_i, k_j, bias, mask, lse_i, i=i, j=j)
        dp = ops.matmul(do_i, ops.swapaxes(g.cols(v, j), -1, -2))  # (..., bq, bk)
        ds = p * (dp - delta_i)
        return ds, _uncap(ds, d_cap), k_j

    if bias is not None:
        t_full, s_full = bias.shape[-2] != 1, bias.shape[-1] != 1
        tile_shape = tuple(bias.shape[:-2]) + (g.bq if t_full else 1, g.bk if s_full else 1)

    def q_step(xs):
        i, q_i, do_i, lse_i, delta_i = xs
        dq0 = ops.zeros(list(g.lead) + [g.bq, d_k], dtype)
        if bias is None:
            def k_inner(j, dq):
                _, ds, k_j = ds_block(q_i, do_i, lse_i, delta_i, i, j)
                return dq + ops.matmul(ds, k_j) * g.scale
            return ops.fori_loop(*g.key_range(i), k_inner, dq0)

        lo, hi = g.key_range(i)

        # With a bias, each key block also yields a bias-gradient tile, so the
        # key blocks are mapped (a static count; blocks outside the causal
        # triangle or the window are skipped by `cond`) and the dq
        # contributions summed.
        def k_block(j):
            def compute():
                d_logits, ds, k_j = ds_block(q_i, do_i, lse_i, delta_i, i, j)
                return ops.matmul(ds, k_j) * g.scale, sum_to(d_logits, tile_shape)

            def skip():  # a block no query of this block may see: nothing to do
                return dq0, ops.zeros(tile_shape, dtype)

            return ops.cond(ops.logical_and(j >= lo, j < hi), compute, skip)

        like = (dq0, ops.zeros(tile_shape, dtype))
        dq, d_bias = _map(k_block, ops.arange(g.nk, dtype="int32"), like)
        dq = ops.sum(dq, axis=0)
        if s_full:  # (nk, ..., bq|1, bk) -> (..., bq|1, Sp)
            d_bias = ops.moveaxis(d_bias, 0, len(d_bias.shape) - 2)
            d_bias = ops.reshape(d_bias, tuple(bias.shape[:-2]) + (tile_shape[-2], g.Sp))
        else:
            d_bias = ops.sum(d_bias, axis=0)
        return dq, d_bias

    steps = ops.arange(g.nq, dtype="int32")
    xs = (steps, _q_blocks(q, g), _q_blocks(d_out, g), _q_blocks(lse, g), _q_blocks(delta, g))
    like = ops.zeros(list(g.lead) + [g.bq, d_k], dtype)
    if bias is not None:
        bias_rows = tuple(bias.shape[:-2]) + (tile_shape[-2], g.Sp if s_full else tile_shape[-1])
        like = (like, ops.zeros(bias_rows, dtype))
    result = _map(q_step, xs, like)
    if bias is None:
        return _from_q_blocks(result, g), None
    dq, d_bias = result
    if t_full:  # (nq, ..., bq, Sp|1) -> (..., Tp, Sp|1)
        d_bias = ops.moveaxis(d_bias, 0, len(d_bias.shape) - 3)
        d_bias = ops.reshape(d_bias, tuple(bias.shape[:-2]) + (g.Tp, d_bias.shape[-1]))
    else:
        d_bias = ops.sum(d_bias, axis=0)
    return _from_q_blocks(dq, g), d_bias


def _backward(q, k, v, bias, mask, g, *, out, lse, d_out):
    """Gradients of `sum(out * d_out)` w.r.t. q, k, v (and bias), recomputing scores.

    Two passes avoid scatter-updates of a shared buffer (which would copy it
    on PyTorch): one over key blocks for `dk`, `dv`, one over query blocks
    for `dq` (and `dbias`).
    """
    delta = ops.sum(d_out * out, axis=-1, keepdims=True)  # (..., Tp, 1)
    dk, dv = _key_pass(q, k, v, bias, mask, g, lse=lse, delta=delta, d_out=d_out)
    dq, d_bias = _query_pass(q, k, v, bias, mask, g, lse=lse, delta=delta, d_out=d_out)
    return dq, dk, dv, d_bias


def _attention_fn(mask, g, has_bias, has_sinks=False):
    """`f(q, k, v[, bias][, sinks]) -> out` with the recomputing custom gradient.

    `sinks` `(..., Tp, 1)` per row: its gradient is `-exp(sink - lse) * delta` (the
    sink's weight times minus `rowsum(d_out * out)`); those of q, k and v keep their
    formulas, with `lse` including the sink.
    """

    def split(extras):
        bias = extras[0] if has_bias else None
        return bias, (extras[-1] if has_sinks else None)

    def forward(q, k, v, *extras):
        bias, sinks = split(extras)
        return _forward(q, k, v, bias, mask, g, sinks=sinks)

    if keras.backend.backend() == "numpy":  # inference only: no gradient to define
        return lambda *args: forward(*args)[0]

    @ops.custom_gradient
    def attend(q, k, v, *extras):
        # The forward runs on stop-gradient copies: an eager TensorFlow
        # GradientTape would otherwise record every block's intermediates
        # (O(T * S) memory) although the custom gradient never uses them.
        out, lse = forward(*(ops.stop_gradient(x) for x in (q, k, v, *extras)))
        bias, sinks = split(extras)

        def grad(*args, upstream=None):
            if upstream is None:
                (upstream,) = args
            dq, dk, dv, d_bias = _backward(q, k, v, bias, mask, g, out=out, lse=lse, d_out=upstream)
            grads = (dq, dk, dv) + ((d_bias,) if has_bias else ())
            if has_sinks:
                delta = ops.sum(upstream * out, axis=-1, keepdims=True)  # (..., Tp, 1)
                grads += (-ops.exp(sinks - lse) * delta,)
            return grads

        return out, grad

    return attend


def _dims(x, stop):
    """The dims of `x` before axis `stop`: ints where static, scalar tensors where not."""
    shape = ops.shape(x)
    return [d if isinstance(d, int) else shape[i] for i, d in enumerate(static_shape(x)[:stop])]


def _rows_by_position(x, group, T):
    """`(..., H|1, T|1, w)` -> `(..., H_kv|1, T*G|1, w)`: row t*G + g is head g of a group.

    Grouped query heads share a key/value head, so their queries are stacked
    along the rows, position-major (each position repeated G times): the
    rows stay ordered by position, which keeps the causal and window block
    bounds, and the keys and values are never repeated.
    """
    lead, (heads, rows, width) = _dims(x, -3), x.shape[-3:]
    if heads == 1:
        return x if rows == 1 else ops.repeat(x, group, axis=-2)  # (..., 1, T*G, w)
    x = ops.reshape(x, lead + [heads // group, group, rows, width])  # (..., H_kv, G, T|1, w)
    if rows == 1:
        x = ops.broadcast_to(x, tuple(lead) + (heads // group, group, T, width))
    x = ops.swapaxes(x, -3, -2)  # (..., H_kv, T, G, w)
    return ops.reshape(x, lead + [heads // group, T * group, width])


def _heads_from_rows(x, group, T):
    """`(..., H_kv, T*G, w)` -> `(..., H, T, w)`, the inverse of `_rows_by_position`."""
    lead, (kv_heads, _, width) = _dims(x, -3), x.shape[-3:]
    x = ops.reshape(x, lead + [kv_heads, T, group, width])
    x = ops.swapaxes(x, -3, -2)  # (..., H_kv, G, T, w)
    return ops.reshape(x, lead + [kv_heads * group, T, width])


def _pad_to_blocks(x, rank, g):
    """A mask or bias `(..., rows|1, S|1)` padded to `(..., Tp|1, Sp|1)`."""
    x = to_rank(x, rank)
    if x.shape[-2] != 1:
        x = pad_axis(x, -2, g.Tp - g.T)
    if x.shape[-1] != 1:
        x = pad_axis(x, -1, g.Sp - g.S)
    return x


def blockwise_attention(query, key, value, mask=None, bias=None, *, spec=None, block_size=512,
                        sinks=None, **fields):
    """Memory-efficient attention over `(..., T, d)` tensors (see the module doc).

    Args:
        query: `(..., H, T, d_k)`; key: `(..., H_kv, S, d_k)`; value:
            `(..., H_kv, S, d_v)`, with static `T`, `S`, `d_k`, `d_v`. When
            H_kv < H (grouped heads, H divisible by H_kv), query head n uses
            key/value head n // (H / H_kv); keys and values are not repeated.
        mask: optional bool, broadcastable to `(..., H, T, S)`; True = may attend.
        bias: optional additive float, broadcastable to `(..., H, T, S)`.
        spec: the `keras_attn.options.KernelSpec` (or its fields by keyword,
            `is_causal=True, scale=0.5, ...`; dropout is not applied here):
            `is_causal`, bottom-right aligned (`j <= i + S - T`); `scale`, the
            logit multiplier; `sliding_window` W: position p sees key j iff
            `0 <= p - j < W` (causal) or `|p - j| < W`, and blocks entirely
            outside the window are skipped, so the cost grows like T * W;
            `logit_soft_cap` c: logits become `c * tanh(logits / c)` before
            the bias and masks.
        block_size: query and key block length.
        sinks: `(H,)` sink logits (attention sinks, with `spec.sinks`), or None:
            each row's running softmax state starts from its head's sink.

    Returns:
        `(..., H, T, d_v)` in the dtype of `value`; zero rows where no key is
        allowed.
    """
    spec = KernelSpec(**fields) if spec is None else spec
    settings = dict(spec=spec.inference(), block_size=block_size)
    # On JAX an eager call at a shape seen before reuses one compiled program
    # (`keras_attn._kernels.compiled`): the loop bodies are closures made per call.
    program = compiled(_blockwise, settings)
    if program is not None:
        return program(query, key, value, mask, bias, sinks)
    return _blockwise(query, key, value, mask, bias, sinks, **settings)


def _blockwise(query, key, value, mask, bias, sinks=None, *, spec, block_size):
    out_dtype = value.dtype
    compute = softmax_dtype(query.dtype)
    q, k, v = (ops.cast(t, compute) for t in (query, key, value))
    T, group = q.shape[-2], group_size(q, k)
    rank = len(q.shape)
    if mask is not None:
        mask = to_rank(ops.cast(mask, "uint8"), rank)
    if bias is not None:
        bias = to_rank(ops.cast(bias, compute), rank)
    if sinks is not None:  # (H,) -> a logit per row, (..., H, T, 1)
        sinks = ops.reshape(ops.cast(sinks, compute), (-1, 1, 1))
        sinks = to_rank(ops.broadcast_to(sinks, (static_shape(sinks)[0], T, 1)), rank)
    if group > 1:
        q = _rows_by_position(q, group, T)  # (..., H_kv, T*G, d_k)
        mask = None if mask is None else _rows_by_position(mask, group, T)
        bias = None if bias is None else _rows_by_position(bias, group, T)
        sinks = None if sinks is None else _rows_by_position(sinks, group, T)
    (q, k, v), lead = broadcast_lead([q, k, v])
    rows, S = q.shape[-2], k.shape[-2]
    g = _Blocks(rows, S, block_size, lead, spec=spec, group=group)
    rank = len(lead) + 2

    q = pad_axis(q, -2, g.Tp - rows)
    k = pad_axis(k, -2, g.Sp - S)
    v = pad_axis(v, -2, g.Sp - S)
    mask = None if mask is None else _pad_to_blocks(mask, rank, g)
    args = [q, k, v]
    if bias is not None:
        bias = _pad_to_blocks(bias, rank, g)
        args.append(bias)
    if sinks is not None:  # (..., Tp, 1), broadcast to the rows' leading dims
        sinks = pad_axis(ops.broadcast_to(sinks, tuple(lead) + (rows, 1)), -2, g.Tp - rows)
        args.append(sinks)

    out = _attention_fn(mask, g, bias is not None, sinks is not None)(*args)
    if g.Tp != rows:
        out = out[..., :rows, :]
    if group > 1:
        out = _heads_from_rows(out, group, T)  # (..., H, T, d_v)
    return ops.cast(out, out_dtype)
