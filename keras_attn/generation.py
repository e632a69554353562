"""Autoregressive generation over a key/value cache (keras.ops only).

`generate` runs a prefill over the prompt and then one decoding step per new
token inside `keras.ops.while_loop`, over buffers whose shapes never change,
so that a compiler traces the step once. Dimension letters: B batch, P
prompt length, L `max_length`, V vocabulary size.
"""

import numbers
from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np
from keras import ops

from keras_attn._generation_contract import _check_returned, check_capacity  # noqa: F401
from keras_attn._sampling import check_temperature as _check_temperature
from keras_attn._sampling import check_top_p, make_chooser, sampling_settings
from keras_attn._shapes import static_shape
from keras_attn._typing import Tensor
from keras_attn._validation import check_positive_int, concrete_value, dtype_of

__all__ = ["generate"]


def generate(next_token_fn: Callable[[Tensor, Any, Tensor], tuple[Tensor, Any]],
             prompt: Tensor, max_length: int, cache: Any, *,
             end_token_id: int | Sequence[int] | Tensor | None = None,
             temperature: float = 0.0, top_k: int | None = None,
             seed: int | keras.random.SeedGenerator | None = None,
             recompute_cache_at: int | Sequence[int] | None = None,
             top_p: float | None = None, streamer: Any = None,
             prompt_lengths: Tensor | None = None,
             prefill_length: int | None = None) -> Tensor:
    """Extend `prompt` token by token up to `max_length`, greedy or sampled.

    The contract of `next_token_fn(token_ids, cache, cache_update_index)`:

    - `token_ids` is int32 `(B, T)`: the whole prompt once (the prefill:
      T = P, `cache_update_index` 0), then one token at a time (T = 1) at
      position `cache_update_index`, a scalar int32 tensor (traced inside
      the loop, so it must not drive Python control flow).
    - It returns a tuple `(logits, cache)`. `logits` is floating
      `(B, T, V)`; only the last position is used, so `(B, 1, V)` is
      accepted on the prefill too. `cache` is whatever the function keeps
      between calls (a tensor, a `keras_attn.KVCache`, or a list/tuple/dict
      of them such as one `keras_attn.empty_cache(layer, B, L)` per decoder layer): it must
      come back with the structure (`keras.tree`: a list stays a list),
      the shapes and the dtypes it was given.

    The contract is checked on the prefill and on the first decoding step
    (at trace time, from static shapes, inside a compiled loop); a
    violation is a `ValueError` that states it.

    Stop tokens: with `end_token_id` set, a row stops at the first
    generated token that is one of the stop tokens. That token stays in
    place; every later position of the row holds the *first* stop token of
    the list (the only one, for a single id). The loop ends early once
    every row has stopped.

    Args:
        next_token_fn: `fn(token_ids, cache, cache_update_index) ->
            (logits, cache)`, as above.
        prompt: int `(B, P)` (a tensor, a NumPy array or nested lists),
            every row a full P tokens long, `0 < P < L`. Padding, if any,
            is `next_token_fn`'s to mask (see the example).
        max_length: L, the length of the returned sequences (prompt
            included). Caches must hold at least L - 1 positions: checked
            once, on the first decoding step, for every `KVCache` or
            keras-hub cache tensor in `cache` that the step writes.
        cache: the initial cache passed to the first call.
        end_token_id: None (always generate to `max_length`), one stop
            token id (a Python or NumPy int, a 0-d integer array or
            tensor), or several (a non-empty list/tuple of ints, or a 1-d
            integer array or tensor). Ids must satisfy `0 <= id < V` (V is
            checked once the prefill's logits are known) and, if tensors,
            be concrete: generate reads their values with
            `keras.ops.convert_to_numpy`, so a tensor traced by `jax.jit`
            or `tf.function` is refused.
        temperature: 0 (default) for greedy decoding (argmax; `top_k`,
            `top_p` and `seed` are then unused); a finite number > 0 to sample
            from `softmax(logits / temperature)`.
        top_k: with sampling, draw only among the k most likely tokens
            (a positive int; all of those tied with the k-th).
        seed: an int (any: taken modulo 2**32) or a
            `keras.random.SeedGenerator` for sampling. Every step's noise is
            drawn once before the loop (Gumbel-max: argmax of the filtered
            logits plus Gumbel noise is an exact sample; `(L - P) * B * V`
            floats); an int seed's comes from a hash in `keras.ops`
            (`keras_attn._sampling`): the same tokens on every backend.
        recompute_cache_at: None, or sequence lengths N (an int or several):
            the step that would feed the token at position N - 1 alone feeds
            instead all N tokens so far at `cache_update_index` 0 (a second
            prefill that rewrites the cache), when the prompt is shorter than
            N. What transformers' Phi-3 does where longrope switches to its
            long factors (`RopeSpec.cache_recompute_length`, which
            `CausalLM.generate` passes): the cached keys, rotated with the short
            factors, are recomputed, so that every step's logits are the
            uncached forward's over the sequence so far.
        top_p: None, or nucleus sampling's mass, `0 < top_p <= 1`:
            transformers' `TopPLogitsWarper` after the temperature and
            `top_k` (its order): the tokens whose cumulative probability, in
            increasing order, is `<= 1 - top_p` are dropped (the most likely
            is kept).
        streamer: None, or transformers' streamer protocol: `put(value)`
            gets the prompt (NumPy int32 `(B, P)`), then each new token
            `(B,)`; `end()` is called once. The tokens are those without a
            streamer, but the steps run from Python (one `next_token_fn`
            call and one host transfer per token, no compiled loop).
        prompt_lengths: None (every row P real tokens), or int `(B,)`: a
            right-padded prompt, row i's real tokens at positions
            `0 .. prompt_lengths[i] - 1` (each in `[1, P]`). The decoding
            starts from the shortest length; a row whose prompt is longer
            than the position being decoded is fed its own prompt token
            (teacher forcing), so every row's tokens are its own, decoded
            alone (`CausalLM.generate(padding_mask=...)` uses it). The
            prefill then needs the logits of all its T positions. Not with
            `recompute_cache_at`.
        prefill_length: None (the prefill takes all P prompt tokens; with
            `prompt_lengths`, slots past a row's length get values that the
            later steps overwrite before they are attended), or, with
            `prompt_lengths`, an int <= min(prompt_lengths): the prefill
            takes that many tokens, the steps the rest (for a recurrent
            state, into which a pad would fold).

    Returns:
        int32 `(B, L)`: the prompt, then the generated tokens.

    Example:

    Prompts of different real lengths, padded on the left with a pad id
    to one length P (so that every row's last prompt token is real, and
    the prefill's last logits are every row's next-token logits). The
    padding is masked inside `next_token_fn` by one key mask over the L
    cache slots (True = a real token: the prompt's real tokens, then
    every generated one), the same at every call. Rotary position
    embeddings see only relative positions, so the shift that the padding
    gives a row's positions does not matter; absolute position embeddings
    would need each row's offset.

    The embedding has `mask_zero=True`, as one trained on padded batches
    may: called as a layer it attaches a `(B, T)` Keras mask to its
    output, which a decoder call with a cache refuses (it does not cover
    the cache slots). The step looks the vectors up with
    `keras.ops.take(embedding.embeddings, ...)` instead, which attaches no
    Keras mask, and passes the padding as `padding_mask` `(B, L)`.

    >>> import keras
    >>> import numpy as np
    >>> from keras import ops
    >>> import keras_attn
    >>> B, P, L, V, D, PAD = 2, 3, 7, 11, 8, 0
    >>> embedding = keras.layers.Embedding(V, D, mask_zero=True)
    >>> decoder = keras_attn.TransformerDecoderLayer(
    ...     2, intermediate_dim=16, key_dim=4, rope_max_wavelength=100.0)
    >>> head = keras.layers.Dense(V)
    >>> prompt = np.array([[5, 6, 7],      # 3 real tokens
    ...                    [PAD, PAD, 8]])  # 1 real token, padded on the left
    >>> padding_mask = np.concatenate(      # (B, L), over the cache slots
    ...     [prompt != PAD, np.ones((B, L - P), bool)], axis=1)
    >>> def next_token_fn(token_ids, cache, index):
    ...     x = ops.take(embedding.embeddings, token_ids, axis=0)  # no Keras mask
    ...     x, cache = decoder(x, padding_mask=padding_mask, self_attention_cache=cache,
    ...                        self_attention_cache_update_index=index)
    ...     return head(x), cache
    >>> embedding.build((B, L)); decoder.build((B, L, D)); head.build((B, L, D))
    >>> tokens = generate(next_token_fn, prompt, L, keras_attn.empty_cache(decoder, B, L),
    ...                   end_token_id=[1, 2])
    >>> tuple(tokens.shape), bool((ops.convert_to_numpy(tokens)[:, :P] == prompt).all())
    ((2, 7), True)
    """
    prompt = ops.convert_to_tensor(prompt)
    shape = static_shape(prompt)
    if len(shape) != 2 or "int" not in keras.backend.standardize_dtype(prompt.dtype):
        raise ValueError("`prompt` must be an integer tensor (B, P). Received: "
                         f"prompt.shape={shape}, prompt.dtype={prompt.dtype}")
    batch, prompt_length = shape
    max_length = check_positive_int("max_length", max_length)
    if batch is None or prompt_length is None or not 0 < prompt_length < max_length:
        raise ValueError(
            "`prompt` needs a static shape (B, P) with 0 < P < max_length. "
            f"Received: prompt.shape={shape}, max_length={max_length}")
    temperature = _check_temperature(temperature)
    top_k = check_positive_int("top_k", top_k, allow_none=True)
    top_p = check_top_p(top_p)
    if streamer is not None:
        from keras_attn._streaming import check_streamer

        check_streamer(streamer)
    sampling = sampling_settings(temperature, top_k, top_p, seed) if temperature > 0 else None
    return generate_checked(next_token_fn, ops.cast(prompt, "int32"), max_length, cache,
                            end_token_id=end_token_id, sampling=sampling,
                            recompute_cache_at=recompute_cache_at, streamer=streamer,
                            prompt_lengths=prompt_lengths, prefill_length=prefill_length)


