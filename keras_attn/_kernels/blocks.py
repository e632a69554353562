"""The block geometry of `blockwise_attention`: which blocks exist and may attend, and
the maps over them.

`_Blocks` holds the static sizes of one call (block sizes, counts, padded
lengths, the grouped-heads layout) and slices query/key blocks, their mask and
bias tiles, and the bounds of the key blocks a query block may see; `_map` and
`_to_blocks` / `_from_blocks` turn a padded `(..., L, w)` tensor into the xs of a
map over blocks and back. `keras_attn._kernels.blockwise` runs the forward pass
and the custom gradient on top of these.
"""

from keras import ops

from keras_attn._kernels.common import transform_logits
from keras_attn._masks import and_masks, may_attend

__all__ = ["_Blocks", "_from_k_blocks", "_from_q_blocks", "_k_blocks", "_map", "_q_blocks"]

def _clip(index, count):
    """A block index clipped to `[0, count]`, staying a Python int when it is one."""
    if isinstance(index, int):
        return min(max(index, 0), count)
    return ops.clip(index, 0, count)


def _bound(on_ints, on_tensors, a, b):
    """`max` / `min` of two block bounds: Python ints stay ints (static loop bounds)."""
    if isinstance(a, int) and isinstance(b, int):
        return on_ints(a, b)
    return on_tensors(a, b)


