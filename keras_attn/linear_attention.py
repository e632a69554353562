"""The gated delta rule (Gated DeltaNet; Yang et al., arXiv 2412.06464): linear attention
with a fixed-size state, in two forms (keras.ops only).

Per head, with a state S of shape `(d_k, d_v)`, a query q_t and key k_t `(d_k,)`, a value
v_t `(d_v,)`, a log decay g_t <= 0 and a write strength beta_t in (0, 1):

    S_t = exp(g_t) S_{t-1}                                  (decay)
    S_t = S_t + k_t (beta_t (v_t - S_t^T k_t))^T             (delta rule: correct what S_t
                                                              predicts for k_t toward v_t)
    o_t = S_t^T (q_t / sqrt(d_k))

`recurrent_gated_delta_rule` runs that one token at a time (a `keras.ops.scan` over the
tokens: the decode form); `chunk_gated_delta_rule` runs it on chunks of `chunk_size`
tokens (the prompt form, as transformers' `torch_chunk_gated_delta_rule` and the FLA
library): within a chunk the delta-rule updates are folded into one triangular solve
(the WY / UT transform), and only the chunks are scanned, so the loop is over T / C steps
and the rest is matrix products. The names, arguments and layout follow transformers 5.24
(`transformers.models.qwen3_5.modeling_qwen3_5`). Dimension letters: B batch, T length,
H_k query/key heads, H value heads (a multiple of H_k: each query/key head serves
H / H_k consecutive value heads), d_k and d_v the widths, C the chunk size.
"""

from keras import ops

from keras_attn._observe import record_path
from keras_attn._shapes import static_shape
from keras_attn._validation import check_positive_int, dtype_of

__all__ = ["chunk_gated_delta_rule", "l2norm", "recurrent_gated_delta_rule"]


def l2norm(x, axis=-1, eps=1e-6):
    """`x / sqrt(sum(x^2) + eps)` along `axis` (transformers' and FLA's `l2norm`)."""
    return x * ops.rsqrt(ops.sum(x * x, axis=axis, keepdims=True) + eps)


