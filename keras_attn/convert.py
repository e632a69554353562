"""Weights from Keras, `torch.nn` and Hugging Face Llama layers into keras_attn layers.

Numpy in, built layers out: every function takes arrays (anything
`numpy.asarray` accepts; torch tensors too, read through
`.detach().cpu().numpy()` without importing torch) and returns a new, built
keras_attn layer whose weights are set. Everything is checked (missing
entries, shapes, unsupported options) before any weight is assigned, and a
problem raises a `ValueError` naming the entry and what was received.

Shapes: B batch, T query (target) length, S key (source, memory) length,
D model width (torch's `embed_dim` / `d_model`), D_k, D_v the key and value
widths (torch's `kdim`, `vdim`), D_m memory width, H heads, d head width
(d = D // H for torch), F feed-forward width (`dim_feedforward`), H_kv
key/value heads (grouped-query attention; Llama's `num_key_value_heads`).

Layouts: `torch.nn.Linear` stores `weight` as `(out, in)`; a Keras `Dense`
kernel is `(in, out)`, so `kernel = weight.T`. Head `h` owns columns
`[h * d, (h + 1) * d)` of a keras_attn projection kernel and rows
`[h * d, (h + 1) * d)` of the torch weight, so no head reordering is needed.
"""

from collections.abc import Mapping

import keras
import numpy as np

from keras_attn.layers.multi_head_attention import MultiHeadAttention
from keras_attn.layers.transformer_decoder import TransformerDecoderLayer
from keras_attn.layers.transformer_encoder import TransformerEncoderLayer

__all__ = [
    "multi_head_attention_from_keras",
    "multi_head_attention_from_llama",
    "multi_head_attention_from_torch",
    "transformer_decoder_layer_from_llama",
    "transformer_decoder_layer_from_torch",
    "transformer_encoder_layer_from_torch",
]

# Arguments the converters derive from the weights; passing them in **kwargs is an error.
_MHA_DERIVED = ("num_heads", "key_dim", "value_dim", "output_dim", "use_bias")
_TRANSFORMER_DERIVED = ("intermediate_dim", "key_dim", "activation", "layer_norm_epsilon",
                        "normalize_first")
# Keras MHA equations for rank-3 inputs (the default attention axes).
_KERAS_PROJECTION_EQUATION = "abc,cde->abde"
_KERAS_OUTPUT_EQUATION = "abcd,cde->abe"
_LLAMA_MHA_DERIVED = _MHA_DERIVED + ("num_key_value_heads", "rope_max_wavelength")
_LLAMA_DERIVED = ("intermediate_dim", "key_dim", "activation", "layer_norm_epsilon",
                  "normalize_first", "num_key_value_heads", "rope_max_wavelength",
                  "normalization", "use_bias", "gated_feed_forward")
_TORCH_ACTIVATIONS = ("relu", "gelu")  # torch's exact gelu is keras's default gelu


# ----------------------------------------------------------------------------
# Arrays and state dicts


def _to_numpy(value, what):
    """`value` as a numpy array: `numpy.asarray`, else `.detach().cpu().numpy()`."""
    try:
        array = np.asarray(value)
    except (TypeError, ValueError, RuntimeError):  # e.g. a torch tensor that requires grad
        array = None
    if array is None or array.dtype == object:
        detach = getattr(value, "detach", None)
        if detach is None:
            raise ValueError(
                f"{what} could not be read as a numpy array. "
                f"Received: an object of type {type(value).__name__}")
        tensor = detach().cpu()
        try:
            array = np.asarray(tensor.numpy())
        except TypeError:  # a dtype numpy lacks (torch.bfloat16): read it as float32
            array = np.asarray(tensor.float().numpy())
    return array


def _shape_text(shape):
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


class _StateDict:
    """The entries of a state dict under `prefix`, read once and checked by name."""

    def __init__(self, state_dict, prefix):
        if not isinstance(state_dict, Mapping) and callable(getattr(state_dict, "state_dict", None)):
            state_dict = state_dict.state_dict()  # a torch module: read its state dict
        if not isinstance(state_dict, Mapping):
            raise ValueError(
                "`state_dict` must be a mapping from names to arrays (for example "
                f"`module.state_dict()`). Received: state_dict of type {type(state_dict).__name__}")
        if not isinstance(prefix, str):
            raise ValueError(f"`prefix` must be a string. Received: prefix={prefix!r}")
        if prefix and not prefix.endswith("."):
            prefix += "."
        self.prefix = prefix
        self._raw = {key[len(prefix):]: value for key, value in state_dict.items()
                     if isinstance(key, str) and key.startswith(prefix)}
        self._arrays = {}
        self._used = set()

    def key(self, name):
        return repr(self.prefix + name)

    def has(self, name):
        return name in self._raw

    def received(self):
        names = sorted(self.prefix + name for name in self._raw)
        shown = ", ".join(repr(n) for n in names[:12])
        more = f", ... ({len(names)} in all)" if len(names) > 12 else ""
        return f"Received keys: [{shown}{more}]"

    def require(self, *names, hint=""):
        missing = [name for name in names if name not in self._raw]
        if missing:
            raise ValueError(
                f"state_dict is missing {', '.join(self.key(n) for n in missing)}{hint}. "
                + self.received())

    def get(self, name):
        self.require(name)
        if name not in self._arrays:
            self._arrays[name] = _to_numpy(self._raw[name], f"state_dict entry {self.key(name)}")
        self._used.add(name)
        return self._arrays[name]

    def shaped(self, name, letters, shape):
        """The entry `name`, which must have `shape` (written `letters` in the message)."""
        array = self.get(name)
        if array.shape != tuple(shape):
            raise ValueError(
                f"state_dict entry {self.key(name)} must have shape {letters} = "
                f"{_shape_text(shape)}. Received: shape {_shape_text(array.shape)}")
        return array

    def rank(self, name, rank, letters):
        array = self.get(name)
        if array.ndim != rank:
            raise ValueError(
                f"state_dict entry {self.key(name)} must have shape {letters}. "
                f"Received: shape {_shape_text(array.shape)}")
        return array

    def check_all_used(self):
        extra = sorted(set(self._raw) - self._used)
        if extra:
            raise ValueError(
                "state_dict has unexpected entries "
                f"{', '.join(self.key(n) for n in extra)}, which the converted layer has no "
                "weights for (an unsupported option of the source module, or the wrong `prefix`).")


