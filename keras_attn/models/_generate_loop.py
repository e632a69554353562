"""`CausalLM.generate`'s compiled loop: a Keras model per setting, kept on the model, and
the traced decoding step (PyTorch), reached through the "trace_step" hook."""

import collections
import functools
import numbers
import threading

import keras
import numpy as np
from keras import ops

from keras_attn import _device, _hooks
from keras_attn._sampling import check_temperature, check_top_p, sampling_settings
from keras_attn._streaming import check_streamer
from keras_attn._validation import check_positive_int, concrete_value
from keras_attn.cache import empty_cache
from keras_attn.generation import (
    _stop_token_ids,
    check_generated,
    generate_checked,
)
from keras_attn.generation import generate as generate_tokens
from keras_attn.models import _padding
from keras_attn.models._checks import _check_token_ids

__all__ = ["cache_recompute_lengths", "forget_if_changed", "generate_over_kept_loops",
           "loops_of", "one_call_at_a_time", "set_step_tracer", "traced_step_of"]

# The attribute values a kept loop may have captured (read by `call` at trace time).
_PLAIN = (bool, int, float, str, type(None))
# keras.Model's training attributes, which `call` never reads: `compile`, `fit`,
# `predict_on_batch` and `train_on_batch` set them (`predict_function` from None to a
# function). Counted as the model's state, the first `predict_on_batch` or `train_on_batch`
# after a `generate` dropped its kept loops: JAX compiled the loop again (7.0 s, against
# 0.02 s once kept).
_TRAINING_ATTRIBUTES = frozenset({
    "compiled", "stop_training", "train_function", "test_function", "predict_function",
    "steps_per_execution", "jit_compile", "run_eagerly", "optimizer", "loss", "history"})
