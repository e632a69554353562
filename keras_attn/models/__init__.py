"""The models tier: stacks of blocks with embeddings, a final norm and a head.

`CausalLM` and its generate loop (`causal_lm.py`). It sits between `layers/`
(the blocks) and `convert/` (which builds models from other libraries' weights):
a model may import the layers, a layer never imports a model.
"""

from keras_attn.models.causal_lm import CausalLM

__all__ = ["CausalLM"]
