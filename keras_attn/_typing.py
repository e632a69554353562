"""The names used in the package's type hints.

Keras's tensors have no one static type: a call takes a NumPy array, a
backend tensor (`jax.Array`, `tf.Tensor`, `torch.Tensor`) or a symbolic
`keras.KerasTensor`. `Tensor` names that set in signatures (it is `Any` to a
type checker); the shapes are in the docstrings, with the package's letters.
"""

from typing import Any

__all__ = ["Initializer", "Tensor"]

Tensor = Any  # a NumPy array, a backend tensor or a KerasTensor
Initializer = Any  # a name, a config dict or a keras.initializers.Initializer