# A sampling loop's inputs besides the prompt (`_GenerateLoop`), and how many loops a model
# keeps (the least recently used goes first): one per prompt shape, max_length, stop
# tokens, greedy or sampled, jit_compile and traced step.
_SAMPLING_INPUTS = ("seed", "temperature", "top_k", "top_p_cut")
MAX_KEPT_LOOPS = 8


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
    its source's cache and hands its own back untouched (a placeholder). A block's
    `KVCache` is the backend's own where `_device` has one (the "owned_cache" hook: on
    PyTorch, heads-first and written in place), since nothing but this generation
    holds it."""
    sources = lm.kv_sharing or [None] * len(lm.blocks)
    own = _hooks.get("owned_cache")
    caches = []
    for block, source in zip(lm.blocks, sources):
        cache = empty_cache(block, batch, max_length if source is None else 1, as_kv_cache=True)
        owned = own(cache) if own is not None and source is None else None
        caches.append(cache if owned is None else owned)
    return caches


class _GenerateLoop(keras.Model):
    """`CausalLM.generate` as a Keras model, so that Keras compiles it.

    `predict_on_batch(inputs)` runs the prefill and the whole decoding
    loop inside Keras's predict function: `jax.jit` with the weights as state
    on JAX, `tf.function` (with XLA when `jit_compile`) on TensorFlow,
    `torch.compile` with `jit_compile=True` on PyTorch (else eager, without
    autograd: Keras runs it under `torch.no_grad()`). That function is kept,
    so a second `generate` of the same shape compiles nothing (without it,
    JAX traced and compiled the loop at every call: 1.9 s for 16 tokens of a
    2-layer model, against 5 ms for keras-hub's cached function).

    `inputs` is a dict: `"prompt_ids"` int32 `(B, P)` and, for a sampling loop
    (`sampled`), the settings as tensors, so that another seed, temperature,
    top_k or top_p reuses the compiled loop: `"seed"` int32 `(2,)`
    (`keras_attn._sampling.seed_pair`), `"temperature"` float32 `()`,
    `"top_k"` int32 `()` (0: none), `"top_p_cut"` float32 `()` (`1 - top_p`, 0:
    none; computed in float64 as transformers does).
    """

    def __init__(self, lm, max_length, end_token_id, sampled, jit_compile, step=None,
                 prefill_length=None):
        super().__init__(name=f"{lm.name}_generate")
        self.lm, self.max_length = lm, max_length
        self.end_token_id, self.sampled = end_token_id, sampled
        self.options = {"end_token_id": end_token_id, "sampled": sampled}
        self.prefill_length = prefill_length  # a padded prompt's, for recurrent states
        self.jit_compile = jit_compile
        self.step = step  # the traced decoding step (PyTorch, "auto"), or None
        self.traces = 0  # how often `call` ran: once per compilation, at every eager call
        self.built = True  # the weights are the (built) lm's

    def call(self, inputs):
        """`inputs`: `{"prompt_ids": (B, P)}`, `"prompt_lengths": (B,)` for a right-padded
        prompt (`keras_attn.generation.generate`'s `prompt_lengths`), and the sampling
        settings of a sampling loop (above)."""
        self.traces += 1
        prompt_ids = inputs["prompt_ids"]
        sampling = None
        if self.sampled:
            sampling = {name: inputs[name] for name in _SAMPLING_INPUTS}
        caches = _empty_caches(self.lm, prompt_ids.shape[0], self.max_length)
        return generate_checked(self.decoding_step(inputs.get("prompt_lengths")), prompt_ids,
                                self.max_length, caches,
                                end_token_id=self.end_token_id, sampling=sampling,
                                recompute_cache_at=cache_recompute_lengths(self.lm),
                                prompt_lengths=inputs.get("prompt_lengths"),
                                prefill_length=self.prefill_length)

    def decoding_step(self, prompt_lengths=None):
        """`next_token_fn` for this loop: the model's, or the traced step after an eager
        prefill."""
        model_step = _model_step(self.lm, prompt_lengths, self.prefill_length)
        if self.step is None:
            return model_step
        self.step.follow(self.lm.variables)  # once per call: the weights may have changed
        return _prefill_eagerly_then(model_step, self.step)


def _model_step(lm, prompt_lengths=None, prefill_length=None):
    """`lm.next_token_logits`, with the last position's logits only (`logits_to_keep=1`,
    as transformers' `generate` asks of its prefill) unless the loop reads every position
    of the prefill (a right-padded prompt, `prompt_lengths`, prefilled whole, with no
    `prefill_length`: each row's own last). The head over the prompt's other positions is
    skipped: `benchmarks.models --batch 8` on PyTorch (P=512, V=4096) computed a
    (8, 512, 4096) product there and kept one row of it."""
    if prompt_lengths is not None and prefill_length is None:
        return lm.next_token_logits
    return functools.partial(lm.next_token_logits, logits_to_keep=1)


def _prefill_eagerly_then(model_step, traced):
    """The prefill (P tokens, once) eagerly; the decoding steps (1 token) from `traced`."""
    def step(token_ids, caches, index):
        if token_ids.shape[1] != 1:
            return model_step(token_ids, caches, index)
        return traced(token_ids, caches, index)
    return step


class _Loops:
    """A model's `{settings: _GenerateLoop}` and its traced decoding step, in a plain
    object: Keras's saving walks a model's attributes and would save a dict or list of
    models in it (and a module-level map would keep every model alive through its loop);
    and the model's state they were made for (`model_state`); and the lock that lets one
    `generate` at a time use them (`one_call_at_a_time`)."""

    def __init__(self):
        self.loops = collections.OrderedDict()
        self.step = None
        self.state = None
        self.lock = threading.RLock()


def model_state(lm):
    """What a kept loop (or traced step) may have captured besides the variables' values:
    which variables there are (`enable_lora` adds some, `quantize` replaces kernels), and
    the plain public attributes (numbers, strings, bools, None; frozen option objects) of
    the model and every layer in it, which `call` reads as constants while it is traced."""
    variables = tuple(id(v) for v in lm.variables)
    attributes = []
    for layer in (lm, *lm._flatten_layers(include_self=False)):
        for name, value in vars(layer).items():
            if name.startswith("_") or name in _TRAINING_ATTRIBUTES:
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


_HOLDER_LOCK = threading.Lock()  # two threads' first `generate` make one holder


def _holder(lm):
    holder = getattr(lm, "_generate_loops", None)
    if holder is None:
        with _HOLDER_LOCK:
            holder = getattr(lm, "_generate_loops", None)
            if holder is None:
                holder = _Loops()
                lm._generate_loops = holder
    return holder


def one_call_at_a_time(generate):
    """`generate(lm, ...)` holding `lm`'s lock: calls on one model from several threads run
    one after the other, calls on different models at once. Keras's JAX predict donates
    the weights' buffers to its compiled function and writes the results back; a second
    thread reading the weights meanwhile raised "Buffer has been deleted or donated"
    (issue 38). The lock also keeps the kept loops' map whole (`forget_if_changed`)."""
    @functools.wraps(generate)
    def locked(lm, *args, **kwargs):
        with _holder(lm).lock:
            return generate(lm, *args, **kwargs)
    return locked


def _predict(loop, prompt):
    """`loop.predict_on_batch(prompt)`, or the "predict_on_one_replica" hook's answer where
    it has one: under a `tf.distribute` strategy, Keras's predict runs the loop on every
    replica and concatenates their (B, L) tokens into (replicas * B, L)."""
    one_replica = _hooks.get("predict_on_one_replica")
    tokens = None if one_replica is None else one_replica(loop, prompt)
    return loop.predict_on_batch(prompt) if tokens is None else tokens


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

@one_call_at_a_time
def generate_over_kept_loops(lm, prompt_ids, max_length, *, end_token_id, temperature, top_k,
                             seed, jit_compile, padding_mask=None, attention_mask=None,
                             pad_token_id=None, return_lengths=False, top_p=None,
                             streamer=None):
    """`CausalLM.generate` (its docstring): the arguments checked, a padded prompt brought to
    right padding (`_padding`), then the loop kept for this prompt shape and these settings
    (made and compiled the first time), or, for a traced prompt, NumPy or unseeded
    sampling, the loop run as it is; then the rows in the caller's layout."""
    prompt_ids = _check_token_ids("prompt_ids", prompt_ids, lm.vocabulary_size)
    mask = _padding.padding_argument(padding_mask, attention_mask)
    pad_token_id = _padding.check_pad_token_id(pad_token_id, lm.vocabulary_size)
    if not isinstance(return_lengths, bool):
        raise ValueError(f"`return_lengths` must be a bool. Received: "
                         f"return_lengths={return_lengths!r}")
    layout, lengths = None, None
    if mask is not None:
        name = "padding_mask" if padding_mask is not None else "attention_mask"
        layout, lengths = _padding.layout_of(mask, tuple(prompt_ids.shape), name)
    if layout is not None and cache_recompute_lengths(lm):
        # Rows of different lengths would cross longrope's switch at different steps, and
        # the one prefill over all P positions picks the factors by P.
        raise ValueError(
            f"`{name}` with rows of different lengths is not supported by a model whose RoPE "
            "recomputes its caches (longrope's cache_recompute_length "
            f"{list(cache_recompute_lengths(lm))}). Received: {name} with lengths "
            f"{lengths.tolist()}")
    if layout is not None and streamer is not None:
        raise ValueError(
            f"`streamer` streams rows of one prompt length: it cannot be combined with "
            f"`{name}` rows of different lengths. Received: {name} with lengths "
            f"{lengths.tolist()} and a streamer")
    tokens = _generate_rows(lm, prompt_ids, max_length, layout, lengths,
                            end_token_id=end_token_id, temperature=temperature, top_k=top_k,
                            seed=seed, jit_compile=jit_compile, top_p=top_p,
                            streamer=streamer)
    if layout is None and pad_token_id is None and not return_lengths:
        return tokens  # today's result
    stops = _stop_token_ids(end_token_id)
    prompt_length = tuple(prompt_ids.shape)[1]
    if lengths is None:
        lengths = np.full((tuple(prompt_ids.shape)[0],), prompt_length, "int32")
    tokens, totals = _padding.finish_rows(tokens, lengths, stops, pad_token_id)
    if layout == "left":
        tokens, totals = _padding.to_left(prompt_ids, tokens, lengths, totals)
    return (tokens, totals) if return_lengths else tokens


def _generate_rows(lm, prompt_ids, max_length, layout, lengths, *, end_token_id, temperature,
                   top_k, seed, jit_compile, top_p, streamer):
    """The generation over right-layout rows: `(B, L)`, row i its prompt at `0 ..
    lengths[i] - 1` (`layout` "left" or "right"; None: no padding), then its tokens."""
    batch, prompt_length = tuple(prompt_ids.shape)
    max_length = check_positive_int("max_length", max_length)
    if prompt_length is not None and max_length <= prompt_length:
        raise ValueError(
            f"`max_length` is the length of the result, prompt included: it must exceed "
            f"the prompt length P={prompt_length}. Received: max_length={max_length}")
    if lm.max_position_embeddings and max_length > lm.max_position_embeddings:
        raise ValueError(
            f"The position embedding has max_position_embeddings="
            f"{lm.max_position_embeddings} rows: `max_length` cannot exceed it. "
            f"Received: max_length={max_length}")
    if batch is None:
        raise ValueError("`prompt_ids` needs a static batch size. "
                         f"Received: prompt_ids.shape={tuple(prompt_ids.shape)}")
    if jit_compile not in ("auto", True, False):
        raise ValueError(f"`jit_compile` must be 'auto', True or False. Received: "
                         f"jit_compile={jit_compile!r}")
    temperature = check_temperature(temperature)
    top_k = check_positive_int("top_k", top_k, allow_none=True)
    top_p = check_top_p(top_p)
    check_streamer(streamer)
    stops = _stop_token_ids(end_token_id)  # checked here, before anything compiles
    forget_if_changed(lm)  # kept loops of a model since changed decode the old one
    # "auto" on a backend with a step tracer (PyTorch): the traced decoding step.
    step = traced_step_of(lm) if jit_compile == "auto" else None
    jit_compile = _default_jit_compile() if jit_compile == "auto" else jit_compile
    sampled = temperature > 0
    padded = {}
    if layout is not None:
        shifts = np.zeros_like(lengths) if layout == "right" else prompt_length - lengths
        prompt_ids = _padding.roll_rows(prompt_ids, shifts)
        # A recurrent state cannot take the pads of a prefill over all P positions: its
        # prefill is the shortest row's, a static length, so part of the kept loop's key.
        recurrent = any(getattr(getattr(block, "self_attention", None),
                                "has_recurrent_state", False) for block in lm.blocks)
        padded = {"prompt_lengths": lengths,
                  "prefill_length": int(lengths.min()) if recurrent else None}
    prompt = concrete_value(prompt_ids)
    if streamer is not None:
        return _stream(lm, prompt_ids, max_length, step, streamer=streamer,
                       end_token_id=end_token_id, temperature=temperature, top_k=top_k,
                       top_p=top_p, seed=seed)
    if (keras.backend.backend() == "numpy" or prompt is None
            or (sampled and not isinstance(seed, numbers.Integral))):
        caches = _empty_caches(lm, batch, max_length)
        next_token_fn = _model_step(lm, padded.get("prompt_lengths"), padded.get("prefill_length"))
        return generate_tokens(next_token_fn, prompt_ids, max_length, caches,
                               end_token_id=end_token_id, temperature=temperature,
                               top_k=top_k, seed=seed, top_p=top_p,
                               recompute_cache_at=cache_recompute_lengths(lm), **padded)
    inputs = {"prompt_ids": np.asarray(prompt, "int32")}
    if sampled:
        inputs.update(sampling_settings(temperature, top_k, top_p, seed))
    if padded:
        inputs["prompt_lengths"] = np.asarray(padded["prompt_lengths"], "int32")
    # The prompt's shape is part of the key: a loop traced for one (B, P) and called
    # with another is retraced by TensorFlow with the batch relaxed to None, which the
    # caches cannot size (generate on (2, 4) then (1, 4) raised, issue 38). The sampling
    # settings are not: they are the loop's inputs. A padded prompt's loop takes its
    # lengths as an input (one compile per prompt shape), and, for a recurrent state, its
    # prefill length as a constant.
    key = (tuple(prompt.shape), max_length, stops, sampled, bool(jit_compile),
           step is not None, bool(padded), padded.get("prefill_length"))
    loops = loops_of(lm)
    if key in loops:
        loops.move_to_end(key)
    else:
        loops[key] = _GenerateLoop(lm, max_length, list(stops) or None, sampled,
                                   bool(jit_compile), step, padded.get("prefill_length"))
    while len(loops) > MAX_KEPT_LOOPS:  # the least recently used first
        loops.popitem(last=False)
    tokens = np.asarray(_predict(loops[key], inputs))
    check_generated(tokens, max_length)  # non-finite logits, once the values are known
    return ops.convert_to_tensor(tokens, "int32")


def _stream(lm, prompt_ids, max_length, step, *, streamer, **options):
    """A streamed generation: the prefill and each step called from Python (generation's
    `streamer`); on PyTorch the decoding steps are the traced step's where there is one,
    and everything runs without autograd."""
    batch = tuple(prompt_ids.shape)[0]
    next_token_fn = _model_step(lm)
    if step is not None:
        step.follow(lm.variables)
        next_token_fn = _prefill_eagerly_then(next_token_fn, step)

    def run():
        return generate_tokens(next_token_fn, prompt_ids, max_length,
                               _empty_caches(lm, batch, max_length), streamer=streamer,
                               recompute_cache_at=cache_recompute_lengths(lm), **options)

    if keras.backend.backend() == "torch":
        run = _device.compile_inference(run)  # under torch.no_grad(), nothing compiled
    return run()
