"""The float64 NumPy reference lives in the package (keras_attn.testing.reference)
so that the parity runner can use it too; the tests import it from here."""

from keras_attn.testing.reference import *  # noqa: F401,F403
from keras_attn.testing.reference import __all__  # noqa: F401