def generate_checked(next_token_fn, prompt, max_length, cache, *, end_token_id, sampling,
                     recompute_cache_at=None, streamer=None, prompt_lengths=None,
                     prefill_length=None):
    """`generate` on an int32 prompt of a checked shape, with `sampling` None (greedy) or
    `keras_attn._sampling.sampling_settings`'s dict, whose values may be tensors (the
    inputs of `CausalLM.generate`'s kept loop)."""
    batch, prompt_length = static_shape(prompt)
    stops = _stop_token_ids(end_token_id)  # a tuple of Python ints, () for None
    recompute = _recompute_lengths(recompute_cache_at)
    if prompt_lengths is not None:
        if recompute:
            raise ValueError("`prompt_lengths` (a padded prompt) cannot be combined with "
                             f"`recompute_cache_at`. Received: recompute_cache_at={recompute}")
        if streamer is not None:
            raise ValueError("`streamer` streams one prompt length: it cannot be combined "
                             "with `prompt_lengths` (a padded prompt). Received: "
                             "streamer and prompt_lengths both set")
        prompt_lengths = ops.cast(ops.convert_to_tensor(prompt_lengths), "int32")
        if static_shape(prompt_lengths) != (batch,):
            raise ValueError(f"`prompt_lengths` must be int (B,) = ({batch},). Received: "
                             f"prompt_lengths.shape={static_shape(prompt_lengths)}")
    if prefill_length is not None and (prompt_lengths is None or not (
            isinstance(prefill_length, numbers.Integral) and 0 < prefill_length <= prompt_length)):
        raise ValueError("`prefill_length` must be None or, with `prompt_lengths`, an int in "
                         f"[1, P]. Received: prefill_length={prefill_length!r}")
    if streamer is not None:
        from keras_attn._streaming import stream_tokens

        tokens = stream_tokens(next_token_fn, prompt, max_length, cache, stops=stops,
                               end_token_id=end_token_id, sampling=sampling,
                               recompute=recompute, streamer=streamer)
    else:
        tokens = _generate(next_token_fn, prompt, max_length, cache, stops=stops,
                           end_token_id=end_token_id, sampling=sampling, recompute=recompute,
                           prompt_lengths=prompt_lengths, prefill_length=prefill_length)
    check_generated(tokens, max_length)
    return tokens


