"""Helpers shared by the layers."""

import keras

__all__ = ["clone_initializer", "gelu_approximate"]


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
