"""Write the reference files that notebook 01 checks other backends against.

Run once, under JAX, from this folder:

    KERAS_BACKEND=jax python make_quickstart_reference.py

It trains the quickstart classifier (the same data and model as
`01_quickstart.ipynb`) for one epoch, saves it as `quickstart_reference.keras`,
and stores 64 input sequences, the logits this backend computed for them and
the backend's name in `quickstart_reference.npz`. The notebook loads the
`.keras` file under whatever backend it runs on and compares its logits with
the stored ones.
"""

import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_attn  # noqa: E402

VOCAB, MAX_LEN = 21, 12


def make_data(n, seed):
    rng = np.random.default_rng(seed)
    tokens = np.zeros((n, MAX_LEN), "int32")
    labels = np.zeros(n, "int32")
    for i in range(n):
        row = rng.integers(1, VOCAB, size=rng.integers(3, MAX_LEN + 1))
        tokens[i, :len(row)] = row
        labels[i] = int((row > 10).sum() > (row <= 10).sum())
    return tokens, labels


def build_classifier():
    tokens = keras.Input((None,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(VOCAB, 32, mask_zero=True, name="embedding")(tokens)
    x = keras_attn.TransformerEncoderLayer(num_heads=2, intermediate_dim=64, name="encoder")(x)
    x = keras.layers.GlobalAveragePooling1D(name="pool")(x)
    logits = keras.layers.Dense(2, name="logits")(x)
    return keras.Model(tokens, logits, name="quickstart")


def main():
    keras.utils.set_random_seed(0)
    model = build_classifier()
    model.compile(keras.optimizers.Adam(3e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = make_data(2000, seed=1)
    model.fit(x, y, batch_size=64, epochs=1, verbose=2)
    tokens, _ = make_data(64, seed=3)
    logits = model.predict(tokens, verbose=0)
    model.save("quickstart_reference.keras")
    np.savez("quickstart_reference.npz", tokens=tokens, logits=logits,
             backend=np.array(keras.backend.backend()))
    print(f"saved under {keras.backend.backend()}: logits {logits.shape}")


if __name__ == "__main__":
    main()
