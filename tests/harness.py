"""The layer-test harness: one table of layer cases, and the checks each case gets.

`tests/layers/test_layer_harness.py` runs every case of `CASES` through the same checks:

- Keras's own `run_layer_test` (weight counts, config and JSON round trips, symbolic
  against eager calls, a training step, the mixed-precision policies), for the cases
  that give it their input shapes;
- the float64 reference (`keras_attn.testing.reference`), with randomised weights far
  from identity, and the attention path observed while the layer runs;
- a `.keras` round trip: the reloaded model predicts the same;
- cached = uncached, for the cases with a key/value cache: a prefill then one-token
  steps give the rows of one uncached forward.

A case is data: the layer it builds, the arrays it is called with, and the reference
it is checked against. A new layer (or a new family of options) gets every check by
adding a case. Shapes come from `tests/shapes.py`, so that JAX compiles each once.
"""

import dataclasses
from collections.abc import Callable

import keras
import numpy as np

import keras_attn
from keras_attn.testing.weights import randomize_weights

from . import reference, shapes
from .helpers import randn, rng

B, T, S, D = shapes.B, shapes.T, shapes.S, shapes.D


@dataclasses.dataclass(frozen=True)
class LayerCase:
    """One layer under test.

    Attributes:
        cls, kwargs: the layer class and its constructor arguments.
        inputs: `seed -> {name: array}`, the call's tensors (keyword arguments).
        call: the call's other keyword arguments (flags).
        reference: `(params, inputs) -> float64 output`, `params` the layer's weights
            as `reference_params` gives them.
        keras_shapes: `run_layer_test`'s `input_shape` (a shape, or a dict of them), or
            None to leave the case out of that check.
        expected_shape, trainable_weights: what `run_layer_test` checks.
        cache: None, or how a cached call is made: "mha" (`cache=`,
            `cache_update_index=`) or "block" (`self_attention_cache=` ...).
    """

    cls: type
    kwargs: dict
    inputs: Callable
    reference: Callable | None
    call: dict = dataclasses.field(default_factory=dict)
    keras_shapes: object = None
    expected_shape: tuple = ()
    trainable_weights: int = 0
    cache: str | None = None
    attends: bool = True  # False: a layer with no attention (no path to observe)
    non_trainable_weights: int = 0  # what `run_layer_test` checks

    def build(self, seed=0):
        """The layer, built for `inputs(seed)` and with randomised weights."""
        layer = self.cls(**self.kwargs)
        arrays = self.inputs(seed)
        layer.build(*(arrays[name].shape for name in arrays))
        randomize_weights(layer, seed=seed + 1)
        return layer, arrays


def _padding(lengths, length):
    return np.arange(length)[None, :] < np.asarray(lengths)[:, None]


def _self(width):
    return lambda seed: {"query": randn(rng(seed), B, T, width)}


def _mha_reference(num_heads, **options):
    def expected(params, arrays, is_causal=False):
        query = arrays["query"]
        value = arrays.get("value", query)
        return reference.multi_head_attention(params, query, value, value, num_heads=num_heads,
                                              is_causal=is_causal, **options)[0]
    return expected


_MODERN = dict(num_key_value_heads=2, rope_max_wavelength=1e4, sliding_window=3,
               logit_soft_cap=20.0, qk_norm="rms")

_LATENT = dict(num_heads=2, kv_lora_rank=6, qk_nope_head_dim=4, qk_rope_head_dim=2,
               v_head_dim=3, q_lora_rank=5, rope_max_wavelength=100.0, rope_type="yarn",
               rope_scaling_factor=4.0, rope_original_max_position_embeddings=4,
               rope_mscale=1.0, rope_mscale_all_dim=0.5, scale=0.5)

