"""Independent float64 NumPy reference for every keras_attn layer.

Written from "Attention Is All You Need" (Vaswani et al., 2017), Eq. 1 and 2
and Section 3, and from the mask conventions of keras_attn (docs/guides/masks.md). It
imports NumPy and the standard library only, never `keras` or `keras_attn`
(beyond this folder: RoPE is in `rope_reference`), so that comparing a layer
against it compares two independent derivations.

Shapes: B batch, H heads, T query length, S key length, d_k key/query width
per head, d_v value width per head. Masks are boolean, True = may attend.

Weights are plain dicts of arrays, with the same layout as the Keras layers:
a dense layer is `{"kernel": (in, out), "bias": (out,) or None}` and computes
`x @ kernel + bias`.
"""

import math

import numpy as np

from keras_attn.testing.rope_reference import rope_inverse_frequencies, rotary_embedding

__all__ = [
    "activation",
    "causal_mask",
    "chunked_mask",
    "decoder_layer",
    "dense",
    "encoder_layer",
    "feed_forward",
    "layer_norm",
    "multi_head_attention",
    "multi_head_latent_attention",
    "numerical_gradient",
    "rms_norm",
    "rope_inverse_frequencies",
    "rotary_embedding",
    "scaled_dot_product_attention",
    "sliding_window_mask",
]

_erf = np.vectorize(math.erf, otypes=[np.float64])


def activation(name, x):
    """relu, gelu (exact, erf form), tanh, silu or linear, in float64."""
    x = np.asarray(x, np.float64)
    if name == "relu":
        return np.maximum(x, 0.0)
    if name == "gelu":
        return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))
    if name == "tanh":
        return np.tanh(x)
    if name == "silu":
        return x / (1.0 + np.exp(-x))
    if name in (None, "linear"):
        return x
    raise ValueError(f"reference has no activation {name!r}")


def numerical_gradient(f, x, step=1e-6):
    """d f / d x by central differences, for a scalar float64 function `f`.

    The error is O(step**2) times f's third derivative: far below every
    float32 tolerance at the default step on the reference's smooth maths.
    """
    x = np.asarray(x, np.float64)
    grad = np.zeros_like(x)
    for index in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[index] += step
        down[index] -= step
        grad[index] = (f(up) - f(down)) / (2 * step)
    return grad


def causal_mask(query_length, key_length):
    """(T, S) bool: query i may attend key j iff j <= i + (S - T)."""
    i = np.arange(query_length)[:, None]
    j = np.arange(key_length)[None, :]
    return j <= i + (key_length - query_length)


def sliding_window_mask(query_length, key_length, window, is_causal=True):
    """(T, S) bool: the keys inside a window of W around each query.

    Query i sits at absolute position p = i + (S - T). Causal: key j is in
    the window iff 0 <= p - j < W (W keys, the query's own included);
    non-causal: iff |p - j| < W.
    """
    p = np.arange(query_length)[:, None] + (key_length - query_length)
    j = np.arange(key_length)[None, :]
    if is_causal:
        return (p - j >= 0) & (p - j < window)
    return np.abs(p - j) < window


