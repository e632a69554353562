"""Helpers shared by the layers."""

import keras

__all__ = ["check_not_quantized", "clone_initializer", "gelu_approximate"]


def clone_initializer(initializer):
    """A fresh initializer per sublayer, so seeded ones do not repeat weights."""
    initializer = keras.initializers.get(initializer)
    return initializer.__class__.from_config(initializer.get_config())


@keras.saving.register_keras_serializable(package="keras_attn", name="gelu_approximate")
def gelu_approximate(x):
    """The tanh approximation of GELU (`keras.activations.gelu(x, approximate=True)`).

    Hugging Face's `gelu_pytorch_tanh` (Gemma's `hidden_activation`): Keras has no
    name for it, so it is registered here and serialises by name
    (`"keras_attn>gelu_approximate"`).
    """
    return keras.activations.gelu(x, approximate=True)


def check_not_quantized(layer):
    """A `ValueError` when a sublayer of `layer` is quantized (`Model.quantize`).

    `get_config` calls it. The layers build their sublayers (Dense, EinsumDense, Embedding)
    from their own config with their own float dtype policy; a quantized sublayer's mode
    is in its dtype policy only, which that config does not carry. A quantized model
    saved as `.keras` then failed to load ("Layer 'intermediate_dense' expected 2
    variables, but received 0", issue 38): it is refused when saved instead.
    """
    modes = sorted({mode for sub in layer._flatten_layers(include_self=False)
                    if (mode := getattr(sub.dtype_policy, "quantization_mode", None))})
    if modes:
        raise ValueError(
            f"A quantized `{type(layer).__name__}` cannot be saved or serialised yet: its "
            f"config rebuilds float sublayers, which cannot take the quantized weights back. "
            f"Save the model before `quantize(...)` and quantize it again after loading. "
            f"Received: quantization_mode={modes[0]!r} in layer {layer.name!r}")
