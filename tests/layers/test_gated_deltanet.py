"""`keras_attn.layers.GatedDeltaNet` against transformers' `Qwen3_5GatedDeltaNet` (random
weights std 0.35, A_log and dt_bias random too, float32) and the float64 reference
(keras_attn.testing.delta_reference), uncached (chunked) and token by token with its
`RecurrentCache`.

Sizes: B = 2, T = 7, D = 16, H_k = 1 query/key head of d_k = 4 serving H = 2 value heads of
d_v = 3, kernel K = 4, chunks of 3 (do not divide T).
"""

import keras
import numpy as np
import pytest

from keras_attn import observe_paths
from keras_attn.layers.gated_deltanet import GatedDeltaNet
from keras_attn.recurrent_cache import RecurrentCache
from keras_attn.testing import delta_reference as ref

from ..helpers import assert_close

B, T, D = 2, 7, 16
SIZES = dict(linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=4,
             linear_value_head_dim=3, linear_conv_kernel_dim=4)
TOLERANCE = 1e-5  # relative, to the largest |transformers output|

# The forward numerics are keras.ops written once: they run on torch and numpy (the CI
# budget); JAX and TensorFlow run the .keras reload against the float64 reference (that test below).
cheap_backends = pytest.mark.skipif(keras.backend.backend() in ("jax", "tensorflow"),
                                    reason="forward numerics checked on torch and numpy")



def _weights(seed=0):
    """Keras-layout weights, std 0.35 (A_log, dt_bias, the norm's scale random too)."""
    rng = np.random.default_rng(seed)
    conv_dim = 2 * 4 + 2 * 3

    def r(*shape):
        return (0.35 * rng.normal(size=shape)).astype("float32")

    return {"in_proj_qkv": r(D, conv_dim), "in_proj_z": r(D, 6), "in_proj_b": r(D, 2),
            "in_proj_a": r(D, 2), "conv1d": r(conv_dim, 4), "dt_bias": r(2),
            "A_log": r(2), "norm": 1 + r(3), "out_proj": r(6, D)}


def _layer(w, **kwargs):
    layer = GatedDeltaNet(**SIZES, chunk_size=3, **kwargs)
    layer.build((None, None, D))
    for name in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"):
        getattr(layer, name).kernel.assign(w[name])
    layer.conv1d_kernel.assign(w["conv1d"])
    layer.dt_bias.assign(w["dt_bias"])
    layer.A_log.assign(w["A_log"])
    layer.norm_scale.assign(w["norm"])
    return layer


def _inputs(seed=1):
    return np.random.default_rng(seed).normal(size=(B, T, D)).astype("float32")


def _reference(w, x, **ablation):
    """The float64 reference's output; the conv kernel to its `(K, C)` layout."""
    return ref.gated_delta_net(x, {**w, "conv1d": w["conv1d"].T}, (1, 2, 4, 3), **ablation)[0]


def _relative(out, expected):
    return float(np.abs(np.asarray(out, np.float64) - expected).max() / np.abs(expected).max())


def _token_by_token(layer, x, prefill):
    cache, rows = layer.empty_cache(B), []
    for start, stop in [(0, prefill)] + [(t, t + 1) for t in range(prefill, T)]:
        out, cache = layer(x[:, start:stop], cache=cache)
        rows.append(keras.ops.convert_to_numpy(out))
    return np.concatenate(rows, 1), cache


@cheap_backends
def test_uncached_and_cached_match_the_float64_reference():
    w, x = _weights(), _inputs()
    layer = _layer(w)
    expected, (conv, state) = ref.gated_delta_net(x, {**w, "conv1d": w["conv1d"].T}, (1, 2, 4, 3))
    with observe_paths() as taken:
        assert_close(layer(x), expected, what="uncached")
        cached, cache = _token_by_token(layer, x, prefill=4)
    assert taken == {"chunked": 2, "recurrent": T - 4}
    assert_close(cached, expected, what="token by token")
    assert_close(cache.recurrent_state, state, what="recurrent state")
    assert_close(np.swapaxes(keras.ops.convert_to_numpy(cache.conv_state), 1, 2), conv,
                 what="conv state")