def chunked_mask(query_length, key_length, chunk_size):
    """(T, S) bool: the keys in the query's chunk (Llama 4's `attention_chunk_size` C).

    Query i sits at absolute position p = i + (S - T); key j is in its chunk iff
    floor(j / C) == floor(p / C) (Python's floor division: a negative p, a query
    before the keys, shares no chunk with any key).
    """
    p = np.arange(query_length)[:, None] + (key_length - query_length)
    j = np.arange(key_length)[None, :]
    return (p // chunk_size) == (j // chunk_size)


def scaled_dot_product_attention(
    q, k, v, mask=None, bias=None, is_causal=False, scale=None, sliding_window=None,
    logit_soft_cap=None, sinks=None, attention_chunk_size=None,
):
    """softmax(cap(q k^T * scale) + bias) v over the allowed keys.

    q `(..., H, T, d_k)`, k `(..., H_kv, S, d_k)`, v `(..., H_kv, S, d_v)`
    (H_kv = H without grouped heads; otherwise query head n uses key/value
    head n // (H / H_kv)). `cap(x) = c * tanh(x / c)` with
    c = `logit_soft_cap`, applied before the bias and masks. Returns the
    output `(..., T, d_v)` and the weights `(..., T, S)`. A query with no
    allowed key has all-zero weights and a zero output row. `sinks` `(H,)`:
    head h's logit joins each of its rows' denominators, attending nothing:
    weight_j = exp(s_j) / (exp(sink_h) + sum over allowed k of exp(s_k)).
    `attention_chunk_size` C: only the keys of the query's chunk (`chunked_mask`).
    """
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    if k.ndim >= 3 and q.ndim == k.ndim and k.shape[-3] != q.shape[-3] and k.shape[-3] != 1:
        group = q.shape[-3] // k.shape[-3]
        k, v = np.repeat(k, group, axis=-3), np.repeat(v, group, axis=-3)
    T, S = q.shape[-2], k.shape[-2]
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    logits = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
    if logit_soft_cap is not None:
        logits = logit_soft_cap * np.tanh(logits / logit_soft_cap)
    if bias is not None:
        logits = logits + np.asarray(bias, np.float64)
    allowed = np.ones(logits.shape, bool)
    if mask is not None:
        allowed = allowed & np.asarray(mask, bool)
    if is_causal:
        allowed = allowed & causal_mask(T, S)
    if sliding_window is not None:
        allowed = allowed & sliding_window_mask(T, S, sliding_window, is_causal)
    if attention_chunk_size is not None:
        allowed = allowed & chunked_mask(T, S, attention_chunk_size)
    allowed = allowed & np.isfinite(logits)  # a -inf bias also forbids a key
    weights = np.zeros(logits.shape)
    for index in np.ndindex(logits.shape[:-1]):
        row, keep = logits[index], allowed[index]
        if sinks is not None:  # index = (..., h, t): the head is the second to last
            sink = float(np.asarray(sinks, np.float64)[index[-2]])
            top = max(row[keep].max(), sink) if keep.any() else sink
            e = np.exp(row[keep] - top)
            weights[index][keep] = e / (e.sum() + np.exp(sink - top))
        elif keep.any():
            e = np.exp(row[keep] - row[keep].max())
            weights[index][keep] = e / e.sum()
    return np.matmul(weights, v), weights


def rms_norm(x, params, epsilon):
    """x / sqrt(mean(x^2) + eps) * scale, over the last axis."""
    x = np.asarray(x, np.float64)
    return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + epsilon) * params["scale"]


def dense(x, params):
    y = np.asarray(x, np.float64) @ np.asarray(params["kernel"], np.float64)
    if params.get("bias") is not None:
        y = y + np.asarray(params["bias"], np.float64)
    return y


def layer_norm(x, params, epsilon):
    """Normalise over the last axis, then scale by gamma and shift by beta."""
    x = np.asarray(x, np.float64)
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    y = (x - mean) / np.sqrt(var + epsilon)
    return y * params["gamma"] + params["beta"]