def _check_kwargs(kwargs, derived, source):
    clash = [name for name in derived if name in kwargs]
    if clash:
        raise ValueError(
            f"{', '.join(f'`{n}`' for n in clash)} cannot be passed here: it is read from the "
            f"{source}. Received: " + ", ".join(f"{n}={kwargs[n]!r}" for n in clash))


def _assign(plan):
    """Check every `(variable, array, what)` shape, then assign them all."""
    for variable, array, what in plan:
        if tuple(variable.shape) != tuple(array.shape):
            raise ValueError(
                f"{what} has shape {_shape_text(array.shape)} but the layer's variable "
                f"'{variable.path}' has shape {_shape_text(tuple(variable.shape))}.")
    for variable, array, _ in plan:
        variable.assign(keras.ops.cast(array, variable.dtype))


def _dense_plan(dense, kernel, bias, what):
    plan = [(dense.kernel, kernel, f"{what} kernel")]
    if bias is not None:
        plan.append((dense.bias, bias, f"{what} bias"))
    return plan


def _norm_plan(norm, gamma, beta, what):
    return [(norm.gamma, gamma, f"{what} weight"), (norm.beta, beta, f"{what} bias")]


def _mha_plan(layer, weights):
    """Assignments of `_torch_mha` / Keras weights onto a keras_attn MultiHeadAttention."""
    plan = []
    for part in ("query", "key", "value", "output"):
        kernel, bias = weights[part]
        plan += _dense_plan(getattr(layer, part + "_dense"), kernel, bias, part)
    return plan


# ----------------------------------------------------------------------------
# Keras


