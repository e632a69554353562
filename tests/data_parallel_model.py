"""The model and data that the data-parallel tests train (tests/test_data_parallel.py).

One functional model holds every path a user trains through: three
`MultiHeadAttention` layers forced onto the fused, the blockwise and the
explicit path (blockwise with 8-token blocks, so T=16 is 2x2 blocks and its
custom gradient runs), a grouped-query RoPE self-attention, an encoder layer,
and a decoder layer with cross-attention over the encoder's output. Weights
come from a seeded NumPy generator, so that every process starts from the same
weights without any file or broadcast. Their scale, 0.1, is measured: at 0.3
the attention logits saturate and training is chaotic, so float32 rounding
that differs between a batch of 8 and two of 4 grew about 500x a step (DDP vs
one process: 6e-8, 3e-5, 3.5e-3 after 1, 2, 3 SGD steps). At 0.1 three steps
end 1.5e-8 apart while the weights move by 7e-3, so the 1e-5 tolerance
separates "synchronised" from "not" by a factor of several hundred.

Used by the test process (the single-device reference) and by the worker
processes (tests/data_parallel_worker.py); it imports keras lazily so that the
caller sets KERAS_BACKEND (and TensorFlow's logical devices) first.
"""

import numpy as np

VOCAB, T, D, HEADS = 32, 16, 32, 4
BLOCK_SIZE = 8  # < T: the blockwise path really loops over blocks
GLOBAL_BATCH, STEPS, LEARNING_RATE = 8, 3, 0.1


def build_model(implementation_of_auto="auto", dropout=0.0):
    """The model, with seeded weights; `implementation_of_auto` for the layers left on auto."""
    import keras

    import keras_attn

    keras_attn.config.set_attention_block_size(BLOCK_SIZE)
    tokens = keras.Input((T,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(VOCAB, D, name="embed")(tokens)
    for path in ("fused", "blockwise", "explicit"):
        attention = keras_attn.MultiHeadAttention(
            HEADS, D // HEADS, implementation=path, dropout=dropout, name=f"mha_{path}")
        x = x + attention(x, x, use_causal_mask=True)
    gqa = keras_attn.MultiHeadAttention(
        HEADS, D // HEADS, num_key_value_heads=2, rope_max_wavelength=10_000,
        implementation=implementation_of_auto, dropout=dropout, name="mha_gqa_rope")
    x = x + gqa(x, x, use_causal_mask=True)
    memory = keras_attn.TransformerEncoderLayer(
        HEADS, intermediate_dim=2 * D, dropout=dropout, implementation=implementation_of_auto,
        name="encoder")(x)
    x = keras_attn.TransformerDecoderLayer(
        HEADS, intermediate_dim=2 * D, dropout=dropout, implementation=implementation_of_auto,
        name="decoder")(x, memory)
    model = keras.Model(tokens, keras.layers.Dense(VOCAB, name="logits")(x))
    rng = np.random.default_rng(0)
    model.set_weights([0.1 * rng.standard_normal(w.shape).astype("float32")
                       for w in model.weights])
    return model


def make_data():
    """`(tokens, targets)` of the global batch for every step: `(STEPS, GLOBAL_BATCH, T)`."""
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, VOCAB, (STEPS, GLOBAL_BATCH, T)).astype("int32")
    return tokens, np.roll(tokens, -1, axis=-1)


def torch_train(model, tokens, targets):
    """Plain SGD steps as Keras's torch guide writes them; `model` may be DDP-wrapped."""
    import torch

    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    loss_fn = torch.nn.CrossEntropyLoss()
    losses = []
    for step_tokens, step_targets in zip(tokens, targets, strict=True):
        logits = model(torch.as_tensor(step_tokens))                # (B, T, V)
        loss = loss_fn(logits.reshape(-1, VOCAB),                    # (B*T, V)
                       torch.as_tensor(step_targets, dtype=torch.long).reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


def weights_of(model):
    import keras

    return [np.asarray(keras.ops.convert_to_numpy(w)) for w in model.weights]
