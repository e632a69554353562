"""`CausalLM.generate`'s compiled loop: a Keras model per setting, kept on the model, and
the traced decoding step (PyTorch), reached through the "trace_step" hook."""

import keras

from keras_attn import _hooks
from keras_attn.cache import empty_cache
from keras_attn.generation import generate as generate_tokens

__all__ = ["cache_recompute_lengths", "forget_if_changed", "loops_of", "set_step_tracer",
           "traced_step_of"]

# The attribute values a kept loop may have captured (read by `call` at trace time).
_PLAIN = (bool, int, float, str, type(None))


def cache_recompute_lengths(lm):
    """The sequence lengths at which `lm.generate` recomputes its caches: each block's
    self-attention RoPE's `cache_recompute_length` (longrope's switch), or (); a
    `ValueError` if there are some and a block's attention holds a recurrent state."""
    lengths = set()
    for block in lm.blocks:
        options = getattr(getattr(block, "self_attention", None), "options", None)
        rope = getattr(options, "rope", None)
        if rope is not None and rope.cache_recompute_length is not None:
            lengths.add(rope.cache_recompute_length)
    recurrent = [block.name for block in lm.blocks if getattr(
        getattr(block, "self_attention", None), "has_recurrent_state", False)]
    if lengths and recurrent:
        # The recomputation rewrites every cache from index 0; a recurrent state cannot be
        # rewound to 0 that way (it would fold the tokens in twice).
        raise ValueError(
            "`generate` recomputes its caches at RoPE's switch (longrope's "
            f"cache_recompute_length {sorted(lengths)}), which a linear-attention block's "
            "recurrent state does not allow. Received: linear-attention blocks "
            f"{recurrent} with cache_recompute_length={sorted(lengths)}")
    return tuple(sorted(lengths))


def _empty_caches(lm, batch, max_length):
    """`generate`'s caches: L slots per block; one slot for a KV-shared block, which reads
    its source's cache and hands its own back untouched (a placeholder)."""
    sources = lm.kv_sharing or [None] * len(lm.blocks)
    return [empty_cache(block, batch, max_length if source is None else 1, as_kv_cache=True)
            for block, source in zip(lm.blocks, sources)]


class _GenerateLoop(keras.Model):
    """`CausalLM.generate` as a Keras model, so that Keras compiles it.

    `predict_on_batch(prompt_ids)` runs the prefill and the whole decoding
    loop inside Keras's predict function: `jax.jit` with the weights as state
    on JAX, `tf.function` (with XLA when `jit_compile`) on TensorFlow,
    `torch.compile` with `jit_compile=True` on PyTorch (else eager, without
    autograd: Keras runs it under `torch.no_grad()`). That function is kept,
    so a second `generate` of the same shape compiles nothing (without it,
    JAX traced and compiled the loop at every call: 1.9 s for 16 tokens of a
    2-layer model, against 5 ms for keras-hub's cached function).
    """

    def __init__(self, lm, max_length, options, jit_compile, step=None):
        super().__init__(name=f"{lm.name}_generate")
        self.lm, self.max_length, self.options = lm, max_length, options
        self.jit_compile = jit_compile
        self.step = step  # the traced decoding step (PyTorch, "auto"), or None
        self.traces = 0  # how often `call` ran: once per compilation, at every eager call
        self.built = True  # the weights are the (built) lm's

    def call(self, prompt_ids):
        self.traces += 1
        batch = prompt_ids.shape[0]
        caches = _empty_caches(self.lm, batch, self.max_length)
        step = self.lm.next_token_logits
        if self.step is not None:
            self.step.follow(self.lm.variables)  # once per call: the weights may have changed
            step = self._prefill_eagerly_then(self.step)
        return generate_tokens(step, prompt_ids, self.max_length, caches,
                               recompute_cache_at=cache_recompute_lengths(self.lm),
                               **self.options)

    def _prefill_eagerly_then(self, traced):
        """The prefill (P tokens, once) eagerly; the decoding steps (1 token) from `traced`."""
        def step(token_ids, caches, index):
            if token_ids.shape[1] != 1:
                return self.lm.next_token_logits(token_ids, caches, index)
            return traced(token_ids, caches, index)
        return step


class _Loops:
    """A model's `{settings: _GenerateLoop}` and its traced decoding step, in a plain
    object: Keras's saving walks a model's attributes and would save a dict or list of
    models in it (and a module-level map would keep every model alive through its loop);
    and the model's state they were made for (`model_state`)."""

    def __init__(self):
        self.loops = {}
        self.step = None
        self.state = None


def model_state(lm):
    """What a kept loop (or traced step) may have captured besides the variables' values:
    which variables there are (`enable_lora` adds some, `quantize` replaces kernels), and
    the plain public attributes (numbers, strings, bools, None; frozen option objects) of
    the model and every layer in it, which `call` reads as constants while it is traced."""
    variables = tuple(id(v) for v in lm.variables)
    attributes = []
    for layer in (lm, *lm._flatten_layers(include_self=False)):
        for name, value in vars(layer).items():
            if name.startswith("_"):
                continue
            if isinstance(value, _PLAIN) or getattr(value, "__dataclass_params__", None) and (
                    value.__dataclass_params__.frozen):
                attributes.append((id(layer), name, value))
    return variables, tuple(attributes)


def forget_if_changed(lm):
    """Drop `lm`'s kept loops and traced step when its state (`model_state`) is not the one
    they were made for: on TensorFlow a kept `tf.function`, and on JAX a traced loop,
    decoded the model as it was at the first call (after `enable_lora`, `quantize`, or
    `lm.final_logit_soft_cap = ...`: issue 38); PyTorch mixed an eager prefill of the new
    model with a traced step of the old."""
    holder = _holder(lm)
    state = model_state(lm)
    if holder.state != state:
        holder.loops.clear()
        holder.step = None
        holder.state = state


def _holder(lm):
    holder = getattr(lm, "_generate_loops", None)
    if holder is None:
        holder = _Loops()
        lm._generate_loops = holder
    return holder


def loops_of(lm):
    """`lm`'s kept generate loops, `{settings: _GenerateLoop}`."""
    return _holder(lm).loops


def traced_step_of(lm):
    """`lm`'s traced decoding step (one per model, its graphs kept by shape), or None."""
    holder = _holder(lm)
    if holder.step is None:
        trace = _hooks.get("trace_step")
        holder.step = None if trace is None else trace(lm.next_token_logits, lm.variables)
    return holder.step


# `trace(fn, variables)`: a decoding step traced once per shape, or None where the
# backend needs none. The tracer lives at the backend boundary (PyTorch only), the
# "trace_step" hook (`keras_attn._hooks`), so that this module imports no backend.
def set_step_tracer(trace):
    """Use `trace(fn, variables) -> step or None` for the decoding step (None: none)."""
    _hooks.set("trace_step", trace)


def _default_jit_compile():
    """XLA on JAX and TensorFlow; PyTorch traces its step (torch.compile costs minutes)."""
    return keras.backend.backend() in ("jax", "tensorflow")