def multi_head_attention_from_keras(layer, **kwargs):
    """A `keras_attn.MultiHeadAttention` with the weights of a Keras one.

    Keras's `EinsumDense` kernels `(D_q, H, d_k)`, `(D_k, H, d_k)`,
    `(D_v, H, d_v)`, `(H, d_v, D_out)` and biases `(H, d)`, `(D_out,)` are
    reshaped into our `Dense` kernels `(D_q, H * d_k)`, ..., `(H * d_v, D_out)`
    (head `h` owns columns `[h * d, (h + 1) * d)`). Both layers compute the
    same function, called the same way (`(query, value, key)`).

    Args:
        layer: a built `keras.layers.MultiHeadAttention` for rank-3 inputs
            (query `(B, T, D_q)`, key `(B, S, D_k)`, value `(B, S, D_v)`)
            with the default `attention_axes`, a single-axis `output_shape`
            (or none), no `use_gate`, and not quantized. A `sliding_window`
            comes along (the same band when T == S; with T != S keras_attn
            aligns it bottom-right, as its causal mask).
            Its regularizers, constraints and activity regularizer come along.
        **kwargs: further arguments of `keras_attn.MultiHeadAttention`
            (`name`, `implementation`, `dtype`, `dropout`, `seed`, ...).
            By default `dropout`, `seed`, `dtype`, the initializers and the
            regularizers are copied from `layer`; `num_heads`, `key_dim`,
            `value_dim`, `output_dim` and `use_bias` are read from it and
            cannot be passed.

    Returns:
        A built `keras_attn.MultiHeadAttention` with H = `layer.num_heads`,
        `key_dim` d_k, `value_dim` d_v, output width D_out, and the same
        weights.

    Raises:
        ValueError: `layer` is not a built Keras `MultiHeadAttention`, or it
            uses an option listed above that keras_attn does not have.
    """
    if not isinstance(layer, keras.layers.MultiHeadAttention):
        raise ValueError(
            "`layer` must be a `keras.layers.MultiHeadAttention`. "
            f"Received: layer of type {type(layer).__name__}")
    if not layer.built:
        raise ValueError(
            f"`layer` ('{layer.name}') must be built (call it once, or call `build`) so that "
            "its weights exist. Received: an unbuilt layer")
    _check_kwargs(kwargs, _MHA_DERIVED, "Keras layer")
    problems = []
    if getattr(layer, "_use_gate", False):
        problems.append("use_gate=True")
    output_shape = getattr(layer, "_output_shape", None)
    if output_shape and len(output_shape) != 1:
        problems.append(f"output_shape={output_shape} (only one output axis is supported)")
    equations = [d.equation for d in (layer._query_dense, layer._key_dense, layer._value_dense)]
    if (any(e != _KERAS_PROJECTION_EQUATION for e in equations)
            or layer._output_dense.equation != _KERAS_OUTPUT_EQUATION
            or tuple(layer._attention_axes or (1,)) != (1,)):
        problems.append(
            f"attention_axes={layer._attention_axes} on inputs of rank "
            f"{len(equations[0].split(',')[0])} (only rank-3 inputs (B, T, D) with the "
            "default attention axes are supported)")
    for dense in (layer._query_dense, layer._key_dense, layer._value_dense, layer._output_dense):
        if getattr(dense, "quantization_mode", None):
            problems.append(f"quantization_mode={dense.quantization_mode!r}")
            break
    if problems:
        raise ValueError(
            f"Cannot convert Keras MultiHeadAttention '{layer.name}': keras_attn.MultiHeadAttention "
            f"does not support {'; '.join(problems)}.")

    H, d_k, d_v = layer.num_heads, layer.key_dim, layer.value_dim
    read = keras.ops.convert_to_numpy
    weights, widths = {}, {}
    for part, dense in (("query", layer._query_dense), ("key", layer._key_dense),
                        ("value", layer._value_dense)):
        kernel = read(dense.kernel)  # (D_in, H, d)
        widths[part] = kernel.shape[0]
        bias = read(dense.bias).reshape(-1) if layer.use_bias else None  # (H * d,)
        weights[part] = (kernel.reshape(kernel.shape[0], -1), bias)
    out_kernel = read(layer._output_dense.kernel)  # (H, d_v, D_out)
    out_dim = out_kernel.shape[-1]
    weights["output"] = (out_kernel.reshape(H * d_v, out_dim),
                         read(layer._output_dense.bias) if layer.use_bias else None)

    options = {
        "dropout": layer.dropout,
        "seed": layer.seed,
        "dtype": layer.dtype_policy,
        "kernel_initializer": keras.initializers.serialize(layer._kernel_initializer),
        "bias_initializer": keras.initializers.serialize(layer._bias_initializer),
        "kernel_regularizer": layer._kernel_regularizer,
        "bias_regularizer": layer._bias_regularizer,
        "kernel_constraint": layer._kernel_constraint,
        "bias_constraint": layer._bias_constraint,
        "activity_regularizer": layer.activity_regularizer,
        "sliding_window": getattr(layer, "_sliding_window", None),
    }
    options.update(kwargs)
    new = MultiHeadAttention(
        H, key_dim=d_k, value_dim=d_v if d_v != d_k else None,
        output_dim=out_dim if output_shape else None, use_bias=layer.use_bias, **options)
    new.build(query_shape=(None, None, widths["query"]), key_shape=(None, None, widths["key"]),
              value_shape=(None, None, widths["value"]))
    _assign(_mha_plan(new, weights))
    return new


# ----------------------------------------------------------------------------
# torch.nn


def _torch_mha(entries, num_heads, sub=""):
    """Check and read a `torch.nn.MultiheadAttention` state dict under `sub`.

    Returns `(D, D_k, D_v, use_bias, weights)` with `weights[part] = (kernel, bias)`
    in keras_attn's layout.
    """
    if entries.has(sub + "bias_k") or entries.has(sub + "bias_v"):
        raise ValueError(
            f"state_dict has {entries.key(sub + 'bias_k')} / {entries.key(sub + 'bias_v')}: "
            "torch.nn.MultiheadAttention(add_bias_kv=True) appends a learned key and value "
            "to every sequence, which keras_attn.MultiHeadAttention does not support.")
    packed = entries.has(sub + "in_proj_weight")
    separate = [sub + n for n in ("q_proj_weight", "k_proj_weight", "v_proj_weight")]
    if not packed and not any(entries.has(n) for n in separate):
        entries.require(sub + "in_proj_weight", hint=" (or the separate "
                        + ", ".join(entries.key(n) for n in separate) + ")")
    entries.require(sub + "out_proj.weight")
    if not packed:
        entries.require(*separate)
    has_in_bias, has_out_bias = entries.has(sub + "in_proj_bias"), entries.has(sub + "out_proj.bias")
    if has_in_bias != has_out_bias:
        present, absent = ((sub + "in_proj_bias", sub + "out_proj.bias") if has_in_bias
                           else (sub + "out_proj.bias", sub + "in_proj_bias"))
        raise ValueError(
            f"state_dict has {entries.key(present)} but is missing {entries.key(absent)}: "
            "keras_attn.MultiHeadAttention has biases on all four projections or on none.")
    use_bias = has_in_bias

    out_weight = entries.rank(sub + "out_proj.weight", 2, "(D, D)")
    D = out_weight.shape[0]
    entries.shaped(sub + "out_proj.weight", "(D, D)", (D, D))
    if D % num_heads:
        raise ValueError(
            f"The embedding width D={D} (from {entries.key(sub + 'out_proj.weight')}) must be "
            f"divisible by num_heads. Received: num_heads={num_heads}")
    if packed:
        in_weight = entries.shaped(sub + "in_proj_weight", "(3D, D)", (3 * D, D))
        q_w, k_w, v_w = in_weight[:D], in_weight[D:2 * D], in_weight[2 * D:]
    else:
        q_w = entries.shaped(sub + "q_proj_weight", "(D, D)", (D, D))
        k_w = entries.rank(sub + "k_proj_weight", 2, "(D, D_k)")
        k_w = entries.shaped(sub + "k_proj_weight", "(D, D_k)", (D, k_w.shape[1]))
        v_w = entries.rank(sub + "v_proj_weight", 2, "(D, D_v)")
        v_w = entries.shaped(sub + "v_proj_weight", "(D, D_v)", (D, v_w.shape[1]))
    q_b = k_b = v_b = out_b = None
    if use_bias:
        in_bias = entries.shaped(sub + "in_proj_bias", "(3D,)", (3 * D,))
        q_b, k_b, v_b = in_bias[:D], in_bias[D:2 * D], in_bias[2 * D:]
        out_b = entries.shaped(sub + "out_proj.bias", "(D,)", (D,))
    weights = {"query": (q_w.T, q_b), "key": (k_w.T, k_b), "value": (v_w.T, v_b),
               "output": (out_weight.T, out_b)}
    return D, k_w.shape[1], v_w.shape[1], use_bias, weights


