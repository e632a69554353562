"""The layers inside Keras models: model kinds, masks, saving, training, dtypes."""

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn.testing.weights import randomize_weights, reference_params

from . import reference
from .helpers import assert_close, randn, rng, to_numpy

B, T, D = 3, 6, 8


def _tokens():
    # Row 2 is all padding: every query in it has no key to attend.
    return np.array([[4, 2, 7, 1, 0, 0], [3, 3, 5, 6, 2, 9], [0, 0, 0, 0, 0, 0]], "int32")


def _seq2seq_model(normalize_first=False):
    source = keras.Input((T,), dtype="int32", name="source")
    target = keras.Input((T,), dtype="int32", name="target")
    memory = keras.layers.Embedding(10, D, mask_zero=True)(source)
    memory = keras_attn.TransformerEncoderLayer(
        2, intermediate_dim=16, normalize_first=normalize_first, name="encoder")(memory)
    x = keras.layers.Embedding(10, D, mask_zero=True)(target)
    x = keras_attn.TransformerDecoderLayer(
        2, intermediate_dim=16, normalize_first=normalize_first, name="decoder")(x, memory)
    logits = keras.layers.Dense(10, name="logits")(x)
    return keras.Model([source, target], logits)


# ----------------------------------------------------------------------------
# Model kinds


def test_sequential_model():
    model = keras.Sequential([
        keras.Input((T, D)),
        keras_attn.TransformerEncoderLayer(2, intermediate_dim=16),
        keras_attn.TransformerDecoderLayer(2, intermediate_dim=16),
        keras_attn.PositionwiseFeedForward(12, output_dim=3),
    ])
    out = model.predict(randn(rng(1), B, T, D), verbose=0)
    assert out.shape == (B, T, 3) and np.isfinite(out).all()


def test_functional_model_matches_layer_called_eagerly():
    inputs = keras.Input((None, D))
    layer = keras_attn.MultiHeadAttention(2, 4)
    outputs, scores = layer(inputs, use_causal_mask=True, return_attention_scores=True)
    assert tuple(outputs.shape) == (None, None, D)
    assert tuple(scores.shape) == (None, 2, None, None)
    model = keras.Model(inputs, [outputs, scores])
    randomize_weights(layer, seed=1)
    x = randn(rng(2), B, T, D)
    out, sc = model.predict(x, verbose=0)
    ref_out, ref_scores = reference.multi_head_attention(
        reference_params(layer), x, num_heads=2, is_causal=True)
    assert_close(out, ref_out)
    assert_close(sc, ref_scores)


def test_subclassed_model():
    class Tiny(keras.Model):
        def __init__(self):
            super().__init__()
            self.encoder = keras_attn.TransformerEncoderLayer(2, intermediate_dim=16, normalize_first=True)
            self.head = keras.layers.Dense(1)

        def call(self, x, training=False):
            return self.head(self.encoder(x, training=training))

    model = Tiny()
    x = randn(rng(3), B, T, D)
    out = to_numpy(model(x))
    assert out.shape == (B, T, 1)
    randomize_weights(model.encoder, seed=3)
    expected = reference.encoder_layer(
        reference_params(model.encoder), x, num_heads=2, normalize_first=True)
    assert_close(model.encoder(x), expected)


# ----------------------------------------------------------------------------
# Configs and saving


@pytest.mark.parametrize("make", [
    lambda: keras_attn.MultiHeadAttention(
        3, 4, value_dim=5, output_dim=7, dropout=0.1, use_bias=False, seed=2,
        kernel_initializer="he_normal", kernel_regularizer="l2"),
    lambda: keras_attn.PositionwiseFeedForward(
        9, output_dim=4, activation="gelu", dropout=0.2, use_bias=False),
    lambda: keras_attn.TransformerEncoderLayer(
        2, intermediate_dim=12, key_dim=3, dropout=0.1, activation="gelu", layer_norm_epsilon=1e-6,
        normalize_first=True),
    lambda: keras_attn.TransformerDecoderLayer(4, intermediate_dim=10, dropout=0.2),
], ids=["mha", "ffn", "encoder", "decoder"])
def test_config_round_trip(make):
    layer = make()
    config = layer.get_config()
    clone = type(layer).from_config(config)
    assert clone.get_config() == config
    x = randn(rng(4), B, T, D)
    layer.build(x.shape)
    clone.build(x.shape)
    clone.set_weights(layer.get_weights())
    assert_close(clone(x), to_numpy(layer(x)))


def test_keras_file_round_trip(tmp_path):
    model = _seq2seq_model()
    source, target = _tokens(), np.roll(_tokens(), 1, axis=1)
    expected = model.predict([source, target], verbose=0)
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(loaded.predict([source, target], verbose=0), expected)
    assert isinstance(loaded.get_layer("decoder"), keras_attn.TransformerDecoderLayer)
    assert loaded.get_layer("decoder").has_memory


# ----------------------------------------------------------------------------
# Keras masks


