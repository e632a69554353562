"""Exporting models that hold these layers, with dynamic batch and length dims.

- TensorFlow: `model.export(..., format="tf_saved_model")`, reloaded with
  `tf.saved_model.load` (the tensorflow environment).
- JAX: `model.export` goes through jax2tf with polymorphic shapes; it needs
  TensorFlow too, so it runs in the `parity` tox environment (which has both;
  `tox -e export-jax` runs it alone).
- PyTorch: `torch.export.export` with `Dim`s for batch and length (the
  torch environment).

Each exported program is called on a batch size and a length other than
the ones it was traced with, and must match the model's own predictions.
"""

import keras
import pytest

import keras_attn
from keras_attn.testing.weights import randomize_weights

from .helpers import assert_close, randn, rng

BACKEND = keras.backend.backend()
D = 8


def _model(layer_kind):
    """A model over `(B, T, D)` inputs (B and T unknown) holding one layer kind."""
    x = keras.Input((None, D), name="x")
    if layer_kind == "mha":
        layer = keras_attn.MultiHeadAttention(2, 4, name="layer")
        y = layer(x, use_causal_mask=True)
    elif layer_kind == "encoder":
        layer = keras_attn.TransformerEncoderLayer(2, intermediate_dim=16, name="layer")
        y = layer(x)
    elif layer_kind == "decoder":
        layer = keras_attn.TransformerDecoderLayer(2, intermediate_dim=16, name="layer")
        y = layer(x)
    else:
        layer = keras_attn.PositionwiseFeedForward(16, name="layer")
        y = layer(x)
    model = keras.Model(x, y)
    randomize_weights(layer, seed=0)
    return model


KINDS = ["mha", "encoder", "decoder", "ffn"]


@pytest.mark.parametrize("kind", KINDS)
def test_saved_model_export_with_dynamic_dims(kind, tmp_path):
    if BACKEND not in ("tensorflow", "jax"):
        pytest.skip("model.export (SavedModel) runs on the TensorFlow and JAX backends")
    tf = pytest.importorskip("tensorflow")
    model = _model(kind)
    path = str(tmp_path / "exported")
    model.export(path, format="tf_saved_model", verbose=False)
    reloaded = tf.saved_model.load(path)
    for shape in [(3, 5, D), (1, 9, D)]:
        x = randn(rng(sum(shape)), *shape)
        assert_close(reloaded.serve(x).numpy(), model.predict_on_batch(x),
                     what=f"{kind} exported, input {shape}")


@pytest.mark.skipif(BACKEND != "torch", reason="torch.export")
@pytest.mark.parametrize("kind", KINDS)
def test_torch_export_with_dynamic_dims(kind):
    import torch

    model = _model(kind)
    example = torch.tensor(randn(rng(1), 2, 6, D))
    batch, length = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("length", min=2,
                                                                                max=512)
    # A Keras model's forward is `forward(*args)`: the dynamic shapes nest one level deeper.
    exported = torch.export.export(model, (example,), dynamic_shapes=(({0: batch, 1: length},),))
    for shape in [(3, 5, D), (1, 9, D)]:
        x = randn(rng(sum(shape)), *shape)
        out = exported.module()(torch.tensor(x)).detach().numpy()
        assert_close(out, model.predict_on_batch(x), what=f"{kind} torch.export, input {shape}")