CASES = {
    "mha": LayerCase(
        keras_attn.MultiHeadAttention, dict(num_heads=2, key_dim=4), _self(D),
        _mha_reference(2), keras_shapes={"query_shape": (B, T, D)},
        expected_shape=(B, T, D), trainable_weights=8),
    "mha_cross": LayerCase(
        keras_attn.MultiHeadAttention, dict(num_heads=2, key_dim=4, value_dim=3, output_dim=6),
        lambda seed: {"query": randn(rng(seed), B, T, D), "value": randn(rng(seed + 7), B, S, 10)},
        _mha_reference(2), keras_shapes={"query_shape": (B, T, D), "value_shape": (B, S, 10)},
        expected_shape=(B, T, 6), trainable_weights=8),
    "gqa_modern": LayerCase(
        keras_attn.MultiHeadAttention, dict(num_heads=4, key_dim=4, use_bias=False, **_MODERN),
        _self(D), lambda params, arrays: _mha_reference(4, **_MODERN)(params, arrays, True),
        call=dict(use_causal_mask=True), keras_shapes={"query_shape": (B, T, D)},
        expected_shape=(B, T, D), trainable_weights=6, cache="mha"),
    "encoder": LayerCase(
        keras_attn.TransformerEncoderLayer,
        dict(num_heads=2, intermediate_dim=16, normalize_first=True),
        lambda seed: {"inputs": randn(rng(seed), B, T, D)},
        lambda params, arrays: reference.encoder_layer(
            params, arrays["inputs"], num_heads=2, normalize_first=True),
        keras_shapes={"inputs_shape": (B, T, D)}, expected_shape=(B, T, D),
        trainable_weights=16),
    "decoder_with_memory": LayerCase(
        keras_attn.TransformerDecoderLayer, dict(num_heads=2, intermediate_dim=16),
        lambda seed: {"inputs": randn(rng(seed), B, T, D), "memory": randn(rng(seed + 7), B, S, D)},
        lambda params, arrays: reference.decoder_layer(
            params, arrays["inputs"], num_heads=2, memory=arrays["memory"])),
    "decoder_only": LayerCase(
        keras_attn.TransformerDecoderLayer,
        dict(num_heads=2, intermediate_dim=16, num_key_value_heads=1, rope_max_wavelength=1e4,
             normalization="rms", gated_feed_forward=True, activation="silu",
             use_bias=False, normalize_first=True),
        lambda seed: {"inputs": randn(rng(seed), B, T, D)},
        lambda params, arrays: reference.decoder_layer(
            params, arrays["inputs"], num_heads=2, normalize_first=True,
            activation_name="silu", attention_options=dict(
                num_key_value_heads=1, rope_max_wavelength=1e4)),
        keras_shapes={"inputs_shape": (B, T, D)}, expected_shape=(B, T, D),
        trainable_weights=9, cache="block"),
    # Multi-head latent attention (DeepSeek V3): low-rank queries, yarn RoPE with mscale.
    "latent": LayerCase(
        keras_attn.MultiHeadLatentAttention, dict(_LATENT),
        _self(D), lambda params, arrays: reference.multi_head_latent_attention(
            params, arrays["query"], is_causal=True, **_LATENT)[0],
        call=dict(use_causal_mask=True), keras_shapes={"query_shape": (B, T, D)},
        expected_shape=(B, T, D), trainable_weights=7, cache="mha"),
    "feed_forward": LayerCase(
        keras_attn.PositionwiseFeedForward, dict(intermediate_dim=16, activation="silu", gated=True),
        lambda seed: {"inputs": randn(rng(seed), B, T, D)},
        lambda params, arrays: reference.feed_forward(params, arrays["inputs"], "silu"),
        keras_shapes={"input_shape": (B, T, D)}, expected_shape=(B, T, D), trainable_weights=6,
        attends=False),
    # The mixture of experts has its own references (tests/layers/test_mixture_of_experts.py).
    "mixture_of_experts": LayerCase(
        keras_attn.MixtureOfExperts, dict(num_experts=4, num_experts_per_tok=2,
                                          intermediate_dim=6),
        lambda seed: {"inputs": randn(rng(seed), B, T, D)}, None,
        keras_shapes={"input_shape": (B, T, D)}, expected_shape=(B, T, D), trainable_weights=4,
        attends=False),
    # DeepSeek V3's routing (8 experts, sparse) with a shared expert: its correction bias is
    # the one non-trainable weight (references: tests/layers/test_moe_deepseek.py).
    "mixture_of_experts_deepseek": LayerCase(
        keras_attn.MixtureOfExperts, dict(num_experts=8, num_experts_per_tok=2,
                                          intermediate_dim=6, norm_topk_prob=True,
                                          routing="sigmoid_group_topk", n_group=4,
                                          topk_group=2, routed_scaling_factor=2.5,
                                          shared_intermediate_dim=6),
        lambda seed: {"inputs": randn(rng(seed), B, T, D)}, None,
        keras_shapes={"input_shape": (B, T, D)}, expected_shape=(B, T, D), trainable_weights=7,
        attends=False, non_trainable_weights=1),
    # RoPE has its own references (tests/layers/test_rotary_types.py); here Keras's checks only.
    "rotary": LayerCase(
        keras_attn.RotaryEmbedding, dict(max_wavelength=100.0, interleaved=True),
        lambda seed: {"inputs": randn(rng(seed), B, T, 3, 4)}, None,
        keras_shapes={"inputs_shape": (B, T, 3, 4)}, expected_shape=(B, T, 3, 4),
        attends=False),
}


def functional_model(layer, arrays, call):
    """A `keras.Model` around `layer` with one `keras.Input` per array (for saving)."""
    inputs = {name: keras.Input(a.shape[1:], name=name) for name, a in arrays.items()}
    return keras.Model(inputs, layer(**inputs, **call))