@cheap_backends
def test_prefill_in_chunks_then_tokens_equals_the_whole_prompt():
    w, x = _weights(2), _inputs(3)
    layer = _layer(w)
    whole, whole_cache = layer(x, cache=layer.empty_cache(B))
    cache, rows = layer.empty_cache(B), []
    for start, stop in ((0, 2), (2, 5), (5, 6), (6, 7)):  # two prefill chunks, two tokens
        out, cache = layer(x[:, start:stop], cache=cache)
        rows.append(keras.ops.convert_to_numpy(out))
    assert_close(np.concatenate(rows, 1), keras.ops.convert_to_numpy(whole), against="uncached")
    for a, b in zip(cache, whole_cache):
        assert_close(a, keras.ops.convert_to_numpy(b), against="uncached")


@cheap_backends
def test_ablations_move_the_output_far_past_the_tolerance():
    """Decay removed (g = 0) or the beta gate at 1: the reference moves far past the 1e-5
    tolerance from the layer's output, which it matches un-ablated."""
    w, x = _weights(), _inputs()
    out = keras.ops.convert_to_numpy(_layer(w)(x))
    assert _relative(out, _reference(w, x)) < TOLERANCE
    for ablation in (dict(decay=False), dict(beta_gate=False)):
        assert _relative(out, _reference(w, x, **ablation)) > 1e-2, ablation


@pytest.fixture(scope="module")
def transformers_layer():
    torch = pytest.importorskip("torch")
    qwen = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig

    config = Qwen3_5TextConfig(hidden_size=D, num_hidden_layers=1,
                               layer_types=["linear_attention"], rms_norm_eps=1e-6,
                               **{k: v for k, v in SIZES.items()})
    torch.manual_seed(0)
    module = qwen.Qwen3_5GatedDeltaNet(config, layer_idx=0).eval()
    w = _weights(4)
    with torch.no_grad():
        for name in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"):
            getattr(module, name).weight.copy_(torch.tensor(w[name].T))
        module.conv1d.weight.copy_(torch.tensor(w["conv1d"][:, None, :]))
        module.dt_bias.copy_(torch.tensor(w["dt_bias"]))
        module.A_log.copy_(torch.tensor(w["A_log"]))
        module.norm.weight.copy_(torch.tensor(w["norm"]))
    x = _inputs(5)
    with torch.no_grad():
        expected = module(torch.tensor(x)).numpy().astype(np.float64)
    return w, x, expected


@cheap_backends
def test_matches_transformers_uncached_and_token_by_token(transformers_layer):
    w, x, expected = transformers_layer
    layer = _layer(w)
    with observe_paths() as taken:
        uncached = keras.ops.convert_to_numpy(layer(x))
        cached, _ = _token_by_token(layer, x, prefill=3)
    assert taken == {"chunked": 2, "recurrent": T - 3}
    assert _relative(uncached, expected) < TOLERANCE, _relative(uncached, expected)
    assert _relative(cached, expected) < TOLERANCE, _relative(cached, expected)


@cheap_backends
def test_config_round_trip_and_bad_arguments():
    layer = GatedDeltaNet(**SIZES, chunk_size=3)
    again = GatedDeltaNet.from_config(layer.get_config())
    assert again.get_config() == layer.get_config()
    with pytest.raises(ValueError, match="linear_num_value_heads=3"):
        GatedDeltaNet(2, 3, 4, 3)
    with pytest.raises(ValueError, match="chunk_size=0"):
        GatedDeltaNet(**SIZES, chunk_size=0)
    layer.build((None, None, D))
    with pytest.raises(ValueError, match="cache.recurrent_state"):
        layer(_inputs(), cache=RecurrentCache.empty(B, 14, 4, 2, 4, 5))


@cheap_backends
def test_state_bytes_do_not_grow_with_the_sequence():
    layer = GatedDeltaNet(**SIZES)
    layer.build((None, None, D))
    # conv C (K - 1) = 14 * 3, state H d_k d_v = 2 * 4 * 3: 66 float32 numbers per sequence.
    assert layer.cache_bytes_per_sequence() == 4 * (14 * 3 + 2 * 4 * 3)


def test_saved_file_reloads_to_the_same_numbers(tmp_path):
    """A `.keras` file of a model around the layer reloads (config, weights) to the same
    output; this is the test to run under JAX and TensorFlow."""
    w, x = _weights(6), _inputs(7)
    inputs = keras.Input((T, D))
    model = keras.Model(inputs, _layer(w)(inputs))
    path = tmp_path / "gated_deltanet.keras"
    model.save(path)
    again = keras.saving.load_model(path)
    # predict: one compiled program (JAX compiles each eager op once per shape).
    assert_close(again.predict(x, verbose=0), _reference(w, x), what="reloaded")