def _check_num_heads(num_heads):
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads <= 0:
        raise ValueError(f"`num_heads` must be a positive integer. Received: num_heads={num_heads!r}")


def multi_head_attention_from_torch(state_dict, num_heads, *, prefix="", **kwargs):
    """A `keras_attn.MultiHeadAttention` from a `torch.nn.MultiheadAttention` state dict.

    The torch module is `MultiheadAttention(D, H, batch_first=True)`, with
    optional `kdim=D_k`, `vdim=D_v` and `bias`. Its packed
    `in_proj_weight` `(3D, D)` (or `q_proj_weight` `(D, D)`, `k_proj_weight`
    `(D, D_k)`, `v_proj_weight` `(D, D_v)`), `in_proj_bias` `(3D,)`,
    `out_proj.weight` `(D, D)` and `out_proj.bias` `(D,)` become the
    kernels `W.T` and biases of `query_dense`, `key_dense`, `value_dense`
    and `output_dense`. Masks differ in sign: torch's `key_padding_mask`
    `(B, S)` is True = ignore; pass its negation as `key_mask=` (or as a
    bool `attention_mask` `(B, T, S)`, True = may attend).

    Args:
        state_dict: the module's `state_dict()` (a mapping from names to
            arrays or tensors), or the module itself.
        num_heads: H; it must divide D.
        prefix: the prefix of the module's entries in a larger state dict,
            e.g. `"encoder.layers.0.self_attn."` (a missing final dot is
            added). Entries outside the prefix are ignored.
        **kwargs: further arguments of `keras_attn.MultiHeadAttention`
            (`name`, `dropout`, `dtype`, `implementation`, ...). `key_dim`,
            `value_dim`, `output_dim` and `use_bias` are read from the
            weights and cannot be passed.

    Returns:
        A built `keras_attn.MultiHeadAttention` with H heads of width
        d = D // H, output width D, query width D, key width D_k, value
        width D_v, and `use_bias` True iff the biases are present.

    Raises:
        ValueError: an entry is missing or mis-shaped, the dict holds
            `bias_k`/`bias_v` (`add_bias_kv=True`) or other unexpected
            entries, or H does not divide D.
    """
    _check_num_heads(num_heads)
    _check_kwargs(kwargs, _MHA_DERIVED[1:], "state dict")
    entries = _StateDict(state_dict, prefix)
    D, D_k, D_v, use_bias, weights = _torch_mha(entries, num_heads)
    entries.check_all_used()
    layer = MultiHeadAttention(num_heads, key_dim=D // num_heads, use_bias=use_bias, **kwargs)
    layer.build(query_shape=(None, None, D), key_shape=(None, None, D_k),
                value_shape=(None, None, D_v))
    _assign(_mha_plan(layer, weights))
    return layer


def _torch_activation(activation):
    name = activation if isinstance(activation, str) else getattr(activation, "__name__", None)
    if name not in _TORCH_ACTIVATIONS:
        raise ValueError(
            f"`activation` must be one of {_TORCH_ACTIVATIONS} (torch's string options, or "
            f"torch.nn.functional.relu / gelu). Received: activation={activation!r}")
    return name


def _torch_layer_norm(entries, name, D):
    return (entries.shaped(name + ".weight", "(D,)", (D,)),
            entries.shaped(name + ".bias", "(D,)", (D,)))


def _torch_block(entries, num_heads, norms, cross):
    """Read a torch encoder/decoder layer: `(D, D_m, F, plan_fn)`."""
    required = ["linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias"]
    required += [f"{n}.{w}" for n in norms for w in ("weight", "bias")]
    entries.require(*required, hint=" (keras_attn Transformer layers always have biases: a torch "
                    "layer built with bias=False cannot be converted)"
                    if any(not entries.has(n) for n in required if n.endswith("bias")) else "")
    D, D_k, D_v, use_bias, self_weights = _torch_mha(entries, num_heads, "self_attn.")
    if not use_bias:
        entries.require("self_attn.in_proj_bias", "self_attn.out_proj.bias")
    if (D_k, D_v) != (D, D):
        raise ValueError(
            f"The self-attention key and value widths must equal D={D}. "
            f"Received: D_k={D_k}, D_v={D_v}")
    D_m, cross_weights = None, None
    if cross:
        D_q, D_m, D_mv, use_bias, cross_weights = _torch_mha(entries, num_heads, "multihead_attn.")
        if not use_bias:
            entries.require("multihead_attn.in_proj_bias", "multihead_attn.out_proj.bias")
        if D_q != D:
            raise ValueError(
                f"state_dict entry {entries.key('multihead_attn.out_proj.weight')} must have "
                f"shape (D, D) = {_shape_text((D, D))}. Received: shape {_shape_text((D_q, D_q))}")
        if D_mv != D_m:
            raise ValueError(
                "The cross-attention key and value widths must be equal (both are the memory "
                f"width D_m). Received: D_k={D_m}, D_v={D_mv}")
    F = entries.rank("linear1.bias", 1, "(F,)").shape[0]
    w1 = entries.shaped("linear1.weight", "(F, D)", (F, D))
    b1 = entries.get("linear1.bias")
    w2 = entries.shaped("linear2.weight", "(D, F)", (D, F))
    b2 = entries.shaped("linear2.bias", "(D,)", (D,))
    norm_weights = [_torch_layer_norm(entries, n, D) for n in norms]
    entries.check_all_used()

    def plan(layer):
        steps = _mha_plan(layer.self_attention, self_weights)
        if cross:
            steps += _mha_plan(layer.cross_attention, cross_weights)
        steps += _dense_plan(layer.feed_forward.intermediate_dense, w1.T, b1, "linear1")
        steps += _dense_plan(layer.feed_forward.output_dense, w2.T, b2, "linear2")
        ours = ["self_attention_norm"] + (["cross_attention_norm"] if cross else [])
        for norm_name, torch_name, (gamma, beta) in zip(ours + ["feed_forward_norm"], norms,
                                                       norm_weights):
            steps += _norm_plan(getattr(layer, norm_name), gamma, beta, torch_name)
        return steps

    return D, D_m, F, plan


def _transformer_options(num_heads, norm_first, activation, layer_norm_eps, kwargs):
    _check_num_heads(num_heads)
    _check_kwargs(kwargs, _TRANSFORMER_DERIVED, "state dict or the torch-named arguments")
    return {"activation": _torch_activation(activation), "layer_norm_epsilon": layer_norm_eps,
            "normalize_first": bool(norm_first), **kwargs}


def transformer_encoder_layer_from_torch(state_dict, num_heads, *, norm_first=False, activation="relu",
                                         layer_norm_eps=1e-5, prefix="", **kwargs):
    """A `keras_attn.TransformerEncoderLayer` from a `torch.nn.TransformerEncoderLayer` state dict.

    The torch layer is `TransformerEncoderLayer(D, H, F, batch_first=True)`
    with biases (the default). Its entries map as: `self_attn.*` to
    `self_attention` (see `multi_head_attention_from_torch`), `linear1`
    (`(F, D)`, `(F,)`) and `linear2` (`(D, F)`, `(D,)`) to
    `feed_forward.intermediate_dense` / `output_dense` (kernel `W.T`),
    `norm1` to `self_attention_norm` and `norm2` to `feed_forward_norm`
    (`weight` to gamma, `bias` to beta). Both compute post-LN
    `x = LN1(x + SA(x)); x = LN2(x + FF(x))`, or pre-LN with `norm_first`.
    torch's `src_key_padding_mask` `(B, T)` is True = ignore; ours,
    `padding_mask`, is True = real token.

    Args:
        state_dict: the layer's `state_dict()`, or the layer itself.
        num_heads: H (torch's `nhead`); it must divide D.
        norm_first: the torch layer's `norm_first` (pre-LN); becomes
            `normalize_first`.
        activation: the torch layer's activation: `"relu"` or `"gelu"`
            (exact, erf-based, like Keras's default `"gelu"`), or
            `torch.nn.functional.relu` / `gelu`.
        layer_norm_eps: the torch layer's `layer_norm_eps`.
        prefix: the prefix of the layer's entries in a larger state dict,
            e.g. `"encoder.layers.0."` (a missing final dot is added).
        **kwargs: further arguments of `keras_attn.TransformerEncoderLayer`
            (`dropout`, `name`, `dtype`, ...). Dropout defaults to 0, not to
            torch's 0.1.

    Returns:
        A `keras_attn.TransformerEncoderLayer` built for inputs
        `(B, T, D)`, with `intermediate_dim` F, H heads of width D // H, and
        the torch layer's weights.

    Raises:
        ValueError: an entry is missing (for example the biases of a torch
            layer built with `bias=False`) or mis-shaped, an unexpected
            entry is present, or an option is unsupported.
    """
    options = _transformer_options(num_heads, norm_first, activation, layer_norm_eps, kwargs)
    entries = _StateDict(state_dict, prefix)
    D, _, F, plan = _torch_block(entries, num_heads, ("norm1", "norm2"), cross=False)
    layer = TransformerEncoderLayer(num_heads, intermediate_dim=F, **options)
    layer.build((None, None, D))
    _assign(plan(layer))
    return layer


def transformer_decoder_layer_from_torch(state_dict, num_heads, *, norm_first=False, activation="relu",
                                         layer_norm_eps=1e-5, memory_dim=None, prefix="", **kwargs):
    """A `keras_attn.TransformerDecoderLayer` from a `torch.nn.TransformerDecoderLayer` state dict.

    The torch layer is `TransformerDecoderLayer(D, H, F, batch_first=True)`
    with biases. Its entries map as: `self_attn.*` to `self_attention`,
    `multihead_attn.*` to `cross_attention`, `linear1`/`linear2` to
    `feed_forward`, and `norm1`, `norm2`, `norm3` to `self_attention_norm`,
    `cross_attention_norm`, `feed_forward_norm`. The result is built with
    memory. Ours is causal by default; torch's equivalent is
    `tgt_mask=Transformer.generate_square_subsequent_mask(T)`,
    `tgt_is_causal=True`. torch's key padding masks are True = ignore;
    ours (`padding_mask`, `memory_padding_mask`) are True = real token.

    Args:
        state_dict: the layer's `state_dict()`, or the layer itself.
        num_heads: H (torch's `nhead`); it must divide D.
        norm_first: the torch layer's `norm_first`; becomes
            `normalize_first`.
        activation: `"relu"` or `"gelu"` (exact), or
            `torch.nn.functional.relu` / `gelu`.
        layer_norm_eps: the torch layer's `layer_norm_eps`.
        memory_dim: D_m, the width of `memory` `(B, S, D_m)`. Defaults to
            the width read from the cross-attention key weight (D for a
            torch `TransformerDecoderLayer`); if given, it must match it.
        prefix: the prefix of the layer's entries in a larger state dict,
            e.g. `"decoder.layers.0."` (a missing final dot is added).
        **kwargs: further arguments of `keras_attn.TransformerDecoderLayer`
            (`dropout`, `name`, `dtype`, ...). Dropout defaults to 0.

    Returns:
        A `keras_attn.TransformerDecoderLayer` built for inputs `(B, T, D)`
        and memory `(B, S, D_m)`, with `intermediate_dim` F and the torch
        layer's weights.

    Raises:
        ValueError: an entry is missing or mis-shaped, an unexpected entry
            is present, `memory_dim` disagrees with the weights, or an
            option is unsupported.
    """
    options = _transformer_options(num_heads, norm_first, activation, layer_norm_eps, kwargs)
    if memory_dim is not None and (isinstance(memory_dim, bool) or not isinstance(memory_dim, int)
                                   or memory_dim <= 0):
        raise ValueError(f"`memory_dim` must be a positive integer or None. Received: "
                         f"memory_dim={memory_dim!r}")
    entries = _StateDict(state_dict, prefix)
    D, D_m, F, plan = _torch_block(entries, num_heads, ("norm1", "norm2", "norm3"), cross=True)
    if memory_dim is not None and memory_dim != D_m:
        raise ValueError(
            f"`memory_dim` must match the width of {entries.key('multihead_attn.k_proj_weight')} "
            f"or {entries.key('multihead_attn.in_proj_weight')}, D_m={D_m}. "
            f"Received: memory_dim={memory_dim}")
    layer = TransformerDecoderLayer(num_heads, intermediate_dim=F, **options)
    layer.build((None, None, D), memory_shape=(None, None, D_m))
    _assign(plan(layer))
    return layer


# ----------------------------------------------------------------------------
# Hugging Face Llama


def _check_key_value_heads(num_heads, num_key_value_heads):
    if (isinstance(num_key_value_heads, bool) or not isinstance(num_key_value_heads, int)
            or num_key_value_heads <= 0 or num_heads % num_key_value_heads):
        raise ValueError(
            "`num_key_value_heads` must be a positive integer that divides `num_heads`. "
            f"Received: num_heads={num_heads!r}, num_key_value_heads={num_key_value_heads!r}")


def _llama_attention(entries, num_heads, num_key_value_heads, sub=""):
    """Check and read a `LlamaAttention` state dict under `sub`.

    Returns `(D, d, use_bias, weights)` with `weights[part] = (kernel, bias)`
    in keras_attn's layout.
    """
    H, H_kv = num_heads, num_key_value_heads
    names = [sub + n + "_proj.weight" for n in ("q", "k", "v", "o")]
    entries.require(*names)
    bias_names = [sub + n + "_proj.bias" for n in ("q", "k", "v", "o")]
    present = [n for n in bias_names if entries.has(n)]
    if present and len(present) != len(bias_names):
        absent = [n for n in bias_names if not entries.has(n)]
        raise ValueError(
            f"state_dict has {', '.join(entries.key(n) for n in present)} but is missing "
            f"{', '.join(entries.key(n) for n in absent)}: keras_attn.MultiHeadAttention has "
            "biases on all four projections (Llama's `attention_bias=True`) or on none.")
    use_bias = bool(present)

    q_w = entries.rank(sub + "q_proj.weight", 2, "(H * d, D)")
    Hd, D = q_w.shape
    if Hd % H:
        raise ValueError(
            f"The query width H * d = {Hd} (from {entries.key(sub + 'q_proj.weight')}) must be "
            f"divisible by num_heads. Received: num_heads={H}")
    d = Hd // H
    k_w = entries.shaped(sub + "k_proj.weight", "(H_kv * d, D)", (H_kv * d, D))
    v_w = entries.shaped(sub + "v_proj.weight", "(H_kv * d, D)", (H_kv * d, D))
    o_w = entries.shaped(sub + "o_proj.weight", "(D, H * d)", (D, Hd))
    q_b = k_b = v_b = o_b = None
    if use_bias:
        q_b = entries.shaped(sub + "q_proj.bias", "(H * d,)", (Hd,))
        k_b = entries.shaped(sub + "k_proj.bias", "(H_kv * d,)", (H_kv * d,))
        v_b = entries.shaped(sub + "v_proj.bias", "(H_kv * d,)", (H_kv * d,))
        o_b = entries.shaped(sub + "o_proj.bias", "(D,)", (D,))
    weights = {"query": (q_w.T, q_b), "key": (k_w.T, k_b), "value": (v_w.T, v_b),
               "output": (o_w.T, o_b)}
    return D, d, use_bias, weights


def multi_head_attention_from_llama(state_dict, num_heads, num_key_value_heads, *,
                                    rope_theta=10000.0, prefix="", **kwargs):
    """A `keras_attn.MultiHeadAttention` from a Hugging Face `LlamaAttention` state dict.

    `LlamaAttention` projects with `q_proj.weight` `(H * d, D)`,
    `k_proj.weight` and `v_proj.weight` `(H_kv * d, D)` and
    `o_proj.weight` `(D, H * d)` (with `q_proj.bias` `(H * d,)`,
    `k_proj.bias`, `v_proj.bias` `(H_kv * d,)` and `o_proj.bias` `(D,)`
    only if `attention_bias=True`), rotates queries and keys with half-split
    RoPE of base `rope_theta`, and lets query head n use key/value head
    `n // (H / H_kv)`. These become the kernels `W.T` (and biases) of
    `query_dense`, `key_dense`, `value_dense` and `output_dense` of a layer
    with `num_key_value_heads=H_kv` and `rope_max_wavelength=rope_theta`;
    head order and the RoPE pairing are the same, so nothing is permuted.

    Call the result as self-attention, `layer(x, use_causal_mask=True)` for
    Llama's causal mask, on `x` `(B, T, D)`; positions are `0 .. T - 1`
    (Llama's default `position_ids`). Only the default RoPE (`rope_type`
    `"default"`) is reproduced; `"linear"` scaling with factor s is
    `rope_scaling_factor=s` in `**kwargs`; other RoPE types (`"llama3"`,
    `"yarn"`, `"dynamic"`, ...) are not supported.

    Args:
        state_dict: the module's `state_dict()` (a mapping from names to
            arrays or tensors), or the module itself.
        num_heads: H, the config's `num_attention_heads`.
        num_key_value_heads: H_kv, the config's `num_key_value_heads`; must
            divide H (H_kv = H is plain multi-head attention, 1 is
            multi-query).
        rope_theta: the config's `rope_theta` (in newer `transformers`,
            `config.rope_parameters["rope_theta"]`).
        prefix: the prefix of the module's entries in a larger state dict,
            e.g. `"model.layers.0.self_attn."` (a missing final dot is
            added). Entries outside the prefix are ignored.
        **kwargs: further arguments of `keras_attn.MultiHeadAttention`
            (`name`, `dtype`, `implementation`, `rope_scaling_factor`,
            `sliding_window`, ...). `num_heads`, `key_dim`, `value_dim`,
            `output_dim`, `use_bias`, `num_key_value_heads` and
            `rope_max_wavelength` are given or read from the weights and
            cannot be passed.

    Returns:
        A `keras_attn.MultiHeadAttention` built for query, key and value
        `(B, T, D)`, with H heads of width d (read from the weights; the
        config's `head_dim`), H_kv key/value heads, RoPE of base
        `rope_theta`, and `use_bias` True iff the biases are present.

    Raises:
        ValueError: an entry is missing or mis-shaped, only some biases
            are present, another entry is present under `prefix`, H_kv
            does not divide H, or H does not divide the query width.
    """
    _check_num_heads(num_heads)
    _check_key_value_heads(num_heads, num_key_value_heads)
    _check_kwargs(kwargs, _LLAMA_MHA_DERIVED[1:], "state dict or the Llama-named arguments")
    entries = _StateDict(state_dict, prefix)
    D, d, use_bias, weights = _llama_attention(entries, num_heads, num_key_value_heads)
    entries.check_all_used()
    layer = MultiHeadAttention(num_heads, key_dim=d, num_key_value_heads=num_key_value_heads,
                               rope_max_wavelength=rope_theta, use_bias=use_bias, **kwargs)
    layer.build(query_shape=(None, None, D))
    _assign(_mha_plan(layer, weights))
    return layer


def transformer_decoder_layer_from_llama(state_dict, num_heads, num_key_value_heads, *,
                                         rope_theta=10000.0, rms_norm_eps=1e-6, prefix="",
                                         **kwargs):
    """A Llama-style `keras_attn.TransformerDecoderLayer` from a `LlamaDecoderLayer` state dict.

    The Hugging Face `LlamaDecoderLayer` computes
    `x = x + attn(rms(x)); x = x + mlp(rms(x))` with
    `mlp(x) = down_proj(silu(gate_proj(x)) * up_proj(x))`. Its entries map as:

    - `self_attn.{q,k,v,o}_proj.*` to `self_attention` (see
      `multi_head_attention_from_llama`);
    - `input_layernorm.weight` `(D,)` to `self_attention_norm` and
      `post_attention_layernorm.weight` `(D,)` to `feed_forward_norm`
      (Keras `RMSNormalization` `scale`);
    - `mlp.gate_proj.weight` `(F, D)` to `feed_forward.gate_dense`,
      `mlp.up_proj.weight` `(F, D)` to `feed_forward.intermediate_dense`
      and `mlp.down_proj.weight` `(D, F)` to `feed_forward.output_dense`
      (kernels `W.T`; biases `(F,)`, `(F,)`, `(D,)` only with
      `mlp_bias=True`).

    The result is `TransformerDecoderLayer(H, intermediate_dim=F,
    num_key_value_heads=H_kv, rope_max_wavelength=rope_theta,
    normalization="rms", normalize_first=True, use_bias=...,
    gated_feed_forward=True, activation="silu",
    layer_norm_epsilon=rms_norm_eps)`, built without memory (a decoder-only
    block). It is causal by default, as Llama; positions are `0 .. T - 1`.
    keras_attn has one `use_bias` for the whole block, so the attention and
    MLP biases must be both present (`attention_bias=True`,
    `mlp_bias=True`) or both absent (Llama's default). Only `hidden_act`
    `"silu"` and the default RoPE (or `"linear"` scaling, via
    `rope_scaling_factor` in `**kwargs`) are reproduced.

    Args:
        state_dict: the layer's `state_dict()`, or the layer itself.
        num_heads: H, the config's `num_attention_heads`.
        num_key_value_heads: H_kv, the config's `num_key_value_heads`; must
            divide H.
        rope_theta: the config's `rope_theta`.
        rms_norm_eps: the config's `rms_norm_eps`.
        prefix: the prefix of the layer's entries in a larger state dict,
            e.g. `"model.layers.0."` (a missing final dot is added).
        **kwargs: further arguments of `keras_attn.TransformerDecoderLayer`
            (`name`, `dtype`, `dropout`, `rope_scaling_factor`,
            `sliding_window`, ...). The Llama structure (`intermediate_dim`,
            `key_dim`, `activation`, `layer_norm_epsilon`,
            `normalize_first`, `num_key_value_heads`, `rope_max_wavelength`,
            `normalization`, `use_bias`, `gated_feed_forward`) is fixed or
            read from the weights and cannot be passed.

    Returns:
        A `keras_attn.TransformerDecoderLayer` built for inputs `(B, T, D)`
        without memory, with `intermediate_dim` F, H heads of width d (the
        `key_dim`, read from the weights), and the Llama layer's weights.

    Raises:
        ValueError: an entry is missing or mis-shaped, only some biases are
            present, an unexpected entry is present, or H_kv does not
            divide H.
    """
    _check_num_heads(num_heads)
    _check_key_value_heads(num_heads, num_key_value_heads)
    _check_kwargs(kwargs, _LLAMA_DERIVED, "state dict or the Llama-named arguments")
    entries = _StateDict(state_dict, prefix)
    mlp = ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
    entries.require("input_layernorm.weight", "post_attention_layernorm.weight",
                    *(n + ".weight" for n in mlp))
    D, d, use_bias, attention_weights = _llama_attention(
        entries, num_heads, num_key_value_heads, "self_attn.")
    mlp_bias = [entries.has(n + ".bias") for n in mlp]
    if any(mlp_bias) != use_bias or len(set(mlp_bias)) > 1:
        state = {True: "present", False: "absent"}
        raise ValueError(
            "keras_attn.TransformerDecoderLayer has one `use_bias` for the attention and the "
            "feed-forward: the biases of self_attn.{q,k,v,o}_proj and of mlp.{gate,up,down}_proj "
            "must all be present or all be absent. Received: "
            f"self_attn biases {state[use_bias]}, "
            + ", ".join(f"{entries.key(n + '.bias')} {state[f]}" for n, f in zip(mlp, mlp_bias)))
    F = entries.rank("mlp.gate_proj.weight", 2, "(F, D)").shape[0]
    gate_w = entries.shaped("mlp.gate_proj.weight", "(F, D)", (F, D))
    up_w = entries.shaped("mlp.up_proj.weight", "(F, D)", (F, D))
    down_w = entries.shaped("mlp.down_proj.weight", "(D, F)", (D, F))
    gate_b = up_b = down_b = None
    if use_bias:
        gate_b = entries.shaped("mlp.gate_proj.bias", "(F,)", (F,))
        up_b = entries.shaped("mlp.up_proj.bias", "(F,)", (F,))
        down_b = entries.shaped("mlp.down_proj.bias", "(D,)", (D,))
    input_norm = entries.shaped("input_layernorm.weight", "(D,)", (D,))
    post_norm = entries.shaped("post_attention_layernorm.weight", "(D,)", (D,))
    entries.check_all_used()

    layer = TransformerDecoderLayer(
        num_heads, intermediate_dim=F, key_dim=d, num_key_value_heads=num_key_value_heads,
        rope_max_wavelength=rope_theta, normalization="rms", normalize_first=True,
        use_bias=use_bias, gated_feed_forward=True, activation="silu",
        layer_norm_epsilon=rms_norm_eps, **kwargs)
    layer.build((None, None, D))
    feed_forward = layer.feed_forward
    plan = _mha_plan(layer.self_attention, attention_weights)
    plan += _dense_plan(feed_forward.gate_dense, gate_w.T, gate_b, "mlp.gate_proj")
    plan += _dense_plan(feed_forward.intermediate_dense, up_w.T, up_b, "mlp.up_proj")
    plan += _dense_plan(feed_forward.output_dense, down_w.T, down_b, "mlp.down_proj")
    plan += [(layer.self_attention_norm.scale, input_norm, "input_layernorm weight"),
             (layer.feed_forward_norm.scale, post_norm, "post_attention_layernorm weight")]
    _assign(plan)
    return layer
