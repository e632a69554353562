"""Helpers shared by the layers."""

import keras

__all__ = ["clone_initializer"]


def clone_initializer(initializer):
    """A fresh initializer per sublayer, so seeded ones do not repeat weights."""
    initializer = keras.initializers.get(initializer)
    return initializer.__class__.from_config(initializer.get_config())
