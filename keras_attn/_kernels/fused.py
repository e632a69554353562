"""The fused path: `keras.ops.dot_product_attention` with keras_attn's mask semantics.

PyTorch's SDPA kernels, cuDNN/flash on GPU. Dimension letters: B batch, H
query heads, H_kv key/value heads, T query length, S key length, d_k and d_v
head widths. Masks are bool, True = may attend; `bias` is additive.
"""

import functools
import math

import keras
from keras import ops

from keras_attn import _hooks
from keras_attn._float64 import dot_product_attention
from keras_attn._kernels.common import zero_unattended_keys
from keras_attn._masks import combine_masks, positional_mask
from keras_attn._observe import record_path
from keras_attn._shapes import static_shape, to_rank

__all__ = ["fused_attention", "fused_attention_bthd"]


def _large_negative(dtype):
    """A finite stand-in for -inf that still underflows exp() in float32 softmax."""
    return -0.7 * (65504.0 if keras.backend.standardize_dtype(dtype) == "float16" else 3.4e38)


@functools.cache
def _jax_on_gpu():
    try:
        return keras.distribution.list_devices()[0].startswith(("gpu", "cuda"))
    except Exception:  # no device list: be safe
        return False


def _kernel_keeps_half_precision(x):
    """Whether `ops.dot_product_attention` may take float16/bfloat16 `x` as it is.

    The GPU kernels (PyTorch's flash and memory-efficient SDPA, cuDNN under
    JAX) accumulate the logits and the softmax in float32. On the CPU,
    PyTorch's SDPA gives wrong rows once half-precision logits pass 65504
    (measured: float16 logits of ~1e5), TensorFlow's and NumPy's kernels
    (Keras's own math) compute the softmax in the input dtype (NaN), and
    JAX's XLA kernel asks for a float16 x float16 -> float32 dot that the CPU
    compiler rejects under `jit`. Those get float32 inputs instead.
    """
    backend = keras.backend.backend()
    if backend == "torch":
        return "cuda" in str(getattr(x, "device", ""))
    if backend == "jax":
        return _jax_on_gpu()
    return False


def fused_attention_bthd(query, key, value, mask=None, bias=None, *, is_causal=False,
                         scale=None, sliding_window=None, sinks=None, attention_chunk_size=None,
                         zero_unattended=True):
    """`keras.ops.dot_product_attention` with keras_attn's mask semantics.

    Layout `(B, T, H, d)` (heads after time, as `keras.ops.dot_product_attention`
    wants). `mask`/`bias` broadcast to `(B, H, T, S)`. Causal masking is
    bottom-right aligned: the backend's `is_causal` flag (top-left aligned on
    PyTorch) is used only when `T == S` statically and there is no mask or
    bias; otherwise the causal mask is folded into the mask. Rows with no
    allowed key are re-opened before the kernel (so that it never sees a
    fully masked row, which gives NaN on PyTorch and a uniform row on JAX and
    TensorFlow) and zeroed after it, which keeps values and gradients finite.
    Keys that no query may attend are zeroed (`zero_unattended_keys`; not with
    `zero_unattended=False`, for keys known finite: `KernelSpec.unattended_finite`). A
    `sliding_window` and chunks (`attention_chunk_size`) are folded into the mask.
    Key/value heads fewer than the
    query's (grouped heads) are read in groups where the backend's kernel can
    (`_attend`), repeated to match elsewhere.
    Half precision runs the kernel in float32 unless it is a GPU kernel that
    accumulates in float32 (`_kernel_keeps_half_precision`).
    `sinks` `(H,)`: attention sinks, exactly, as one more key after the others
    whose key and value are zero and whose bias is the head's sink (its logit
    `0 * scale + sink`); every row may attend it, so no row is empty.

    Returns:
        `(B, T, H, d_v)` in the dtype of `value`.
    """
    out_dtype = value.dtype
    if "float16" in keras.backend.standardize_dtype(query.dtype) and not (
            _kernel_keeps_half_precision(query)):
        query, key, value = (ops.cast(x, "float32") for x in (query, key, value))
    d_k, d_v = static_shape(query)[-1], static_shape(value)[-1]
    if keras.backend.backend() == "jax" and d_k != d_v:
        # JAX's kernel (and Keras's fallback) assume d_v == d_k. Zero columns
        # change neither q.k nor the output's first d_v columns.
        width = max(d_k, d_v)
        pad = [[0, 0], [0, 0], [0, 0]]
        query, key = (ops.pad(x, pad + [[0, width - d_k]]) for x in (query, key))
        value = ops.pad(value, pad + [[0, width - d_v]])
        output = fused_attention_bthd(query, key, value, mask, bias, is_causal=is_causal,
                                      scale=scale, sliding_window=sliding_window, sinks=sinks,
                                      attention_chunk_size=attention_chunk_size)
        return ops.cast(output[..., :d_v], out_dtype)
    heads, kv_heads = static_shape(query)[2], static_shape(key)[2]
    group = heads // kv_heads if None not in (heads, kv_heads) else 1
    T, S = static_shape(query)[1], static_shape(key)[1]
    use_flag = (bool(is_causal) and sliding_window is None and attention_chunk_size is None
                and mask is None and bias is None and sinks is None and T is not None and T == S)
    allowed = None if mask is None else to_rank(ops.cast(mask, "bool"), 4)
    if not use_flag:
        allowed = combine_masks(
            allowed, positional_mask(ops.shape(query)[1], ops.shape(key)[1], is_causal,
                                     sliding_window, attention_chunk_size=attention_chunk_size))
    if bias is not None:
        bias = to_rank(ops.cast(bias, query.dtype), 4)
        allowed = combine_masks(allowed, ops.greater(bias, float("-inf")))
    keep = None
    if allowed is not None:
        allowed = to_rank(allowed, 4)
        keep = ops.any(allowed, axis=-1, keepdims=True)  # (B|1, H|1, T|1, 1)
        if zero_unattended:
            key, value = zero_unattended_keys(key, value, allowed, key_axis=1, group=group)
    if sinks is not None:
        key, value, allowed, bias = _with_sink_key(query, key, value, allowed, bias, sinks)
        keep = None  # every row may attend the sink
    if bias is not None:
        bias = ops.where(allowed, bias, _large_negative(query.dtype))
        if keep is not None:
            bias = ops.where(keep, bias, ops.zeros_like(bias))
        output = _attend(query, key, value, group, bias=bias, scale=scale)
    else:
        if keep is not None:
            allowed = ops.logical_or(allowed, ops.logical_not(keep))
        output = _attend(query, key, value, group, mask=allowed, scale=scale,
                         is_causal=use_flag)
    if keep is not None:
        keep = ops.transpose(keep, (0, 2, 1, 3))  # (B|1, T|1, H|1, 1)
        output = output * ops.cast(keep, output.dtype)
    return ops.cast(output, out_dtype)


