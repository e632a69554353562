"""Every public layer through Keras's own layer-test harness, `run_layer_test`.

Keras checks its layers with `keras.src.testing.TestCase.run_layer_test`: the
weight counts, `get_config` / `from_config` and JSON round trips, symbolic
against eager calls (output shapes and dtypes), a training step, and the mixed
precision policies. The same harness runs here, for each layer and each
family of options, on every backend.
"""

import keras
import pytest
from keras.src.testing import TestCase

import keras_attn

BACKEND = keras.backend.backend()
TRAINS = BACKEND != "numpy"

# (layer class, constructor kwargs, input shapes, expected output shape, trainable weights)
CASES = {
    "mha": (keras_attn.MultiHeadAttention, dict(num_heads=2, key_dim=4),
            {"query_shape": (2, 5, 8)}, (2, 5, 8), 8),
    "mha_cross": (keras_attn.MultiHeadAttention,
                  dict(num_heads=2, key_dim=4, value_dim=3, output_dim=6),
                  {"query_shape": (2, 5, 8), "value_shape": (2, 7, 10)}, (2, 5, 6), 8),
    "mha_modern": (keras_attn.MultiHeadAttention,
                   dict(num_heads=4, key_dim=4, num_key_value_heads=2,
                        rope_max_wavelength=1e4, sliding_window=3, logit_soft_cap=20.0,
                        qk_norm="rms", use_bias=False),
                   {"query_shape": (2, 5, 8)}, (2, 5, 8), 6),
    "feed_forward": (keras_attn.PositionwiseFeedForward,
                     dict(intermediate_dim=16, activation="silu", gated=True),
                     {"input_shape": (2, 5, 8)}, (2, 5, 8), 6),
    "encoder": (keras_attn.TransformerEncoderLayer,
                dict(num_heads=2, intermediate_dim=16, normalize_first=True),
                {"inputs_shape": (2, 5, 8)}, (2, 5, 8), 16),
    "decoder_only": (keras_attn.TransformerDecoderLayer,
                     dict(num_heads=2, intermediate_dim=16, num_key_value_heads=1,
                          rope_max_wavelength=1e4, normalization="rms",
                          gated_feed_forward=True, use_bias=False),
                     {"inputs_shape": (2, 5, 8)}, (2, 5, 8), 9),
    "rotary": (keras_attn.RotaryEmbedding, dict(max_wavelength=100.0, interleaved=True),
               {"inputs_shape": (2, 5, 3, 4)}, (2, 5, 3, 4), 0),
}


class _Harness(TestCase):
    def runTest(self):  # a TestCase instance needs one test method
        pass


@pytest.mark.filterwarnings("ignore:`shuffle=True` was passed")  # the harness's own fit call
@pytest.mark.parametrize("name", sorted(CASES))
def test_keras_run_layer_test(name):
    cls, kwargs, shapes, output_shape, weights = CASES[name]
    harness = _Harness()
    harness.run_layer_test(
        cls, init_kwargs=kwargs,
        input_shape=shapes if len(shapes) > 1 else next(iter(shapes.values())),
        expected_output_shape=output_shape,
        expected_num_trainable_weights=weights,
        expected_num_non_trainable_weights=0,
        supports_masking=True,
        run_training_check=TRAINS and len(shapes) == 1,  # as Keras tests its own MHA
    )
