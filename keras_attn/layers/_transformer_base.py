"""Constructor, sublayer factories and config shared by the encoder and decoder."""

from collections.abc import Callable

import keras
from keras import ops

from keras_attn._typing import Initializer
from keras_attn._validation import check_dropout, check_positive_float, check_positive_int
from keras_attn.layers import _keras_compat as compat
from keras_attn.layers._common import check_not_quantized, clone_initializer
from keras_attn.layers._sublayers import (
    GivenSublayers,
    build_given,
    check_ignored,
    given_sublayer,
)
from keras_attn.layers.feed_forward import PositionwiseFeedForward
from keras_attn.layers.multi_head_attention import MultiHeadAttention
from keras_attn.options import FIELDS, AttentionOptions, pop_options

__all__ = ["TransformerLayerBase"]

# The flat arguments that only configure the default sublayers, with their defaults: a
# given `attention=` (`feed_forward=`) makes them meaningless. The first group also
# configures a decoder's cross-attention, which stays the default.
_ATTENTION_ARGUMENTS = {"num_heads": None, "key_dim": None, "implementation": "auto",
                        "attention_dropout": 0.0, "attention_use_bias": None,
                        "attention_output_use_bias": None}
_FEED_FORWARD_ARGUMENTS = {"intermediate_dim": None, "activation": "relu",
                           "gated_feed_forward": False, "feed_forward_use_bias": None}
_DEFAULT_OPTIONS = AttentionOptions().get_config()