def test_embedding_mask_equals_explicit_padding_mask():
    tokens = _tokens()
    embed = keras.layers.Embedding(10, D, mask_zero=True)
    encoder = keras_attn.TransformerEncoderLayer(2, intermediate_dim=16)

    inputs = keras.Input((T,), dtype="int32")
    model = keras.Model(inputs, encoder(embed(inputs)))
    randomize_weights(encoder, seed=5)
    via_keras_mask = model.predict(tokens, verbose=0)

    vectors = embed(tokens)
    explicit = to_numpy(encoder(to_numpy(vectors), padding_mask=tokens != 0))
    real = tokens != 0
    assert_close(via_keras_mask[real], explicit[real])
    # And both equal the reference with that padding.
    expected = reference.encoder_layer(
        reference_params(encoder), to_numpy(vectors), num_heads=2, padding_mask=real)
    assert_close(explicit, expected)


def test_mha_uses_key_mask_and_keeps_query_mask():
    tokens = _tokens()[:2]
    query = keras.layers.Embedding(10, D, mask_zero=True)(tokens)
    layer = keras_attn.MultiHeadAttention(2, 4)
    out, scores = layer(query, return_attention_scores=True)
    scores = to_numpy(scores)
    # Padded keys get exactly zero weight; the output carries the query's mask.
    assert (scores[0, :, :, 4:] == 0).all()
    assert (scores[0, :, :, :4] > 0).all()
    out_mask = keras.src.backend.get_keras_mask(out)  # Keras has no public getter
    np.testing.assert_array_equal(to_numpy(out_mask), tokens != 0)


# ----------------------------------------------------------------------------
# Training


@pytest.mark.requires_trainable_backend
def test_fit_with_all_padding_row_keeps_weights_finite():
    model = _seq2seq_model(normalize_first=True)
    model.compile(keras.optimizers.Adam(1e-2),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    source, target = _tokens(), np.roll(_tokens(), 1, axis=1)
    before = [to_numpy(w).copy() for w in model.trainable_weights]
    history = model.fit([source, target], source, epochs=2, batch_size=3, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    after = [to_numpy(w) for w in model.trainable_weights]
    assert all(np.isfinite(w).all() for w in after)
    assert any(not np.array_equal(a, b) for a, b in zip(before, after)), "nothing trained"


@pytest.mark.requires_trainable_backend
def test_fit_reduces_loss():
    g = rng(6)
    x = randn(g, 32, T, D)
    y = x.sum(axis=-1, keepdims=True)
    model = keras.Sequential([
        keras.Input((T, D)),
        keras_attn.TransformerEncoderLayer(2, intermediate_dim=16, normalize_first=True),
        keras.layers.Dense(1),
    ])
    model.compile(keras.optimizers.Adam(1e-2), "mse")
    first = model.evaluate(x, y, verbose=0)
    model.fit(x, y, epochs=5, batch_size=8, verbose=0)
    assert model.evaluate(x, y, verbose=0) < first


def test_training_flag_switches_dropout():
    x = randn(rng(7), B, T, D)
    layer = keras_attn.TransformerEncoderLayer(2, intermediate_dim=16, dropout=0.5)
    inference_a = to_numpy(layer(x, training=False))
    inference_b = to_numpy(layer(x))
    train = to_numpy(layer(x, training=True))
    np.testing.assert_array_equal(inference_a, inference_b)
    assert not np.allclose(train, inference_a)


def test_mha_attention_dropout_only_in_training():
    x = randn(rng(8), B, T, D)
    layer = keras_attn.MultiHeadAttention(2, 4, dropout=0.5, seed=1)
    a, b = to_numpy(layer(x)), to_numpy(layer(x, training=False))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(to_numpy(layer(x, training=True)), a)


# ----------------------------------------------------------------------------
# Mixed precision


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_large_activations_are_finite(policy):
    keras.config.set_dtype_policy(policy)
    compute = policy.split("_")[1]
    tokens = _tokens()
    model = _seq2seq_model(normalize_first=True)
    for layer in ("encoder", "decoder"):
        randomize_weights(model.get_layer(layer), seed=9, scale=2.0)
    out = model([tokens, tokens])
    assert keras.backend.standardize_dtype(out.dtype) == compute
    assert np.isfinite(to_numpy(out).astype("float32")).all()
    for weight in model.weights:
        assert keras.backend.standardize_dtype(weight.dtype) == "float32"
    # Projections of about +-500 stay inside float16's range (65504), but their
    # dot products (logits of order 1e5) would overflow it: the core computes
    # logits and softmax in float32.
    mha = keras_attn.MultiHeadAttention(2, 4)
    big = randn(rng(9), B, T, D) * 300
    out, scores = mha(big, return_attention_scores=True)
    assert keras.backend.standardize_dtype(out.dtype) == compute
    assert np.isfinite(to_numpy(out).astype("float32")).all()
    assert np.isfinite(to_numpy(scores).astype("float32")).all()


# ----------------------------------------------------------------------------
# Decoder memory contract


def test_decoder_memory_contract():
    x, memory = randn(rng(10), B, T, D), randn(rng(11), B, 4, D)
    decoder_only = keras_attn.TransformerDecoderLayer(2, intermediate_dim=8)
    decoder_only(x)
    with pytest.raises(ValueError, match="built without `memory`.*Received: memory.shape"):
        decoder_only(x, memory)
    cross = keras_attn.TransformerDecoderLayer(2, intermediate_dim=8)
    cross(x, memory)
    with pytest.raises(ValueError, match="Received: memory=None"):
        cross(x)
