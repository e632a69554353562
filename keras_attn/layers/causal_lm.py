"""`CausalLM` moved to `keras_attn.models.causal_lm`; this module keeps the old import path.

The names are the very objects of the new module (the class registered for
Keras as `keras_attn>CausalLM`, so `.keras` files saved before the move load;
the generate loop's helpers, which share its state).
"""

from keras_attn.models._generate_loop import loops_of, set_step_tracer, traced_step_of
from keras_attn.models.causal_lm import CausalLM

__all__ = ["CausalLM", "loops_of", "set_step_tracer", "traced_step_of"]