def _split_heads(x, num_heads):
    B, L, width = x.shape
    return x.reshape(B, L, num_heads, width // num_heads).transpose(0, 2, 1, 3)


def _head_norm(x, params, kind, epsilon):
    """Normalise over the last axis (qk-norm): each head's d of `(B, H, L, d)`, or the
    whole width of a projection `(B, L, H * d)` (`qk_norm_full_width`)."""
    if kind == "rms":
        return rms_norm(x, params, epsilon)
    return layer_norm(x, params, epsilon)


def multi_head_attention(
    params, query, key=None, value=None, num_heads=1, mask=None,
    is_causal=False, num_key_value_heads=None, rope_max_wavelength=None,
    rope_scaling_factor=1.0, rope_interleaved=False, sliding_window=None,
    logit_soft_cap=None, qk_norm=None, qk_norm_epsilon=1e-6, scale=None, rope_type="default",
    use_sinks=False, query_scale_beta=None, query_scale_length=None, attention_chunk_size=None,
    qk_norm_full_width=False, attention_bias=None, attention_k_eq_v=False, use_value_norm=False,
    query_scale_offset=0, **rope_parameters,
):
    """Multi-head attention, paper Section 3.2.2, with today's options.

    `rope_parameters` are the other `rope_<name>` options (`rope_beta_fast`,
    ...): `rope_inverse_frequencies`'s `<name>`.

    params: dicts `query`, `key`, `value`, `output` (dense layers), and
    `query_norm`, `key_norm` with `qk_norm` ("rms", "layer"; "l2" has none and
    divides each head by its root mean square after RoPE, Llama 4's order), `gate` (on the query input) for
    a gated output, `sinks` `(H,)` with `use_sinks` (attention sinks). Head h owns columns
    `[h * d, (h + 1) * d)` of the projections; with H_kv =
    `num_key_value_heads` < H, query head n uses key/value head
    n // (H / H_kv). qk-norm, then RoPE, apply to each head's queries and
    keys; positions are absolute, query i at `i + (S - T)`, key j at j.
    With `query_scale_beta` b and `query_scale_length` n, the queries at
    position p are then multiplied by `1 + b ln(1 + floor((p + o) / n))`, o
    `query_scale_offset` (1: Llama 4's temperature tuning)
    (Llama 4 / Ministral 3 attention scaling, transformers'
    `get_llama_4_attn_scale`), before the logits. `attention_chunk_size` C:
    chunked attention (`chunked_mask`, Llama 4). `qk_norm_full_width`: the qk-norm
    normalises all H * d query and H_kv * d key features of the projections, before
    they are split into heads (OLMo 2), instead of each head's d.
    `attention_bias` (additive, broadcast to `(B, H, T, S)`) is added to the
    logits after the scale and the soft-cap (`scaled_dot_product_attention`'s
    `bias`). `mask` broadcasts to `(B, T, S)` or `(B, H, T, S)`. Returns
    `attention_k_eq_v` (Gemma 4's full layers): no `value` params, the values are
    the key projection of `key` before qk-norm and RoPE. `use_value_norm`: each
    head's values divided by `sqrt(mean_d(v^2) + qk_norm_epsilon)` (no scale).
    `mask` broadcasts to `(B, T, S)` or `(B, H, T, S)`. Returns
    `(B, T, out)` and the weights `(B, H, T, S)`.
    """
    unknown = [n for n in rope_parameters if not n.startswith("rope_")]
    if unknown:
        raise TypeError(f"reference.multi_head_attention got unknown arguments {unknown}")
    key = value if key is None else key
    key = query if key is None else key
    value = key if value is None else value
    kv_heads = num_key_value_heads or num_heads
    q, k = dense(query, params["query"]), dense(key, params["key"])  # (B, L, heads * d_k)
    k_projected = _split_heads(k, kv_heads)  # (B, H_kv, S, d_k), before any norm
    if qk_norm is not None and qk_norm_full_width:
        q = _head_norm(q, params["query_norm"], qk_norm, qk_norm_epsilon)
        k = _head_norm(k, params["key_norm"], qk_norm, qk_norm_epsilon)
    q = _split_heads(q, num_heads)  # (B, H, T, d_k)
    k = _split_heads(k, kv_heads)  # (B, H_kv, S, d_k)
    if attention_k_eq_v:
        v = k_projected  # the key projection's heads, before the key norm and RoPE
    else:
        v = _split_heads(dense(value, params["value"]), kv_heads)  # (B, H_kv, S, d_v)
    if use_value_norm:
        v = v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + qk_norm_epsilon)
    if qk_norm not in (None, "l2") and not qk_norm_full_width:
        q = _head_norm(q, params["query_norm"], qk_norm, qk_norm_epsilon)
        k = _head_norm(k, params["key_norm"], qk_norm, qk_norm_epsilon)
    if rope_max_wavelength is not None:
        T, S = q.shape[2], k.shape[2]
        rope = dict(max_wavelength=rope_max_wavelength, scaling_factor=rope_scaling_factor,
                    interleaved=rope_interleaved, rope_type=rope_type,
                    **{n[len("rope_"):]: v for n, v in rope_parameters.items()})
        q = rotary_embedding(q, np.arange(T) + (S - T), **rope)
        k = rotary_embedding(k, np.arange(S), **rope)
    if qk_norm == "l2":  # Llama 4's order: after RoPE (Llama4TextL2Norm, no weights)
        q = q / np.sqrt(np.mean(q * q, axis=-1, keepdims=True) + qk_norm_epsilon)
        k = k / np.sqrt(np.mean(k * k, axis=-1, keepdims=True) + qk_norm_epsilon)
    if query_scale_beta is not None:
        p = np.arange(q.shape[2]) + (k.shape[2] - q.shape[2])  # absolute query positions
        p = p + query_scale_offset
        factor = 1.0 + query_scale_beta * np.log(1.0 + np.floor(p / query_scale_length))
        q = q * factor[:, None]  # (T, 1) over (B, H, T, d_k)
    if mask is not None:
        mask = np.asarray(mask, bool)
        if mask.ndim == 3:
            mask = mask[:, None]  # (B, 1, T, S)
    out, weights = scaled_dot_product_attention(
        q, k, v, mask=mask, is_causal=is_causal, scale=scale, sliding_window=sliding_window,
        logit_soft_cap=logit_soft_cap, sinks=params["sinks"] if use_sinks else None,
        attention_chunk_size=attention_chunk_size, bias=attention_bias,
    )
    B, H, T, d_v = out.shape
    out = out.transpose(0, 2, 1, 3).reshape(B, T, H * d_v)  # (B, T, H * d_v)
    if "gate" in params:  # Keras's `use_gate`: sigmoid(query W_g + b_g) per head feature
        out = out / (1.0 + np.exp(-dense(query, params["gate"])))
    return dense(out, params["output"]), weights


