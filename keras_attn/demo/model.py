"""The demo's encoder-decoder Transformer, built from keras_attn layers."""

import keras
from keras import ops

import keras_attn

__all__ = ["TokenAndPositionEmbedding", "attention_scores", "build_model", "compile_for_training",
           "learning_rate_schedule"]


@keras.saving.register_keras_serializable(package="keras_attn_demo")
class TokenAndPositionEmbedding(keras.layers.Layer):
    """Token embedding plus a learned position embedding; 0 is padding.

    Shapes: B batch, T length (at most `max_length`), D `output_dim`.

    Args:
        vocab_size: number of token ids (0 is padding).
        max_length: longest sequence.
        output_dim: D, the embedding width.
        **kwargs: base layer arguments.

    Call arguments:
        inputs: int `(B, T)` token ids.

    Returns:
        `(B, T, D)`, carrying the Keras mask `inputs != 0`, so the
        keras_attn layers downstream never attend padding.
    """

    def __init__(self, vocab_size, max_length, output_dim, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.max_length = max_length
        self.output_dim = output_dim
        self.token_embedding = keras.layers.Embedding(
            vocab_size, output_dim, mask_zero=True, dtype=self.dtype_policy,
            name="token_embedding")
        self.position_embedding = keras.layers.Embedding(
            max_length, output_dim, dtype=self.dtype_policy, name="position_embedding")
        self.supports_masking = True

    def build(self, inputs_shape):
        self.token_embedding.build(inputs_shape)
        self.position_embedding.build((None,))
        self.built = True

    def call(self, inputs):
        positions = ops.arange(ops.shape(inputs)[-1], dtype="int32")
        return self.token_embedding(inputs) + self.position_embedding(positions)[None]

    def compute_mask(self, inputs, mask=None):
        return ops.not_equal(inputs, 0)

    def compute_output_shape(self, inputs_shape):
        return (*inputs_shape, self.output_dim)

    def get_config(self):
        config = super().get_config()
        config.update({"vocab_size": self.vocab_size, "max_length": self.max_length,
                       "output_dim": self.output_dim})
        return config


def build_model(vocab_size, source_length, target_length, model_dim=64, num_heads=4,
                intermediate_dim=128, num_layers=2, dropout=0.0, name="reverser"):
    """An encoder-decoder Transformer as a Functional model.

    Inputs are int32 `sources` `(B, source_length)` and `decoder_inputs`
    `(B, target_length)` (start token then the target shifted right), both
    padded with 0. The output is next-token logits `(B, target_length,
    vocab_size)`. Padding is masked through Keras masks: the encoder never
    attends padded sources, the decoder's cross-attention never attends
    padded memory, and its causal self-attention never attends padding.

    Args:
        vocab_size: number of token ids (0 is padding).
        source_length: source length S.
        target_length: decoder length T.
        model_dim: width D of every layer.
        num_heads: attention heads per layer.
        intermediate_dim: width of the feed-forward layers.
        num_layers: encoder layers, and as many decoder layers.
        dropout: dropout rate of the Transformer layers.
        name: model name.

    Returns:
        An uncompiled `keras.Model`.
    """
    sources = keras.Input((source_length,), dtype="int32", name="sources")
    decoder_inputs = keras.Input((target_length,), dtype="int32", name="decoder_inputs")

    x = TokenAndPositionEmbedding(vocab_size, source_length, model_dim,
                                  name="source_embedding")(sources)
    for i in range(num_layers):
        x = keras_attn.TransformerEncoderLayer(
            num_heads, intermediate_dim=intermediate_dim, dropout=dropout, name=f"encoder_{i}")(x)
    memory = x

    y = TokenAndPositionEmbedding(vocab_size, target_length, model_dim,
                                  name="target_embedding")(decoder_inputs)
    for i in range(num_layers):
        y = keras_attn.TransformerDecoderLayer(
            num_heads, intermediate_dim=intermediate_dim, dropout=dropout, name=f"decoder_{i}")(
                y, memory=memory)
    logits = keras.layers.Dense(vocab_size, name="logits")(y)
    return keras.Model([sources, decoder_inputs], logits, name=name)


def learning_rate_schedule(total_steps, learning_rate=3e-3):
    """Linear warm-up over 10% of `total_steps` to `learning_rate`, then cosine decay."""
    warmup = total_steps // 10
    return keras.optimizers.schedules.CosineDecay(
        0.0, decay_steps=max(1, total_steps - warmup), alpha=0.02,
        warmup_target=learning_rate, warmup_steps=warmup)


def compile_for_training(model, total_steps, learning_rate=3e-3):
    """Adam with linear warm-up then cosine decay; padding-blind loss and accuracy.

    Fit with `sample_weight = (targets != 0)` so that the weighted token
    accuracy counts real tokens only (the loss ignores id 0 either way).

    Args:
        model: a model made by `build_model`.
        total_steps: optimizer steps the training will take.
        learning_rate: peak learning rate, reached after 10% of the steps.
    """
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate_schedule(total_steps, learning_rate)),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=0),
        weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(name="token_accuracy")],
    )


def _numbered(model, prefix):
    names = {layer.name for layer in model.layers}
    count = 0
    while f"{prefix}_{count}" in names:
        count += 1
    return [model.get_layer(f"{prefix}_{i}") for i in range(count)]


def attention_scores(model, sources, decoder_inputs):
    """Run a `build_model` model layer by layer and collect its attention.

    Padding masks are passed explicitly (`0` is padding), exactly as the
    Keras masks do inside the Functional model, so the logits returned
    equal `model.predict_on_batch([sources, decoder_inputs])`.

    Shapes: B batch, S source length, T decoder length, H heads.

    Args:
        model: a model made by `build_model`.
        sources: int `(B, S)`.
        decoder_inputs: int `(B, T)`.

    Returns:
        A dict of NumPy arrays: `encoder` (a list, one `(B, H, S, S)` per
        encoder layer), `decoder_self` (a list of `(B, H, T, T)`),
        `decoder_cross` (a list of `(B, H, T, S)`) and `logits`
        `(B, T, vocab_size)`.
    """
    sources = ops.convert_to_tensor(sources, "int32")
    decoder_inputs = ops.convert_to_tensor(decoder_inputs, "int32")
    source_mask = ops.not_equal(sources, 0)
    target_mask = ops.not_equal(decoder_inputs, 0)
    result = {"encoder": [], "decoder_self": [], "decoder_cross": []}

    x = model.get_layer("source_embedding")(sources)
    for layer in _numbered(model, "encoder"):
        x, scores = layer(x, padding_mask=source_mask, return_attention_scores=True)
        result["encoder"].append(ops.convert_to_numpy(scores))
    memory = x
    y = model.get_layer("target_embedding")(decoder_inputs)
    for layer in _numbered(model, "decoder"):
        y, self_scores, cross_scores = layer(
            y, memory=memory, padding_mask=target_mask, memory_padding_mask=source_mask,
            return_attention_scores=True)
        result["decoder_self"].append(ops.convert_to_numpy(self_scores))
        result["decoder_cross"].append(ops.convert_to_numpy(cross_scores))
    result["logits"] = ops.convert_to_numpy(model.get_layer("logits")(y))
    return result