def _prepare(query, key, value, g, beta, initial_state, *, use_qk_l2norm_in_kernel, scale):
    """Checks, then everything as `(B, H, T, ...)` in the compute dtype (float32, or
    float64 for float64 inputs), q and k repeated to the value heads, q scaled."""
    qs, ks, vs = static_shape(query), static_shape(key), static_shape(value)
    for name, shape in (("query", qs), ("key", ks), ("value", vs)):
        if len(shape) != 4:
            raise ValueError(f"`{name}` must have rank 4 (B, T, heads, width). Received: "
                             f"{name}.shape={shape}")
    if qs != ks:
        raise ValueError(f"`query` and `key` must have the same shape (B, T, H_k, d_k). "
                         f"Received: query.shape={qs}, key.shape={ks}")
    heads, key_heads = vs[2], ks[2]
    if heads is not None and key_heads is not None and heads % key_heads:
        raise ValueError("The value heads must be a multiple of the query/key heads. Received: "
                         f"key.shape={ks}, value.shape={vs}")
    for name, x in (("g", g), ("beta", beta)):
        if static_shape(x) != vs[:3]:
            raise ValueError(f"`{name}` must have shape (B, T, H) = {vs[:3]}. Received: "
                             f"{name}.shape={static_shape(x)}")
    state_shape = (vs[0], heads, ks[3], vs[3])
    if initial_state is not None and static_shape(initial_state) != state_shape:
        raise ValueError(f"`initial_state` must have shape (B, H, d_k, d_v) = {state_shape}. "
                         f"Received: initial_state.shape={static_shape(initial_state)}")
    dtype = "float64" if dtype_of(value) == "float64" else "float32"
    if heads != key_heads:
        query = ops.repeat(query, heads // key_heads, axis=2)
        key = ops.repeat(key, heads // key_heads, axis=2)
    query, key, value, g, beta = (
        ops.moveaxis(ops.cast(x, dtype), 1, 2) for x in (query, key, value, g, beta))
    if use_qk_l2norm_in_kernel:
        query, key = l2norm(query), l2norm(key)
    query = query * (ks[3] ** -0.5 if scale is None else scale)
    state = (ops.zeros(state_shape, dtype) if initial_state is None
             else ops.cast(initial_state, dtype))
    return query, key, value, g, beta, state


def recurrent_gated_delta_rule(query, key, value, g, beta, initial_state=None, *,
                               use_qk_l2norm_in_kernel=False, scale=None):
    """The gated delta rule one token at a time (the decode form).

    Args:
        query: `(B, T, H_k, d_k)`.
        key: `(B, T, H_k, d_k)`.
        value: `(B, T, H, d_v)`, H a multiple of H_k.
        g: `(B, T, H)`, the log decay (<= 0): the state is multiplied by `exp(g)` per step.
        beta: `(B, T, H)`, the write strength of each token.
        initial_state: optional `(B, H, d_k, d_v)`, the state before the first token
            (zeros when None).
        use_qk_l2norm_in_kernel: L2-normalise q and k first (transformers' argument).
        scale: the query scale; None is `d_k ** -0.5`.

    Returns:
        `(output (B, T, H, d_v), final_state (B, H, d_k, d_v))`; the output in the value's
        dtype, the state in the compute dtype (float32, or float64 for float64 inputs).
    """
    record_path("recurrent")
    out_dtype = dtype_of(value)
    q, k, v, g, beta, state = _prepare(query, key, value, g, beta, initial_state,
                                       use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                                       scale=scale)

    def step(s, xs):
        k_t, v_t, g_t, b_t = xs  # (B, H, d) and (B, H)
        s = s * ops.exp(g_t)[..., None, None]
        predicted = ops.einsum("bhkv,bhk->bhv", s, k_t)
        delta = (v_t - predicted) * b_t[..., None]
        s = s + ops.einsum("bhk,bhv->bhkv", k_t, delta)
        return s, s

    q, *xs = (ops.moveaxis(x, 2, 0) for x in (q, k, v, g, beta))  # the tokens lead
    if static_shape(value)[1] == 1:  # one decode step: no loop to build
        state, states = step(state, tuple(x[0] for x in xs))
        states = states[None]
    else:
        # The scan's per-step outputs are the states (Keras's TensorFlow scan wants them
        # shaped like the carry); the readout is one product outside the loop.
        state, states = ops.scan(step, state, tuple(xs))
    out = ops.einsum("tbhkv,tbhk->tbhv", states, q)
    return ops.cast(ops.moveaxis(out, 0, 1), out_dtype), state


def _chunk(x, num_chunks, chunk_size):
    """`(B, H, T_pad, ...)` -> `(N, B, H, C, ...)`: the chunks lead, for the scan."""
    shape = static_shape(x)
    x = ops.reshape(x, (-1, shape[1], num_chunks, chunk_size, *shape[3:]))  # B may be symbolic
    return ops.moveaxis(x, 2, 0)


def chunk_gated_delta_rule(query, key, value, g, beta, initial_state=None, *, chunk_size=64,
                           use_qk_l2norm_in_kernel=False, scale=None):
    """The gated delta rule on chunks of `chunk_size` tokens (the prompt form).

    The same numbers as `recurrent_gated_delta_rule` (the same arguments and returns),
    computed as transformers' `torch_chunk_gated_delta_rule` does: the length is padded
    with zeros to a multiple of `chunk_size` (a padded token has k = v = 0, beta = 0,
    g = 0, so it neither writes nor decays the state); within a chunk, with Gamma the
    cumulative decays, the delta-rule corrections are `U = (I + L)^{-1} (beta V)` and
    `W = (I + L)^{-1} (beta Gamma K)` with L the strictly lower part of
    `(beta K K^T) * decay(i, j)` (a unit lower-triangular solve); a `keras.ops.scan`
    over the chunks carries the state. No loop over tokens: one trace per shape.

    The other arguments are `recurrent_gated_delta_rule`'s.

    Args:
        chunk_size: C, a positive int (64 as transformers and FLA).

    Returns:
        `(output (B, T, H, d_v), final_state (B, H, d_k, d_v))`.
    """
    chunk_size = check_positive_int("chunk_size", chunk_size)
    record_path("chunked")
    out_dtype = dtype_of(value)
    q, k, v, g, beta, state = _prepare(query, key, value, g, beta, initial_state,
                                       use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                                       scale=scale)
    length = static_shape(v)[2]
    if length is None:
        raise ValueError("`chunk_gated_delta_rule` needs a static length T to pad it to "
                         f"chunks. Received: value.shape={static_shape(value)}")
    pad = (chunk_size - length % chunk_size) % chunk_size
    if pad:
        q, k, v = (ops.pad(x, ((0, 0), (0, 0), (0, pad), (0, 0))) for x in (q, k, v))
        g, beta = (ops.pad(x, ((0, 0), (0, 0), (0, pad))) for x in (g, beta))
    num_chunks = (length + pad) // chunk_size
    q, k, v = (_chunk(x, num_chunks, chunk_size) for x in (q, k, v))  # (N, B, H, C, d)
    g, beta = (_chunk(x, num_chunks, chunk_size) for x in (g, beta))  # (N, B, H, C)

    k_beta, v_beta = k * beta[..., None], v * beta[..., None]
    cum = ops.cumsum(g, axis=-1)  # log of the decay from the chunk's start to each token
    rows = ops.arange(chunk_size)
    lower = rows[:, None] >= rows[None, :]  # i >= j: token j is seen by token i
    strict = rows[:, None] > rows[None, :]
    # exp(cum_i - cum_j) for i >= j; the upper entries are zeroed before the exp (they
    # would be exp of a positive number: overflow, and NaN gradients through a mask).
    pairwise = ops.where(lower, cum[..., :, None] - cum[..., None, :], 0.0)
    pairwise = ops.where(lower, ops.exp(pairwise), 0.0)
    eye = ops.eye(chunk_size, dtype=q.dtype)
    system = eye + ops.where(strict, ops.matmul(k_beta, ops.swapaxes(k, -1, -2)) * pairwise, 0.0)
    u = ops.solve_triangular(system, v_beta, lower=True)
    w = ops.solve_triangular(system, k_beta * ops.exp(cum)[..., None], lower=True)
    intra = ops.matmul(q, ops.swapaxes(k, -1, -2)) * pairwise  # attention within a chunk
    q_decayed = q * ops.exp(cum)[..., None]
    k_decayed = k * ops.exp(cum[..., -1:] - cum)[..., None]  # decay to the chunk's end
    chunk_decay = ops.exp(cum[..., -1])[..., None, None]

    def step(s, xs):
        u_i, w_i, k_i, d_i = xs
        v_new = u_i - ops.matmul(w_i, s)  # the part the old state does not predict
        return s * d_i + ops.matmul(ops.swapaxes(k_i, -1, -2), v_new), s

    # The scan carries the state and yields the state before each chunk (as FLA's chunk
    # kernel keeps `h` per chunk; Keras's TensorFlow scan wants outputs shaped like the
    # carry); each chunk's output is then a batched product over the chunks.
    state, before = ops.scan(step, state, (u, w, k_decayed, chunk_decay))
    v_new = u - ops.matmul(w, before)
    out = ops.matmul(q_decayed, before) + ops.matmul(intra, v_new)
    out = ops.moveaxis(out, 0, 2)  # (B, H, N, C, d_v)
    shape = static_shape(out)
    out = ops.reshape(out, (-1, shape[1], num_chunks * chunk_size, shape[4]))
    out = out[:, :, :length]
    return ops.cast(ops.moveaxis(out, 1, 2), out_dtype), state
