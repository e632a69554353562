"""`generate` with a streamer: the decoding loop in Python, one step and one `put` per token.

A compiled `keras.ops.while_loop` cannot call back into Python, so a streamed
generation runs the prefill and then each decoding step as separate calls of
`next_token_fn` (eager, or whatever `next_token_fn` compiles, such as PyTorch's traced
step), choosing each token exactly as the loop does (`keras_attn._sampling`'s chooser,
the same noise) and handing it to `streamer.put` as a NumPy `(B,)` int32 array.
"""

import numpy as np
from keras import ops

from keras_attn._observe import record_path
from keras_attn._sampling import make_chooser
from keras_attn._shapes import static_shape
from keras_attn._validation import concrete_value
from keras_attn.generation import _check_returned, _finish, check_capacity, check_stops_fit

__all__ = ["check_streamer", "stream_tokens"]


def check_streamer(streamer):
    """None, or an object with callable `put` and `end` (transformers' streamer protocol)."""
    if streamer is not None and not (callable(getattr(streamer, "put", None))
                                     and callable(getattr(streamer, "end", None))):
        raise ValueError("`streamer` must be None or an object with `put(value)` and `end()` "
                         f"methods (transformers' streamers). Received: streamer={streamer!r}")


def stream_tokens(next_token_fn, prompt, max_length, cache, *, stops, end_token_id, sampling,
                  recompute, streamer):
    """`generation._generate`'s tokens, each new one streamed; `streamer.end()` at the end.

    The loop ends, as the compiled one does, at `max_length` or once every row has
    emitted a stop token; the positions left are the first stop token, not streamed.
    """
    values = concrete_value(prompt)
    if values is None:
        raise ValueError("`streamer` needs a prompt whose values are known (an array or an "
                         "eager tensor): a streamed generation runs from Python, not inside "
                         "jax.jit or tf.function. Received: a traced prompt of shape "
                         f"{static_shape(prompt)}")
    record_path("streamed")
    batch, prompt_length = static_shape(prompt)
    streamer.put(np.asarray(values, "int32"))
    logits, cache = _check_returned(
        next_token_fn(prompt, cache, ops.convert_to_tensor(0, "int32")),
        cache, batch, prompt_length, None, prefill=True)
    vocabulary = static_shape(logits)[-1]
    check_stops_fit(stops, vocabulary, end_token_id)
    choose = make_chooser(sampling, max_length - prompt_length, batch, vocabulary)
    tokens = np.full((batch, max_length), stops[0] if stops else 0, "int32")
    tokens[:, :prompt_length] = values
    done = ops.zeros((batch,), dtype="bool")

    def emit(logits, index, done):
        """Choose the token at `index + 1` from `logits` (B, T, V); stream it."""
        chosen, done = _finish(choose(logits[:, -1], index - prompt_length + 1), done, stops)
        tokens[:, index + 1] = ops.convert_to_numpy(chosen)
        streamer.put(tokens[:, index + 1].copy())
        return done

    done = emit(logits, prompt_length - 1, done)
    index, checked = prompt_length, False
    while index < max_length - 1 and not bool(ops.convert_to_numpy(ops.all(done))):
        if index + 1 in recompute:  # all N = index + 1 tokens so far, at cache index 0
            token_ids = np.maximum(tokens[:, :index + 1], 0)
            logits, cache = next_token_fn(ops.convert_to_tensor(token_ids),
                                          cache, ops.convert_to_tensor(0, "int32"))
        else:  # a -1 (non-finite logits) is fed as id 0, as the compiled loop does
            token = ops.convert_to_tensor(np.maximum(tokens[:, index:index + 1], 0))
            given = cache
            result = next_token_fn(token, cache, ops.convert_to_tensor(index, "int32"))
            if checked:
                logits, cache = result
            else:
                logits, cache = _check_returned(result, given, batch, 1, vocabulary,
                                                prefill=False)
                check_capacity(given, cache, max_length)
                checked = True
        done = emit(logits, index, done)
        index += 1
    streamer.end()
    return ops.convert_to_tensor(tokens, "int32")