def feed_forward(params, x, activation_name="relu"):
    """Paper Eq. 2: W2 act(W1 x + b1) + b2 (no activation after W2).

    With a `gate` entry, the gated form W_down(act(W_gate x) * W_up x).
    """
    if "gate" in params:
        hidden = activation(activation_name, dense(x, params["gate"])) * dense(
            x, params["intermediate"])
    else:
        hidden = activation(activation_name, dense(x, params["intermediate"]))
    return dense(hidden, params["output"])


def _attention_mask(padding_mask, attention_mask, query_length):
    """Combine a key padding mask `(B, S)` and a mask `(B, T, S)`."""
    mask = None
    if padding_mask is not None:
        mask = np.asarray(padding_mask, bool)[:, None, :]  # (B, 1, S)
        mask = np.broadcast_to(mask, (mask.shape[0], query_length, mask.shape[2]))
    if attention_mask is not None:
        attention_mask = np.asarray(attention_mask, bool)
        mask = attention_mask if mask is None else mask & attention_mask
    return mask


def _norm(x, params, epsilon):
    """LayerNorm (`gamma`, `beta`) or RMSNorm (`scale`), by the parameters given."""
    if "scale" in params:
        return rms_norm(x, params, epsilon)
    return layer_norm(x, params, epsilon)


def _sublayer(x, fn, norm_params, epsilon, normalize_first, post_params=None,
              residual_scale=None):
    """Residual around `fn`, post-norm (paper) or pre-norm; with `post_params`
    `fn`'s output is normalised too before the sum (sandwich norms); with
    `residual_scale` s the branch is `s * fn(.)` (Granite's residual multiplier)."""
    if post_params is not None:
        inner = fn
        fn = lambda h: _norm(inner(h), post_params, epsilon)  # noqa: E731
    s = 1.0 if residual_scale is None else float(residual_scale)
    if norm_params is None:  # no input norm (`use_input_norm=False`): x + s * post(fn(x))
        return x + s * fn(x)
    if normalize_first:
        return x + s * fn(_norm(x, norm_params, epsilon))
    return _norm(x + s * fn(x), norm_params, epsilon)