def _attend(query, key, value, group, **kwargs):
    """`dot_product_attention` of `(B, T, H, d)` queries over `(B, S, H / group, d)` keys and
    values. Grouped heads (`group > 1`) go to the `"grouped_dot_product_attention"` hook
    (`keras_attn._device`: PyTorch's SDPA with `enable_gqa=True`), which reads each
    key/value head for its `group` query heads without copying it; where there is none
    (other backends, an older torch) the keys and values are repeated to H heads. On
    PyTorch the repeat (and the copies Keras makes for SDPA) measured 7.9 ms against
    0.39 ms per layer for a decode step over 8192 cached positions (H=8, H_kv=2, d=64,
    2 CPU threads), 66 against 31 ms for a T=512 causal forward and backward."""
    if group > 1:
        grouped = _hooks.get("grouped_dot_product_attention")
        output = None if grouped is None else grouped(query, key, value, **kwargs)
        if output is not None:
            record_path("grouped")
            return output
        key, value = (ops.repeat(x, group, axis=2) for x in (key, value))  # (B, S, H, d)
    return dot_product_attention(query, key, value, **kwargs)


def _with_sink_key(query, key, value, allowed, bias, sinks):
    """Keys and values `(B, S + 1, H, d)` with a zero one last, the mask and bias
    `(B, H, T, S + 1)` that allow it everywhere with the head's sink as its logit."""
    B, T, H = ops.shape(query)[0], ops.shape(query)[1], ops.shape(query)[2]
    S = ops.shape(key)[1]
    zero_key = ops.zeros_like(key[:, :1])  # (B, 1, H, d_k)
    key = ops.concatenate([key, zero_key], axis=1)
    value = ops.concatenate([value, ops.zeros_like(value[:, :1])], axis=1)
    full = (B, H, T, S)
    allowed = ops.ones(full, "bool") if allowed is None else ops.broadcast_to(allowed, full)
    allowed = ops.concatenate([allowed, ops.ones((B, H, T, 1), "bool")], axis=-1)
    bias = ops.zeros(full, query.dtype) if bias is None else ops.broadcast_to(bias, full)
    column = ops.broadcast_to(ops.reshape(ops.cast(sinks, query.dtype), (1, -1, 1, 1)),
                              (B, H, T, 1))
    return key, value, allowed, ops.concatenate([bias, column], axis=-1)


def fused_attention(query, key, value, mask, bias, spec, *, lead, sinks=None):
    """The fused path for the `(..., T, d)` layout of the functional core.

    `query`, `key`, `value` already share the leading dims `lead`; `spec` is the
    `keras_attn.options.KernelSpec` (no soft-cap, no dropout: the policy routes those
    elsewhere).
    """
    is_causal, scale, sliding_window = spec.is_causal, spec.scale, spec.sliding_window
    T, d_v = static_shape(query)[-2], static_shape(value)[-1]
    n = len(lead)
    if n > 2:  # fold the extra leading dims into the batch
        if any(not isinstance(d, int) for d in lead):
            raise ValueError(
                "The fused path needs static leading dims beyond (batch, heads). "
                f"Received: query.shape={static_shape(query)}"
            )
        batch = int(math.prod(lead[:-1]))

        def fold(x):
            return ops.reshape(x, (batch, lead[-1]) + tuple(x.shape[-2:]))  # (B', H, L, w)

        def fold_mask(x):
            x = to_rank(x, n + 2)
            x = ops.broadcast_to(x, tuple(lead) + tuple(x.shape[-2:]))
            return fold(x)

        query, key, value = fold(query), fold(key), fold(value)
        mask = None if mask is None else fold_mask(ops.cast(mask, "bool"))
        bias = None if bias is None else fold_mask(bias)
    else:
        query, key, value = (to_rank(x, 4) for x in (query, key, value))
    q, k, v = (ops.swapaxes(x, 1, 2) for x in (query, key, value))  # (B, L, H, d)
    if sinks is not None and n != 2:
        raise ValueError("Attention sinks need (B, H, T, d) queries (one sink per head). "
                         f"Received: query.shape={static_shape(query)}")
    out = fused_attention_bthd(q, k, v, mask=mask, bias=bias, is_causal=is_causal, scale=scale,
                               sliding_window=sliding_window, sinks=sinks,
                               attention_chunk_size=spec.attention_chunk_size,
                               zero_unattended=not spec.unattended_finite)
    out = ops.swapaxes(out, 1, 2)  # (B, H, T, d_v)
    if n > 2:
        return ops.reshape(out, tuple(lead) + (T, d_v))
    for _ in range(2 - n):
        out = ops.squeeze(out, 0)
    return out