class _Blocks:
    """Static geometry of one blockwise call and the block-slicing helpers.

    Rows are query positions, each repeated `group` times when grouped heads
    share a key/value head (row r is position r // group; see
    `blockwise_attention`). Row r's query sits at absolute position
    `r // group + offset`, `offset = S - T` (bottom-right), and which keys it
    may see is `keras_attn._masks.may_attend`, evaluated one block at a time.
    `key_range` / `query_range` bound the blocks by the causal rule, the
    window and the chunks (`attention_chunk_size`), so blocks that no row may
    see are never computed.
    """

    def __init__(self, rows, S, block_size, lead, *, spec, group=1):
        self.T, self.S = rows, S
        self.bq, self.bk = min(block_size, rows), min(block_size, S)
        self.nq = -(-rows // self.bq)
        self.nk = -(-S // self.bk)
        self.Tp, self.Sp = self.nq * self.bq, self.nk * self.bk
        self.spec, self.group, self.scale = spec, group, spec.scale
        self.is_causal, self.sliding_window = spec.is_causal, spec.sliding_window
        self.chunk = spec.attention_chunk_size  # C: block-diagonal, blocks off the chunks skipped
        self.positional = spec.positional
        self.offset = S - rows // group  # position p may see key j iff j <= p + offset
        self.lead = lead  # leading dims (ints or scalar tensors)

    def _position(self, row):
        return row // self.group

    def key_range(self, i):
        """`(lo, hi)`: the key blocks that query block `i` may see."""
        if not self.positional:
            return 0, self.nk
        first = self._position(i * self.bq) + self.offset  # key at the first row's position
        last = self._position((i + 1) * self.bq - 1) + self.offset
        lo, hi = 0, self.nk
        if self.is_causal:
            hi = last // self.bk + 1
        elif self.sliding_window is not None:
            hi = (last + self.sliding_window - 1) // self.bk + 1
        if self.sliding_window is not None:
            lo = (first - self.sliding_window + 1) // self.bk
        if self.chunk is not None:  # keys from the first row's chunk to the last row's
            lo = _bound(max, ops.maximum, lo, (first // self.chunk) * self.chunk // self.bk)
            hi = _bound(min, ops.minimum, hi,
                        ((last // self.chunk + 1) * self.chunk - 1) // self.bk + 1)
        return _clip(lo, self.nk), _clip(hi, self.nk)

    def query_range(self, j):
        """`(lo, hi)`: the query blocks that may see key block `j`."""
        if not self.positional:
            return 0, self.nq
        lo, hi = 0, self.nq
        if self.is_causal or self.sliding_window is not None:
            reach = 0 if self.is_causal else self.sliding_window - 1  # how far ahead a query sees
            first_position = j * self.bk - self.offset - reach  # first query to see the block
            lo = (self.group * first_position) // self.bq
        if self.sliding_window is not None:
            # the last query whose window still reaches the block's last key
            last_position = (j + 1) * self.bk - 1 - self.offset + self.sliding_window - 1
            hi = (self.group * (last_position + 1) - 1) // self.bq + 1
        if self.chunk is not None:  # queries from the first key's chunk to the last key's
            first_query = (j * self.bk // self.chunk) * self.chunk - self.offset
            last_query = (((j + 1) * self.bk - 1) // self.chunk + 1) * self.chunk - 1 - self.offset
            lo = _bound(max, ops.maximum, lo, (self.group * first_query) // self.bq)
            hi = _bound(min, ops.minimum, hi, (self.group * (last_query + 1) - 1) // self.bq + 1)
        return _clip(lo, self.nq), _clip(hi, self.nq)

    def rows(self, x, i):
        """Rows `[i*bq, (i+1)*bq)` of `x` of shape `(..., Tp, w)`."""
        n = len(x.shape)
        return ops.slice(x, [0] * (n - 2) + [i * self.bq, 0],
                         list(self.lead) + [self.bq, x.shape[-1]])

    def cols(self, x, j):
        """Rows `[j*bk, (j+1)*bk)` of `x` of shape `(..., Sp, w)`."""
        n = len(x.shape)
        return ops.slice(x, [0] * (n - 2) + [j * self.bk, 0],
                         list(self.lead) + [self.bk, x.shape[-1]])

    def tile(self, x, i, j):
        """Block `(i, j)` of a mask or bias `(..., Tp|1, Sp|1)`."""
        n = len(x.shape)
        t_full, s_full = x.shape[-2] != 1, x.shape[-1] != 1
        start = [0] * (n - 2) + [i * self.bq if t_full else 0, j * self.bk if s_full else 0]
        size = list(ops.shape(x)[:-2]) + [self.bq if t_full else 1, self.bk if s_full else 1]
        return ops.slice(x, start, size)

    def allowed(self, mask, i, j):
        """Bool `(..., bq|1, bk|1)` of the keys query block `i` may see in key block `j`."""
        allowed = None
        positional = self.positional
        if positional or self.Sp != self.S:
            cols = j * self.bk + ops.arange(self.bk, dtype="int32")[None, :]  # (1, bk)
            positions = None
            if positional:
                rows = i * self.bq + ops.arange(self.bq, dtype="int32")[:, None]  # (bq, 1)
                positions = self._position(rows) + self.offset  # absolute query positions
            allowed = may_attend(positions, cols, self.is_causal, self.sliding_window,
                                 key_end=self.S if self.Sp != self.S else None,  # padded keys
                                 attention_chunk_size=self.chunk)
        if mask is not None:
            allowed = and_masks(allowed, ops.greater(self.tile(mask, i, j), 0))
        return allowed

    def logits(self, q_i, k_j, bias, mask, i, j, *, transposed=False):
        """`(s, allowed, d_cap)`: logits of block `(i, j)`, the mask, and d s / d raw.

        With a soft-cap c, `s = c * tanh(raw / c) + bias`; `d_cap` is
        `1 - tanh(raw / c)**2` (None without a cap), what the backward pass
        multiplies by to go from the capped logits back to `q k^T`.
        `transposed`: all three as `(..., bk, bq)`, computed as `k q^T`, for
        the key pass, whose products take the block transposed (`p^T do`,
        `ds^T q`): transposing a `(4, 512, 512)` block cost as much as a
        block matmul in JAX's CPU loop (21-25% of a train step at T=4096).
        """
        if transposed:
            s = ops.matmul(k_j, ops.swapaxes(q_i, -1, -2)) * self.scale  # (..., bk, bq)
        else:
            s = ops.matmul(q_i, ops.swapaxes(k_j, -1, -2)) * self.scale  # (..., bq, bk)
        s, d_cap = transform_logits(s, self.spec)
        flip = (lambda x: ops.swapaxes(x, -1, -2)) if transposed else (lambda x: x)
        if bias is not None:
            s = s + flip(self.tile(bias, i, j))
        allowed = self.allowed(mask, i, j)
        return s, None if allowed is None else flip(allowed), d_cap


def _map(f, xs, like):
    """`ops.map(f, xs)`, one block at a time on every backend.

    `like` has the structure, shapes and dtypes of one `f(x)`. Written as an
    `ops.scan` whose carry is the previous output: on JAX and PyTorch that is
    the same `lax.scan` / Python loop as `ops.map`, but on TensorFlow
    Keras's `scan` is a `tf.while_loop` with `parallel_iterations=1` (and
    wants the outputs shaped like the carry, hence `like`), where `ops.map`
    is a `tf.map_fn` with graph mode's default of 10 iterations in flight.
    In a `tf.function` that ran up to 10 query (or key) blocks at once, each
    with its own inner loop, and MultiHeadAttention's forward+backward at
    T=S=8192 (B=1, H=4) peaked at +1.2 GiB over the baseline instead of
    +0.3 GiB. (`tf.map_fn` also calls `f` once more to find its output
    signature: in eager mode, one more block step per map.)
    """
    def step(previous, x):
        del previous
        y = f(x)
        return y, y

    return ops.scan(step, like, xs)[1]


def _to_blocks(x, lead, count, size):
    """`(..., count * size, w)` -> `(count, ..., size, w)`: the xs of a map over blocks."""
    n = len(x.shape)
    x = ops.reshape(x, list(lead) + [count, size, x.shape[-1]])
    return ops.moveaxis(x, n - 2, 0)


def _from_blocks(x, lead, length):
    """`(count, ..., size, w)` -> `(..., length, w)`, the inverse of `_to_blocks`."""
    x = ops.moveaxis(x, 0, len(x.shape) - 3)
    return ops.reshape(x, list(lead) + [length, x.shape[-1]])


def _q_blocks(x, g):
    return _to_blocks(x, g.lead, g.nq, g.bq)


def _from_q_blocks(x, g):
    return _from_blocks(x, g.lead, g.Tp)


def _k_blocks(x, g):
    return _to_blocks(x, g.lead, g.nk, g.bk)


def _from_k_blocks(x, g):
    return _from_blocks(x, g.lead, g.Sp)