def encoder_layer(
    params, x, num_heads, padding_mask=None, attention_mask=None,
    is_causal=False, normalize_first=False, epsilon=1e-5,
    activation_name="relu", attention_options=None, residual_scale=None,
):
    """Encoder layer: self-attention then FFN, each residual + norm.

    params: `self_attention`, `self_attention_norm`, `feed_forward`,
    `feed_forward_norm` (a norm is LayerNorm `gamma`/`beta` or RMSNorm
    `scale`; a gated FFN has a `gate`). `attention_options` go to the
    self-attention (`num_key_value_heads`, RoPE, `sliding_window`, ...).
    Dropout is off (inference).
    """
    # The same sublayers as a decoder layer without memory (no cross-attention).
    return decoder_layer(
        params, x, num_heads, padding_mask=padding_mask, attention_mask=attention_mask,
        is_causal=is_causal, normalize_first=normalize_first, epsilon=epsilon,
        activation_name=activation_name, attention_options=attention_options,
        residual_scale=residual_scale)


def decoder_layer(
    params, x, num_heads, memory=None, padding_mask=None,
    memory_padding_mask=None, attention_mask=None, memory_attention_mask=None,
    is_causal=True, normalize_first=False, epsilon=1e-5,
    activation_name="relu", attention_options=None, residual_scale=None,
    parallel_residual=False,
):
    """Decoder layer: causal self-attention, cross-attention, FFN.

    params as for the encoder, plus `cross_attention` and
    `cross_attention_norm` when `memory` is given, and the sandwich norms
    `post_attention_norm`, `post_cross_attention_norm`,
    `post_feed_forward_norm` when present; without `self_attention_norm`,
    `cross_attention_norm`, `feed_forward_norm` (a block with
    `use_input_norm=False`) a sublayer is `x + post(f(x))`. `attention_options` go to
    the self-attention only; cross-attention stays plain multi-head.
    `residual_scale` s multiplies every residual branch. With `parallel_residual`
    (pre-norm, no memory) the block is `x + s attn(N(x)) + s ffn(N(x))`, N the
    `self_attention_norm` (Cohere 2, GPT-J, Phi-2).
    """
    x = np.asarray(x, np.float64)
    T = x.shape[1]
    self_mask = _attention_mask(padding_mask, attention_mask, T)

    def attend(h):
        return multi_head_attention(
            params["self_attention"], h, num_heads=num_heads, mask=self_mask,
            is_causal=is_causal, **(attention_options or {}),
        )[0]

    if parallel_residual:
        s = 1.0 if residual_scale is None else float(residual_scale)
        ffn = lambda h: feed_forward(params["feed_forward"], h, activation_name)  # noqa: E731
        branches = []
        for fn, post in ((attend, "post_attention_norm"), (ffn, "post_feed_forward_norm")):
            y = fn(_norm(x, params["self_attention_norm"], epsilon))
            if params.get(post) is not None:
                y = _norm(y, params[post], epsilon)
            branches.append(s * y)
        return x + branches[0] + branches[1]

    x = _sublayer(x, attend, params.get("self_attention_norm"), epsilon,
                  normalize_first, params.get("post_attention_norm"), residual_scale)
    if memory is not None:
        memory = np.asarray(memory, np.float64)
        cross_mask = _attention_mask(memory_padding_mask, memory_attention_mask, T)

        def cross(h):
            return multi_head_attention(
                params["cross_attention"], h, memory, memory,
                num_heads=num_heads, mask=cross_mask,
            )[0]

        x = _sublayer(x, cross, params.get("cross_attention_norm"), epsilon,
                      normalize_first, params.get("post_cross_attention_norm"), residual_scale)
    ffn = lambda h: feed_forward(params["feed_forward"], h, activation_name)  # noqa: E731
    return _sublayer(x, ffn, params.get("feed_forward_norm"), epsilon,
                     normalize_first, params.get("post_feed_forward_norm"), residual_scale)


