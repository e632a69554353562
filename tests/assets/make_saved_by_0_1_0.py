"""Write `saved_by_0_1_0.keras` and `.npz`: a model saved by keras_attn 0.1.0 (main, 2026-12-01).

Run once, under JAX, from the repository root, with the code of the release whose files
the test must keep loading (this file was run on main at the commit that added it,
before the renovation of the package's layout):

    KERAS_BACKEND=jax python tests/assets/make_saved_by_0_1_0.py

The model holds every public layer with every option it had then (GQA, RoPE in both
forms, sliding window, soft-cap, qk-norm, pre- and post-LN, RMS norms, gated
feed-forward, cross-attention), its weights random and far from identity. The `.npz`
stores the inputs, the outputs that this backend computed and the weights' paths; `tests/test_saved_files.py`
loads the `.keras` file under every backend and compares.
"""

import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_attn  # noqa: E402
from keras_attn.testing.weights import randomize_weights  # noqa: E402

B, T, S, D, H = 2, 6, 5, 16, 4
HERE = os.path.dirname(os.path.abspath(__file__))


def build():
    x_in = keras.Input((T, D), name="x")
    memory_in = keras.Input((S, D), name="memory")
    x = keras_attn.MultiHeadAttention(
        H, 4, num_key_value_heads=2, rope_max_wavelength=100.0, sliding_window=3,
        logit_soft_cap=5.0, qk_norm="rms", name="mha")(x_in, use_causal_mask=True)
    memory = keras_attn.TransformerEncoderLayer(
        H, intermediate_dim=24, normalize_first=True, normalization="rms",
        gated_feed_forward=True, activation="silu", use_bias=False, name="encoder")(memory_in)
    y = keras_attn.TransformerDecoderLayer(
        H, intermediate_dim=24, num_key_value_heads=1, rope_max_wavelength=1e4,
        rope_interleaved=True, rope_scaling_factor=2.0, qk_norm="layer",
        name="decoder")(x, memory)
    y = keras_attn.PositionwiseFeedForward(20, activation="gelu", name="ffn")(y)
    rotated = keras_attn.RotaryEmbedding(max_wavelength=50.0, name="rope")(
        keras.layers.Reshape((T, 4, 4))(y))
    out = keras.layers.Reshape((T, D))(rotated)
    return keras.Model([x_in, memory_in], out)


def main():
    model = build()
    for layer in model.layers:
        randomize_weights(layer, seed=len(layer.name), scale=0.25)  # activations O(1)
    g = np.random.default_rng(0)
    x = g.standard_normal((B, T, D)).astype("float32")
    memory = g.standard_normal((B, S, D)).astype("float32")
    out = keras.ops.convert_to_numpy(model([x, memory]))
    model.save(os.path.join(HERE, "saved_by_0_1_0.keras"))
    np.savez(os.path.join(HERE, "saved_by_0_1_0.npz"), x=x, memory=memory, output=out,
             backend=np.array(keras.backend.backend()),
             weight_paths=np.array([w.path for w in model.weights]))
    print("saved; output std", out.std())


if __name__ == "__main__":
    main()
