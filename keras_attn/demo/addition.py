"""The `add` task: a Llama-style decoder-only model learns addition written as text.

A sequence is `a + b = answer`, one token per character: the operands are
zero-padded to N digits, most significant digit first; the answer has N + 1
digits written least significant digit first ("123+458=" -> "1850", which
is 581 reversed and zero-padded). Writing the answer reversed lets the model
produce each digit after the digits it depends on (the carry comes from the
digits already written), a documented choice that makes addition much
easier to learn. Every sequence has the same length, so there is no padding.

Token ids: digit `d` is `d`, then `+` and `=`. Shapes: N operand digits,
P = 2N + 2 prompt tokens, A = N + 1 answer tokens, L = P + A.
"""

import numpy as np
from keras import ops

import keras_attn
from keras_attn import _device
from keras_attn.demo.model import _numbered
from keras_attn.generation import generate

__all__ = [
    "EQUALS",
    "PLUS",
    "VOCAB_SIZE",
    "build_language_model",
    "generate_answers",
    "make_addition_split",
    "render",
    "teacher_forcing",
]

PLUS, EQUALS = 10, 11
VOCAB_SIZE = 12


def _digits(values, count):
    """Most significant digit first, zero-padded: int `(N,)` -> `(N, count)`."""
    powers = 10 ** np.arange(count - 1, -1, -1)
    return (np.asarray(values)[:, None] // powers) % 10


def _encode(pairs, digits):
    a, b = pairs[:, 0], pairs[:, 1]
    n = len(pairs)
    answer = _digits(a + b, digits + 1)[:, ::-1]  # least significant digit first
    return np.concatenate([_digits(a, digits), np.full((n, 1), PLUS), _digits(b, digits),
                           np.full((n, 1), EQUALS), answer], axis=1).astype("int32")


def make_addition_split(num_train, num_test, digits, seed):
    """Training and held-out sequences; no held-out pair `(a, b)` is trained on.

    Args:
        num_train: training sequences.
        num_test: held-out sequences.
        digits: N, the operands' digits (operands are 0 .. 10**N - 1).
        seed: NumPy seed.

    Returns:
        `(train, test)`: int32 `(num_train, L)` and `(num_test, L)`.
    """
    if not isinstance(digits, int) or not 1 <= digits <= 9:
        raise ValueError(f"`digits` must be an int in [1, 9]. Received: digits={digits!r}")
    space = 10 ** (2 * digits)
    if num_train + num_test > space // 2:
        raise ValueError(
            f"At most half of the {space} pairs of {digits}-digit operands can be drawn "
            f"(num_train + num_test <= {space // 2}). Received: num_train={num_train}, "
            f"num_test={num_test}")
    rng = np.random.default_rng(seed)
    codes = rng.choice(space, size=num_train + num_test, replace=False)
    pairs = np.stack([codes // 10 ** digits, codes % 10 ** digits], axis=1)
    return _encode(pairs[num_test:], digits), _encode(pairs[:num_test], digits)


def teacher_forcing(sequences, digits):
    """`(inputs, targets, weights)`: next-token targets, weight 1 on answer tokens only.

    Args:
        sequences: int32 `(N, L)` from `make_addition_split`.
        digits: N.

    Returns:
        inputs `(N, L - 1)`, targets `(N, L - 1)` and float32 weights
        `(N, L - 1)`, 1 where the target is an answer digit.
    """
    prompt = 2 * digits + 2
    inputs, targets = sequences[:, :-1], sequences[:, 1:]
    weights = np.zeros(targets.shape, "float32")
    weights[:, prompt - 1:] = 1.0
    return inputs, targets, weights


def render(row, digits):
    """One sequence as text, the answer back in the usual order: "123+458=0581"."""
    row = np.asarray(row).tolist()
    prompt = 2 * digits + 2
    text = "".join("+" if t == PLUS else "=" if t == EQUALS else str(t) for t in row[:prompt])
    return text + "".join(str(t) for t in row[prompt:][::-1])


def build_language_model(sequence_length, model_dim=64, num_heads=4, num_key_value_heads=2,
                         num_layers=2, intermediate_dim=None, name="adder"):
    """A Llama-style decoder-only Transformer as a Functional model.

    Token embedding, then `num_layers` pre-RMSNorm `TransformerDecoderLayer`s
    without memory (grouped-query attention with RoPE, a SwiGLU feed-forward,
    no biases), a final RMSNorm and the output projection. Positions come
    from RoPE only.

    Args:
        sequence_length: the training input length (L - 1).
        model_dim: D.
        num_heads: H.
        num_key_value_heads: H_kv.
        num_layers: decoder layers.
        intermediate_dim: the feed-forward width (default 2 * D).
        name: model name.

    Returns:
        An uncompiled `keras.Model` from int `(B, sequence_length)` to
        logits `(B, sequence_length, VOCAB_SIZE)`.
    """
    import keras

    tokens = keras.Input((sequence_length,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(VOCAB_SIZE, model_dim, name="token_embedding")(tokens)
    for i in range(num_layers):
        x = keras_attn.TransformerDecoderLayer(
            num_heads, intermediate_dim=intermediate_dim or 2 * model_dim,
            num_key_value_heads=num_key_value_heads, rope_max_wavelength=10000.0,
            normalization="rms", normalize_first=True, gated_feed_forward=True,
            activation="silu", use_bias=False, layer_norm_epsilon=1e-6,
            name=f"decoder_{i}")(x)
    x = keras.layers.RMSNormalization(epsilon=1e-6, name="final_norm")(x)
    logits = keras.layers.Dense(VOCAB_SIZE, use_bias=False, name="logits")(x)
    return keras.Model(tokens, logits, name=name)


def generate_answers(model, prompts, answer_length, use_cache=True, batch_size=1024):
    """Greedy answers to `prompts`, with `keras_attn.generation.generate`.

    With `use_cache`, each decoder layer keeps a key/value cache: the prompt
    is one prefill call, then each answer digit one call of one token.
    Without it, every step runs the model over the whole sequence so far (a
    fixed-length buffer; the causal mask hides the slots not yet written).
    Each batch is one compiled program (`jax.jit`, `tf.function`).

    Args:
        model: a model from `build_language_model`.
        prompts: int `(N, P)`.
        answer_length: A, the tokens to generate.
        use_cache: decode over key/value caches (True) or recompute (False).
        batch_size: prompts generated together.

    Returns:
        int32 `(N, P + A)`: the prompts and their answers.
    """
    decoders = _numbered(model, "decoder")
    embedding = model.get_layer("token_embedding")
    final_norm, head = model.get_layer("final_norm"), model.get_layer("logits")
    length = np.shape(prompts)[1] + answer_length

    def cached_step(token_ids, caches, index):
        x = embedding(token_ids)
        new = []
        for layer, cache in zip(decoders, caches, strict=True):
            x, cache = layer(x, self_attention_cache=cache,
                             self_attention_cache_update_index=index)
            new.append(cache)
        return head(final_norm(x)), new

    def uncached_step(token_ids, buffer, index):
        # The "cache" is the token buffer; the model reads all of it, causally.
        buffer = ops.slice_update(buffer, [0, index], token_ids)
        x = embedding(buffer)
        for layer in decoders:
            x = layer(x)
        last = index + ops.shape(token_ids)[1] - 1
        return ops.expand_dims(ops.take(head(final_norm(x)), last, axis=1), 1), buffer

    def run(batch):
        n = ops.shape(batch)[0]
        if use_cache:
            state = [keras_attn.empty_cache(layer, n, length) for layer in decoders]
            return generate(cached_step, batch, length, state)
        return generate(uncached_step, batch, length, ops.zeros((n, length), "int32"))

    run = _device.compile_inference(run)
    outputs = []
    for begin in range(0, len(prompts), batch_size):
        batch = ops.convert_to_tensor(np.asarray(prompts[begin:begin + batch_size], "int32"))
        outputs.append(np.asarray(ops.convert_to_numpy(run(batch))))
    return np.concatenate(outputs)