def multi_head_latent_attention(
    params, query, num_heads, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim,
    q_lora_rank=None, mask=None, is_causal=False, layer_norm_epsilon=1e-6,
    rope_max_wavelength=10000.0, rope_scaling_factor=1.0, rope_interleaved=True, scale=None,
    rope_type="default", **rope_parameters,
):
    """Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434, Section 2.1), written
    from the paper's Eq. 9-19 in its expanded form: every head's keys and values
    decompressed from the latent.

    params: dense layers `query` (no low-rank query) or `query_a`, `query_b` with the RMS
    norm `query_a_norm`; `key_value_a`, `key_value_b`, `output`, and the RMS norm
    `key_value_a_norm`. With d_qk = nope + rope: the query of head h is columns
    `[h d_qk, (h + 1) d_qk)` of the query projection, its first `qk_nope_head_dim`
    unrotated; `key_value_a` gives `[c, k_rope]` (c `kv_lora_rank` wide, normalised),
    `key_value_b` of c gives head h's `[k_nope, v]` in columns
    `[h (nope + v), (h + 1) (nope + v))`; the key of head h is `[k_nope_h,
    RoPE(k_rope)]`, the RoPE key shared by the heads. Self-attention: positions
    `0 .. T - 1`. `q_lora_rank` None: the plain `query` projection (else its width).
    `scale` None: `1 / sqrt(d_qk)`. Other `rope_<name>` options go to
    `rope_inverse_frequencies`. Returns `(B, T, out)` and the weights `(B, H, T, T)`.
    """
    unknown = [n for n in rope_parameters if not n.startswith("rope_")]
    if unknown:
        raise TypeError(f"reference.multi_head_latent_attention got unknown arguments {unknown}")
    x = np.asarray(query, np.float64)
    B, T, _ = x.shape
    H, nope, rope_dim, r = num_heads, qk_nope_head_dim, qk_rope_head_dim, kv_lora_rank
    if ("query" in params) != (q_lora_rank is None):
        raise ValueError(f"q_lora_rank={q_lora_rank} disagrees with the params {sorted(params)}")
    if q_lora_rank is None:
        q = dense(x, params["query"])
    else:
        q = dense(rms_norm(dense(x, params["query_a"]), params["query_a_norm"],
                           layer_norm_epsilon), params["query_b"])
    q = _split_heads(q, H)  # (B, H, T, d_qk)
    compressed = dense(x, params["key_value_a"])  # (B, T, r + rope)
    c = rms_norm(compressed[..., :r], params["key_value_a_norm"], layer_norm_epsilon)
    k_rope = compressed[..., r:][:, None]  # (B, 1, T, rope)
    kv = _split_heads(dense(c, params["key_value_b"]), H)  # (B, H, T, nope + v)
    k_nope, v = kv[..., :nope], kv[..., nope:]
    q_nope, q_rope = q[..., :nope], q[..., nope:]
    if rope_max_wavelength is not None:
        rope = dict(max_wavelength=rope_max_wavelength, scaling_factor=rope_scaling_factor,
                    interleaved=rope_interleaved, rope_type=rope_type,
                    **{n[len("rope_"):]: value for n, value in rope_parameters.items()})
        q_rope = rotary_embedding(q_rope, np.arange(T), **rope)
        k_rope = rotary_embedding(k_rope, np.arange(T), **rope)
    q = np.concatenate([q_nope, q_rope], axis=-1)
    k = np.concatenate([k_nope, np.broadcast_to(k_rope, (B, H, T, rope_dim))], axis=-1)
    if scale is None:
        scale = 1.0 / math.sqrt(nope + rope_dim)
    if mask is not None:
        mask = np.asarray(mask, bool)
        if mask.ndim == 3:
            mask = mask[:, None]  # (B, 1, T, S)
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask, is_causal=is_causal,
                                                scale=scale)
    out = out.transpose(0, 2, 1, 3).reshape(B, T, H * v_head_dim)
    return dense(out, params["output"]), weights