def check_generated(tokens, max_length):
    """Raise if `generate`'s `tokens` hold a -1 (non-finite logits); nothing while traced."""
    bad = concrete_value(ops.any(ops.less(tokens, 0)))
    if bad is not None and bool(bad):
        raise ValueError(
            "`next_token_fn` returned NaN or infinite logits during the generation (a "
            "generated id is -1 where it did): a cache written past its end inside a "
            "compiled step gives NaN (see `keras_attn.MultiHeadAttention`'s "
            f"`cache_update_index`); caches need max_length - 1 = {max_length - 1} slots. "
            f"Received: max_length={max_length}")


def _recompute_lengths(value):
    """`recompute_cache_at` as a sorted tuple of distinct positive ints (() for None)."""
    if value is None:
        return ()
    values = [value] if isinstance(value, numbers.Integral) else value
    if isinstance(value, str | bytes) or not hasattr(values, "__iter__") or not all(
            isinstance(v, numbers.Integral) and not isinstance(v, bool) and v > 0
            for v in values):
        raise ValueError("`recompute_cache_at` must be None, a positive int or a sequence of "
                         f"them (sequence lengths). Received: recompute_cache_at={value!r}")
    return tuple(sorted({int(v) for v in values}))


def _generate(next_token_fn, prompt, max_length, cache, *, stops, end_token_id, sampling,
              recompute=(), prompt_lengths=None, prefill_length=None):
    """The prefill and the decoding loop, on checked arguments.

    With `prompt_lengths` (a right-padded prompt), `start` (the first position decoded) is
    the shortest length, a tensor, and `forced` keeps each row's own prompt tokens."""
    batch, prompt_length = static_shape(prompt)
    padded = prompt_lengths is not None
    prefill = prompt if prefill_length is None else prompt[:, :prefill_length]
    logits, cache = _check_returned(
        next_token_fn(prefill, cache, ops.convert_to_tensor(0, "int32")),
        cache, batch, static_shape(prefill)[1], None, prefill=True)
    start = prompt_length
    if padded and prefill_length is not None:
        start = prefill_length  # the steps feed the rest
    elif padded:
        start = ops.min(prompt_lengths)
        # The logits of each position are needed: the shortest row's last.
        if static_shape(logits)[1] == 1 and prompt_length > 1:
            raise ValueError("With `prompt_lengths`, the prefill's logits must cover its "
                             f"T = {prompt_length} positions. Received: logits.shape="
                             f"{static_shape(logits)}")
        logits = ops.expand_dims(ops.take(logits, start - 1, axis=1), 1)
    # The generated positions `offset ..` index the noise (offset 1 with a padded prompt,
    # whose rows start at different positions).
    offset = 1 if padded else prompt_length
    vocabulary = static_shape(logits)[-1]
    check_stops_fit(stops, vocabulary, end_token_id)
    choose = make_chooser(sampling, max_length - offset, batch, vocabulary)

    fill = stops[0] if stops else 0
    tokens = ops.full((batch, max_length), fill, dtype="int32")
    tokens = ops.slice_update(tokens, [0, 0], prompt)

    def forced(chosen, position):
        """Rows whose prompt covers `position` keep its token (and are not done by it)."""
        if not padded:
            return chosen, None
        kept = ops.less(position, prompt_lengths)  # (B,)
        own = ops.take(tokens, ops.minimum(position, max_length - 1), axis=1)
        return ops.where(kept, own, chosen), ops.logical_not(kept)

    first = choose(logits[:, -1], start - offset)
    done = ops.zeros((batch,), dtype="bool")
    first, active = forced(first, start)
    first, done = _finish(first, done, stops, active)
    tokens = ops.slice_update(tokens, [0, start], ops.expand_dims(first, 1))

    def cond(index, tokens, cache, done):
        return ops.logical_and(ops.less(index, max_length - 1),
                               ops.logical_not(ops.all(done)))

    # The first step's result is checked once: at trace time in a compiled
    # loop, and not again at every step of an eager (PyTorch, NumPy) one.
    step_checked = []

    def body(index, tokens, cache, done):
        # (B, 1); a -1 (non-finite logits, see `choose`) is fed as id 0, never as -1.
        token = ops.maximum(ops.slice(tokens, [0, index], [batch, 1]), 0)
        result = next_token_fn(token, cache, index)
        if step_checked:
            logits, cache = result
        else:
            given = cache
            logits, cache = _check_returned(result, cache, batch, 1, vocabulary,
                                            prefill=False)
            check_capacity(given, cache, max_length)
            step_checked.append(True)
        chosen = choose(logits[:, -1], index + 1 - offset)
        chosen, active = forced(chosen, index + 1)
        chosen, done = _finish(chosen, done, stops, active)
        tokens = ops.slice_update(tokens, [0, index + 1], ops.expand_dims(chosen, 1))
        return index + 1, tokens, cache, done

    def until(stop):  # the loop over the indices up to `stop` (excluded)
        def cond_until(index, tokens, cache, done):
            return ops.logical_and(ops.less(index, stop), cond(index, tokens, cache, done))
        return cond_until

    def recompute_step(index, tokens, cache, done):
        """At the (static) `index` N - 1: all N tokens so far, at cache index 0."""
        token_ids = ops.maximum(ops.slice(tokens, [0, 0], [batch, index + 1]), 0)  # (B, N)
        logits, cache = next_token_fn(token_ids, cache, ops.convert_to_tensor(0, "int32"))
        chosen = choose(logits[:, -1], index - prompt_length + 1)
        chosen, done = _finish(chosen, done, stops)
        tokens = ops.slice_update(tokens, [0, index + 1], ops.expand_dims(chosen, 1))
        return index + 1, tokens, cache, done

    state = (ops.cast(ops.convert_to_tensor(start), "int32"), tokens, cache, done)
    for length in recompute:
        if not prompt_length < length <= max_length - 1:
            continue  # the prompt is that long already, or no step reaches it
        state = ops.while_loop(until(length - 1), body, state)
        # The loop stops at N - 1 (or earlier when every row is done; the step then only
        # writes stop tokens, which `_finish` gives done rows).
        state = (ops.convert_to_tensor(length - 1, "int32"),) + tuple(
            recompute_step(length - 1, *state[1:]))[1:]
    _, tokens, _, _ = ops.while_loop(cond, body, state)
    return tokens


