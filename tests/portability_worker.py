"""Subprocess helper of test_portability: save or load a model on one backend.

    python tests/portability_worker.py save DIR     # model.keras, model.weights.h5
    python tests/portability_worker.py load DIR...  # prints JSON figures

Run with KERAS_BACKEND set. Loading checks both formats against the saving
backend's predictions and against the float64 reference computed from the
loaded weights.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_attn  # noqa: E402
from keras_attn.testing import reference  # noqa: E402
from keras_attn.testing.tolerances import tolerance  # noqa: E402
from keras_attn.testing.weights import randomize_weights, reference_params  # noqa: E402

B, T, S, D = 2, 4, 5, 8


def build_model():
    # A fixed batch size: with a None batch dim the JAX backend traces symbolic
    # dims that keras_attn._validation.static_shape cannot int() (see report).
    x = keras.Input((T, D), batch_size=B, name="x")
    memory = keras.Input((S, D), batch_size=B, name="memory")
    h = keras_attn.TransformerEncoderLayer(2, intermediate_dim=16, name="encoder")(memory)
    y = keras_attn.TransformerDecoderLayer(2, intermediate_dim=16, normalize_first=True, name="decoder")(
        x, memory=h)
    y = keras_attn.MultiHeadAttention(2, 3, name="attention")(y, h)
    out = keras_attn.PositionwiseFeedForward(12, activation="gelu", name="head")(y)
    return keras.Model([x, memory], out, name="portable")


def inputs():
    g = np.random.default_rng(7)
    return [g.standard_normal((B, T, D)).astype("float32"),
            g.standard_normal((B, S, D)).astype("float32")]


def reference_predict(model, x, memory):
    enc, dec, att, head = (model.get_layer(n) for n in ("encoder", "decoder", "attention",
                                                        "head"))
    h = reference.encoder_layer(reference_params(enc), memory, num_heads=2)
    y = reference.decoder_layer(reference_params(dec), x, num_heads=2, memory=h,
                                normalize_first=True)
    y = reference.multi_head_attention(reference_params(att), y, h, num_heads=2)[0]
    return reference.feed_forward(reference_params(head), y, "gelu")


def predict(model):
    return np.asarray(keras.ops.convert_to_numpy(model(inputs())), np.float64)


def save(directory):
    os.makedirs(directory, exist_ok=True)
    model = build_model()
    for i, layer in enumerate(model.layers):
        randomize_weights(layer, seed=100 + i)
    model.save(os.path.join(directory, "model.keras"))
    model.save_weights(os.path.join(directory, "model.weights.h5"))
    np.save(os.path.join(directory, "prediction.npy"), predict(model))
    with open(os.path.join(directory, "backend.txt"), "w") as f:
        f.write(keras.backend.backend())


def load(directory):
    saved = np.load(os.path.join(directory, "prediction.npy"))
    with open(os.path.join(directory, "backend.txt")) as f:
        saver = f.read()
    figures = {"saved_on": saver, "loaded_on": keras.backend.backend()}
    whole = keras.saving.load_model(os.path.join(directory, "model.keras"))
    fresh = build_model()
    fresh.load_weights(os.path.join(directory, "model.weights.h5"))
    for fmt, model in (("keras", whole), ("weights_h5", fresh)):
        out = predict(model)
        ref = reference_predict(model, *inputs())
        shape_ok = out.shape == saved.shape == ref.shape
        figures[fmt] = {
            "shape_ok": shape_ok,
            "vs_saved": float(np.max(np.abs(out - saved))) if shape_ok else None,
            "vs_reference": float(np.max(np.abs(out - ref))) if shape_ok else None,
            # allclose is False for any NaN, so a non-finite prediction fails.
            "ok": shape_ok and bool(np.allclose(out, saved, **tolerance("float32"))
                                    and np.allclose(out, ref, **tolerance("float32"))),
        }
    return figures


if __name__ == "__main__":
    command, *dirs = sys.argv[1:]
    if command == "save":
        save(dirs[0])
    else:
        print(json.dumps([load(d) for d in dirs]))