class TransformerLayerBase(keras.layers.Layer):
    """Constructor, sublayer factories and config of the encoder/decoder.

    Shapes: B batch, T length, D model width (the input's last dim),
    H `num_heads`, F `intermediate_dim`.

    `attention=` and `feed_forward=` (a layer or a factory, see
    `keras_attn.layers._sublayers` for the contract) replace the default
    sublayers; `residual_scale` multiplies every residual branch; `use_gate`
    gives the default self-attention Keras's gated output (`MultiHeadAttention`'s
    `use_gate`: `attended * sigmoid(query W_g + b_g)`, arXiv 2505.06708, Qwen3-Next;
    a decoder's cross-attention stays ungated).

    `use_input_norm` (keyword, default True): False removes the norms before the
    sublayers (`self_attention_norm`, `feed_forward_norm` and a decoder's
    `cross_attention_norm` are not made), so that with the post norms the block is
    `x + N_post(f(x))` per sublayer (OLMo 2 and 3, EXAONE 4: transformers'
    `post_attention_layernorm` / `post_feedforward_layernorm` are the only norms of
    those layers). It needs `normalize_first=True` (in a post-LN block the input norm
    is the only norm, after the residual) and both `use_post_attention_norm` and
    `use_post_ffw_norm` (a sublayer with no norm at all is not a block shape any
    model uses); anything else is a `ValueError` naming the three.

    `use_feed_forward_norm` (keyword, default True): False removes the norm before the
    feed-forward only (`feed_forward_norm` is not made): the feed-forward receives the
    residual stream itself, for a given `feed_forward` that normalises its own input
    (`keras_attn.ParallelMixtureOfExperts`: Gemma 4's router reads the un-normalised
    stream). Pre-norm only (`normalize_first=True`, else a `ValueError`).
    `use_attention_input_norm` (keyword, default True): False removes only the norm
    before the self-attention (`self_attention_norm` is not made) and keeps the one
    before the feed-forward (and a decoder's cross-attention's): the block is
    `x + attn(x)`, then `x + ffn(N(x))` (ModernBERT's layer 0, whose `attn_norm` is
    `nn.Identity()` after the embeddings' own norm). It needs `normalize_first=True`
    (in a post-LN block the input norm is the norm after the residual); a decoder's
    `use_parallel_residual` block, whose one norm is the attention's, refuses it too.
    """

    # Whether the block has a default cross-attention that the attention arguments other
    # than the self-attention's options still configure (the decoder's).
    _has_cross_attention = False

    def __init__(
        self,
        num_heads: int | None = None,
        *args,
        intermediate_dim: int | None = None,
        key_dim: int | None = None,
        dropout: float = 0.0,
        activation: str | Callable = "relu",
        layer_norm_epsilon: float = 1e-5,
        normalize_first: bool = False,
        kernel_initializer: Initializer = "glorot_uniform",
        bias_initializer: Initializer = "zeros",
        num_key_value_heads: int | None = None,
        rope_max_wavelength: float | None = None,
        rope_scaling_factor: float = 1.0,
        rope_interleaved: bool = False,
        sliding_window: int | None = None,
        logit_soft_cap: float | None = None,
        qk_norm: str | None = None,
        normalization: str = "layer",
        use_bias: bool = True,
        gated_feed_forward: bool = False,
        implementation: str | Callable = "auto",
        attention_dropout: float = 0.0,
        attention_use_bias: bool | None = None,
        attention_output_use_bias: bool | None = None,
        feed_forward_use_bias: bool | None = None,
        use_post_attention_norm: bool = False,
        use_post_ffw_norm: bool = False,
        attention: keras.layers.Layer | Callable | dict | None = None,
        feed_forward: keras.layers.Layer | Callable | dict | None = None,
        residual_scale: float | None = None,
        use_gate: bool = False,
        use_input_norm: bool = True,
        use_feed_forward_norm: bool = True,
        use_attention_input_norm: bool = True,
        **kwargs,
    ) -> None:
        if args:
            raise TypeError(
                f"{type(self).__name__} takes `num_heads` positionally and every other "
                "argument by keyword (keras-hub's TransformerEncoder/Decoder take "
                "(intermediate_dim, num_heads): a positional second argument is "
                f"ambiguous). Call it as {type(self).__name__}(num_heads, "
                f"intermediate_dim=...). Received: {len(args)} extra positional "
                f"argument(s) {args!r}"
            )
        # The self-attention's options (any further `AttentionOptions` field comes in kwargs).
        options = pop_options(
            kwargs, num_key_value_heads=num_key_value_heads,
            rope_max_wavelength=rope_max_wavelength, rope_scaling_factor=rope_scaling_factor,
            rope_interleaved=rope_interleaved, sliding_window=sliding_window,
            logit_soft_cap=logit_soft_cap, qk_norm=qk_norm)
        super().__init__(**kwargs)
        self._attention_given = attention is not None
        self._feed_forward_given = feed_forward is not None
        if self._attention_given:
            flat = {} if self._has_cross_attention else {
                "num_heads": num_heads, "key_dim": key_dim, "implementation": implementation,
                "attention_dropout": attention_dropout, "attention_use_bias": attention_use_bias,
                "attention_output_use_bias": attention_output_use_bias}
            check_ignored("attention", "self-attention", {
                **{k: v for k, v in flat.items() if v != _ATTENTION_ARGUMENTS[k]},
                **{k: v for k, v in options.get_config().items() if v != _DEFAULT_OPTIONS[k]}})
        if self._attention_given and use_gate:
            check_ignored("attention", "self-attention", {"use_gate": use_gate})
        if self._feed_forward_given:
            flat = {"intermediate_dim": intermediate_dim, "gated_feed_forward": gated_feed_forward,
                    "feed_forward_use_bias": feed_forward_use_bias}
            ignored = {k: v for k, v in flat.items() if v != _FEED_FORWARD_ARGUMENTS[k]}
            if keras.activations.get(activation) is not keras.activations.get("relu"):
                ignored["activation"] = activation  # "relu" by any spelling is the default
            check_ignored("feed_forward", "feed-forward", ignored)
        # With a given attention the block may have no heads of its own (an encoder, or a
        # decoder without memory); a decoder built with memory needs them then.
        self.num_heads = check_positive_int("num_heads", num_heads,
                                            allow_none=self._attention_given)
        self.intermediate_dim = check_positive_int("intermediate_dim", intermediate_dim,
                                                   allow_none=self._feed_forward_given)
        self.key_dim = check_positive_int("key_dim", key_dim, allow_none=True)
        self.dropout = check_dropout("dropout", dropout)
        self.activation = keras.activations.get(activation)
        if not isinstance(layer_norm_epsilon, (int, float)) or layer_norm_epsilon <= 0:
            raise ValueError(
                "`layer_norm_epsilon` must be a positive float. "
                f"Received: layer_norm_epsilon={layer_norm_epsilon!r}"
            )
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.normalize_first = bool(normalize_first)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        if normalization not in ("layer", "rms"):
            raise ValueError("`normalization` must be 'layer' (LayerNormalization) or 'rms' "
                             f"(RMSNormalization). Received: normalization={normalization!r}")
        self.normalization = normalization
        self.use_bias = bool(use_bias)
        # Bias per projection; None follows `use_bias` (the output: the q/k/v choice).
        self.attention_use_bias = (self.use_bias if attention_use_bias is None
                                   else bool(attention_use_bias))
        self.attention_output_use_bias = (
            self.attention_use_bias if attention_output_use_bias is None
            else bool(attention_output_use_bias))
        self.feed_forward_use_bias = (self.use_bias if feed_forward_use_bias is None
                                      else bool(feed_forward_use_bias))
        self.use_post_attention_norm = bool(use_post_attention_norm)
        self.use_post_ffw_norm = bool(use_post_ffw_norm)
        self.gated_feed_forward = bool(gated_feed_forward)
        self.implementation = compat.implementation_from_config(implementation)
        self.attention_dropout = check_dropout("attention_dropout", attention_dropout)
        # A given attention keeps its own options: these stay the (unused) defaults.
        self.options = (options if self._attention_given
                        else options.for_heads(self.num_heads, self.key_dim))
        self.residual_scale = check_positive_float("residual_scale", residual_scale,
                                                   allow_none=True)
        if not isinstance(use_gate, bool):
            raise ValueError(f"`use_gate` must be a bool. Received: use_gate={use_gate!r}")
        self.use_gate = use_gate
        if not isinstance(use_input_norm, bool):
            raise ValueError("`use_input_norm` must be a bool. "
                             f"Received: use_input_norm={use_input_norm!r}")
        if not use_input_norm and not (self.normalize_first and self.use_post_attention_norm
                                       and self.use_post_ffw_norm):
            # Without its input norm a block keeps only its post norms: a post-LN block
            # (whose one norm is the input norm's slot) or a missing post norm would leave
            # a sublayer unnormalised, which no model does.
            raise ValueError(
                "`use_input_norm=False` (x + N_post(f(x)), OLMo 2's block) needs "
                "`normalize_first=True`, `use_post_attention_norm=True` and "
                "`use_post_ffw_norm=True`. Received: use_input_norm=False, "
                f"normalize_first={self.normalize_first}, use_post_attention_norm="
                f"{self.use_post_attention_norm}, use_post_ffw_norm={self.use_post_ffw_norm}")
        self.use_input_norm = use_input_norm
        if not isinstance(use_feed_forward_norm, bool) or not (
                use_feed_forward_norm or self.normalize_first):
            raise ValueError(
                "`use_feed_forward_norm` must be a bool, and False only in a pre-norm block "
                "(`normalize_first=True`: a post-LN block's norm follows the residual sum). "
                f"Received: use_feed_forward_norm={use_feed_forward_norm!r}, "
                f"normalize_first={self.normalize_first}")
        self.use_feed_forward_norm = use_feed_forward_norm
        if not isinstance(use_attention_input_norm, bool):
            raise ValueError("`use_attention_input_norm` must be a bool. Received: "
                             f"use_attention_input_norm={use_attention_input_norm!r}")
        if not use_attention_input_norm and not self.normalize_first:
            raise ValueError(
                "`use_attention_input_norm=False` (x + attn(x), then x + ffn(N(x)): "
                "ModernBERT's first layer) is a pre-norm block: it needs "
                "`normalize_first=True` (a post-LN block's norm follows the residual). "
                "Received: use_attention_input_norm=False, normalize_first=False")
        self.use_attention_input_norm = use_attention_input_norm
        # Made now (the config holds them before the block is built), and attached as
        # `self_attention` / `feed_forward` in `build`, where the defaults are: the block's
        # weights then come in the default's order (`get_weights`, `set_weights`).
        self._given = GivenSublayers(
            given_sublayer("attention", attention, "self_attention", self.dtype_policy),
            given_sublayer("feed_forward", feed_forward, "feed_forward", self.dtype_policy))
        self.supports_masking = True

    def _head_dim(self, model_dim):
        """`key_dim`, or D // H, which must then divide exactly."""
        if self.key_dim is not None:
            return self.key_dim
        if model_dim % self.num_heads != 0:
            raise ValueError(
                f"The model dimension D={model_dim} (the input's last axis) "
                f"is not divisible by num_heads={self.num_heads}; pass "
                f"`key_dim` explicitly. Received: model_dim={model_dim}, "
                f"num_heads={self.num_heads}"
            )
        return model_dim // self.num_heads

    def _initializers(self):
        return {
            "kernel_initializer": clone_initializer(self.kernel_initializer),
            "bias_initializer": clone_initializer(self.bias_initializer),
        }

    def _attention(self, name, model_dim, query_shape, key_shape, self_attention=True):
        """An attention sublayer; the GQA/RoPE/window/cap/qk-norm options and the gate are
        self-attention's."""
        options = self.options.get_config() if self_attention else {}
        if self_attention and self.use_gate:
            options["use_gate"] = True
        layer = MultiHeadAttention(
            num_heads=self.num_heads,
            key_dim=self._head_dim(model_dim),
            output_dim=model_dim,
            dropout=self.attention_dropout,
            use_bias=self.attention_use_bias,
            output_use_bias=self.attention_output_use_bias,
            implementation=self.implementation,
            dtype=self.dtype_policy,
            name=name,
            **options,
            **self._initializers(),
        )
        layer.build(query_shape, value_shape=key_shape)
        return layer

    def _build_self_attention(self, inputs_shape):
        """`self_attention`, `self_attention_norm`, `self_attention_dropout` (and
        `post_attention_norm` with `use_post_attention_norm`; no `self_attention_norm` with
        `use_input_norm=False` or `use_attention_input_norm=False`)."""
        if self._attention_given:
            self.self_attention = build_given(self._given.attention, inputs_shape)
        else:
            self.self_attention = self._attention(
                "self_attention", inputs_shape[-1], inputs_shape, inputs_shape)
        self.self_attention_norm = (self._input_norm("self_attention_norm", inputs_shape)
                                    if self.use_attention_input_norm else None)
        self.post_attention_norm = self._post_norm(
            self.use_post_attention_norm, "post_attention_norm", inputs_shape)
        self.self_attention_dropout = self._dropout("self_attention_dropout")

    def _build_feed_forward(self, inputs_shape):
        """`feed_forward`, `feed_forward_norm`, `feed_forward_dropout` (and
        `post_feed_forward_norm` with `use_post_ffw_norm`)."""
        if self._feed_forward_given:
            self.feed_forward = build_given(self._given.feed_forward, inputs_shape)
        else:
            self.feed_forward = self._feed_forward(inputs_shape)
        # The parallel block (a decoder's `use_parallel_residual`) reads the self-attention's
        # norm for both branches: it has no norm of its own before the feed-forward.
        self.feed_forward_norm = (
            None if getattr(self, "use_parallel_residual", False) or not
            self.use_feed_forward_norm else self._input_norm("feed_forward_norm", inputs_shape))
        self.post_feed_forward_norm = self._post_norm(
            self.use_post_ffw_norm, "post_feed_forward_norm", inputs_shape)
        self.feed_forward_dropout = self._dropout("feed_forward_dropout")

    def _norm(self, name, input_shape):
        cls = (keras.layers.RMSNormalization if self.normalization == "rms"
               else keras.layers.LayerNormalization)
        layer = cls(epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name=name)
        layer.build(input_shape)
        return layer

    def _input_norm(self, name, input_shape):
        """A norm of a sublayer's input (pre-LN; post-LN: of the residual sum), or None
        with `use_input_norm=False`."""
        return self._norm(name, input_shape) if self.use_input_norm else None

    def _post_norm(self, used, name, input_shape):
        """A norm of a sublayer's output before the residual add, or None."""
        return self._norm(name, input_shape) if used else None

    def _dropout(self, name):
        return keras.layers.Dropout(self.dropout, dtype=self.dtype_policy, name=name)

    def _feed_forward(self, input_shape):
        layer = PositionwiseFeedForward(
            self.intermediate_dim,
            activation=self.activation,
            use_bias=self.feed_forward_use_bias,
            gated=self.gated_feed_forward,
            dtype=self.dtype_policy,
            name="feed_forward",
            **self._initializers(),
        )
        layer.build(input_shape)
        return layer

    def _score_heads(self, attention):
        """The head axis of `attention`'s scores: its `num_heads`, else the block's."""
        return getattr(attention, "num_heads", None) or self.num_heads

    @staticmethod
    def _attention_fn(layer, key, key_mask, attention_mask, causal, training, scores,
                      cache=None, cache_update_index=None, *, bias=None):
        """`x -> (y, scores or None, new cache or None)` of `layer(x, key, ...)`.

        `scores`: whether to ask for the attention weights; `bias`: the additive
        `attention_bias` of the call, or None. Only the arguments
        that apply to this call are passed (the contract in `_sublayers`), so a
        given attention layer need not know what the block does not use.
        """

        def attend(x):
            kwargs = {"use_causal_mask": causal, "training": training}
            extras = {"value": key, "attention_mask": attention_mask, "value_mask": key_mask,
                      "attention_bias": bias}
            kwargs.update({k: v for k, v in extras.items() if v is not None})
            if scores:
                kwargs["return_attention_scores"] = True
            if cache is not None:
                kwargs.update(cache=cache, cache_update_index=cache_update_index)
            result = layer(x, **kwargs)
            result = result if isinstance(result, tuple) else (result,)
            return (result[0], result[1] if scores else None,
                    result[-1] if cache is not None else None)

        return attend

    def _residual(self, x, sublayer, norm, dropout, training, post_norm=None):
        """post-LN: norm(x + s drop(f(x))); pre-LN: x + s drop(f(norm(x))).

        `s` is `residual_scale` (absent when None: no multiplication at all).

        With `post_norm` (the "sandwich" of Gemma 2 and 3, OLMo 2) `f(.)`
        becomes `post_norm(f(.))`. `sublayer` returns `(y, *extras)`
        (scores, caches) or a tensor; returns `(x, extras)`.
        """
        residual = x
        if self.normalize_first and norm is not None:  # None: `use_input_norm=False`
            x = norm(x)
        y = sublayer(x)
        y, extras = (y[0], y[1:]) if isinstance(y, tuple) else (y, ())
        if post_norm is not None:
            y = post_norm(y)
        y = dropout(y, training=training)
        if self.residual_scale is not None:
            # Granite's `residual_multiplier`: x + s * f(.), in the compute dtype.
            y = y * ops.cast(self.residual_scale, y.dtype)
        x = y + residual
        if not self.normalize_first:
            x = norm(x)
        return x, extras

    def compute_output_shape(self, inputs_shape, *args, **kwargs):
        """`(B, T, D)`: the output has the input's shape."""
        return tuple(inputs_shape)

    def get_config(self):
        check_not_quantized(self)
        config = super().get_config()
        config.update({
            "num_heads": self.num_heads,
            "intermediate_dim": self.intermediate_dim,
            "key_dim": self.key_dim,
            "dropout": self.dropout,
            "activation": keras.activations.serialize(self.activation),
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "normalize_first": self.normalize_first,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            **self.options.get_config(),
            "normalization": self.normalization,
            "use_bias": self.use_bias,
            "gated_feed_forward": self.gated_feed_forward,
            "implementation": compat.implementation_config(self.implementation),
            "attention_dropout": self.attention_dropout,
            "attention_use_bias": self.attention_use_bias,
            "attention_output_use_bias": self.attention_output_use_bias,
            "feed_forward_use_bias": self.feed_forward_use_bias,
            "use_post_attention_norm": self.use_post_attention_norm,
            "use_post_ffw_norm": self.use_post_ffw_norm,
        })
        # The new arguments appear only when set, so a default block's config is today's.
        if self._attention_given:
            dropped = FIELDS if self._has_cross_attention else (*FIELDS, *_ATTENTION_ARGUMENTS)
            for key in dropped:
                config.pop(key, None)
            config["attention"] = keras.saving.serialize_keras_object(self._given.attention)
        if self._feed_forward_given:
            for key in _FEED_FORWARD_ARGUMENTS:
                config.pop(key)
            config["feed_forward"] = keras.saving.serialize_keras_object(self._given.feed_forward)
        if self.residual_scale is not None:
            config["residual_scale"] = self.residual_scale
        if not self.use_input_norm:  # absent when True: default configs are today's
            config["use_input_norm"] = False
        if not self.use_feed_forward_norm:  # absent when True, as use_input_norm
            config["use_feed_forward_norm"] = False
        if not self.use_attention_input_norm:  # likewise
            config["use_attention_input_norm"] = False
        if self.use_gate:  # absent when False: older configs load, default configs are today's
            config["use_gate"] = True
        return config