def check_stops_fit(stops, vocabulary, end_token_id):
    """Every stop token is an id < V, once the prefill's logits tell V."""
    if vocabulary is not None and any(stop >= vocabulary for stop in stops):
        raise ValueError(
            f"`end_token_id` must hold token ids < V = {vocabulary} (the last axis of "
            f"the logits). Received: end_token_id={_describe(end_token_id)}")


def _finish(chosen, done, stops, active=None):
    """Rows already done emit the first stop token; a row that emits any stop token is done
    (among the `active` rows, if given: those generating, not fed their prompt)."""
    if not stops:
        return chosen, done
    chosen = ops.where(done, stops[0], chosen)
    hit = ops.equal(chosen, stops[0])
    for stop in stops[1:]:
        hit = ops.logical_or(hit, ops.equal(chosen, stop))
    if active is not None:
        hit = ops.logical_and(hit, active)
    return chosen, ops.logical_or(done, hit)


_END_TOKEN_RULE = (
    "`end_token_id` must be None, a token id (a non-negative int: Python, NumPy, or a "
    "0-d integer array or tensor) or several (a non-empty list/tuple of them, or a 1-d "
    "integer array or tensor)")


def _stop_token_ids(end_token_id):
    """The stop tokens as a tuple of Python ints (in the order given), () for None."""
    if end_token_id is None:
        return ()

    def fail(detail=""):
        raise ValueError(f"{_END_TOKEN_RULE}{detail}. Received: "
                         f"end_token_id={_describe(end_token_id)}")

    if isinstance(end_token_id, (list, tuple)):
        values = []
        for item in end_token_id:
            item = _integer_values(item, fail)
            if item.ndim != 0:
                fail(" (a list/tuple holds scalar ids)")
            values.append(item)
        values = np.asarray(values, "int64")
    else:
        values = _integer_values(end_token_id, fail)
        if values.ndim > 1:
            fail(f" (rank 0 or 1, not {values.ndim})")
    values = values.reshape(-1)
    if values.size == 0:
        fail(" (at least one id)")
    if (values < 0).any():
        fail(" (ids are >= 0)")
    return tuple(int(v) for v in values)


def _integer_values(value, fail):
    """`value` as a NumPy integer array, or `fail()` for floats, bools and non-numbers."""
    if isinstance(value, (bool, np.bool_)):
        fail()
    if isinstance(value, numbers.Integral):
        return np.asarray(int(value), "int64")
    if isinstance(value, (np.ndarray, np.generic)):
        array = value
    elif ops.is_tensor(value) or hasattr(value, "__array__"):
        array = concrete_value(value)
        if array is None:
            fail(" whose value is known when `generate` is called (not a tensor "
                 "traced by jax.jit or tf.function)")
    else:
        fail()
    if array.dtype.kind not in "iu":
        fail()
    return np.asarray(array, "int64")


def _describe(value):
    """`value` for an error message, on one line (tensors and arrays with their dtype)."""
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_describe(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
    if isinstance(value, (np.ndarray, np.generic)):
        return repr(value).replace("\n", "")
    if ops.is_tensor(value):
        dtype = dtype_of(value)
        shown = concrete_value(value)
        shown = "traced" if shown is None else shown.tolist()
        return f"tensor({shown}, shape={static_shape(value)}, dtype={dtype})"
    return repr(value)
