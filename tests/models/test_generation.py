"""`keras_attn.generation.generate` against a plain loop over the uncached model."""

import doctest
import re

import keras
import numpy as np
import pytest
from keras import ops

import keras_attn
from keras_attn import _device, generation
from keras_attn.generation import generate
from keras_attn.testing.weights import randomize_weights

from ..helpers import to_numpy

B, P, L, V, D = 2, 3, 7, 11, 8


class _TinyLM:
    """Embedding -> one decoder-only block (GQA + RoPE) -> logits, with and without a cache."""

    def __init__(self):
        self.embedding = keras.layers.Embedding(V, D)
        self.block = keras_attn.TransformerDecoderLayer(
            2, intermediate_dim=16, key_dim=4, num_key_value_heads=1,
            rope_max_wavelength=100.0, normalize_first=True)
        self.head = keras.layers.Dense(V)
        self.embedding.build((B, L))
        self.block.build((B, L, D))
        self.head.build((B, L, D))
        for layer, seed in ((self.embedding, 1), (self.block, 2), (self.head, 3)):
            randomize_weights(layer, seed=seed, scale=0.3)  # logits O(1)

    def logits(self, token_ids, padding_mask=None):
        return self.head(self.block(self.embedding(token_ids), padding_mask=padding_mask))

    def next_token_fn(self, token_ids, cache, index):
        x, cache = self.block(self.embedding(token_ids), self_attention_cache=cache,
                              self_attention_cache_update_index=index)
        return self.head(x), cache

    def cache(self):
        return keras_attn.empty_cache(self.block, B, L)


def _prompt():
    return np.random.default_rng(0).integers(0, V, (B, P)).astype("int32")


def _assert_greedy(model, tokens):
    """Each generated token is the argmax of the uncached model's logits before it.

    The model is causal, so one forward over the sequence gives every step's
    logits (one shape to compile, not one per length).
    """
    logits = to_numpy(model.logits(tokens[:, :-1]))  # (B, L - 1, V)
    np.testing.assert_array_equal(tokens[:, P:], logits[:, P - 1:].argmax(-1))


def test_greedy_and_end_token():
    model = _TinyLM()
    expected = to_numpy(generate(model.next_token_fn, _prompt(), L, model.cache()))
    np.testing.assert_array_equal(expected[:, :P], _prompt())
    _assert_greedy(model, expected)
    assert len(set(expected[:, P:].ravel())) > 1, "a constant output would test little"
    # Row 0 stops at the token it emits at position P + 1; row 1 goes on unless it
    # emits it too. Everything after a row's end token is the end token.
    end = int(expected[0, P + 1])
    stopped = to_numpy(generate(model.next_token_fn, _prompt(), L, model.cache(),
                                end_token_id=end))
    for row in range(B):
        hits = np.flatnonzero(expected[row, P:] == end)
        cut = P + hits[0] + 1 if hits.size else L
        np.testing.assert_array_equal(stopped[row, :cut], expected[row, :cut])
        assert (stopped[row, cut:] == end).all()


def test_sampling_is_seeded_and_top_k_1_is_greedy():
    model = _TinyLM()
    greedy = to_numpy(generate(model.next_token_fn, _prompt(), L, model.cache()))
    top1 = to_numpy(generate(model.next_token_fn, _prompt(), L, model.cache(),
                             temperature=0.7, top_k=1, seed=5))
    np.testing.assert_array_equal(top1, greedy)
    first, again = (to_numpy(generate(model.next_token_fn, _prompt(), L, model.cache(),
                                      temperature=2.0, top_k=4, seed=7)) for _ in range(2))
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(first[:, :P], _prompt())
    assert ((first >= 0) & (first < V)).all()
    # With 4 candidates at temperature 2, 8 sampled tokens all equal to greedy's
    # would be a coincidence: sampling must change something.
    assert (first[:, P:] != greedy[:, P:]).any()


def test_generate_rejects_bad_arguments():
    model = _TinyLM()
    with pytest.raises(ValueError, match=r"0 < P < max_length.*max_length=3"):
        generate(model.next_token_fn, _prompt(), 3, model.cache())
    with pytest.raises(ValueError, match=r"Received: temperature=-1"):
        generate(model.next_token_fn, _prompt(), L, model.cache(), temperature=-1)
    with pytest.raises(ValueError, match=r"Received: top_k=0"):
        generate(model.next_token_fn, _prompt(), L, model.cache(), temperature=1.0, top_k=0)
    with pytest.raises(ValueError, match=r"integer tensor \(B, P\)"):
        generate(model.next_token_fn, _prompt().astype("float32"), L, model.cache())


def _python_loop(model, prompt, stops=(), padding_mask=None):
    """Greedy decoding by a plain Python loop over the uncached model, stop rule included.

    Each step runs the model over `(B, L - 1)` tokens (one shape for every step:
    the positions not generated yet are zeros, which a causal model never sees
    from the position it predicts from). A row stops at the first token it emits
    that is in `stops`; later positions hold `stops[0]`.
    """
    tokens = np.zeros((B, L), "int32")
    tokens[:, :P] = prompt
    done = np.zeros((B,), bool)
    for t in range(P, L):
        logits = to_numpy(model.logits(tokens[:, :-1], padding_mask))
        chosen = logits[:, t - 1].argmax(-1)
        if stops:
            chosen = np.where(done, stops[0], chosen)
            done |= np.isin(chosen, stops)
        tokens[:, t] = chosen
    return tokens


def test_several_stop_tokens_against_a_python_loop():
    model = _TinyLM()
    greedy = _python_loop(model, _prompt())
    # Row 0 emits `a` at its second step, row 1 `b` at its third; `c` is never emitted.
    a, b = int(greedy[0, P + 1]), int(greedy[1, P + 2])
    c = min(set(range(V)) - set(greedy.ravel().tolist()))
    assert a != b
    for stops in ([a, b, c], (b, c, a)):
        expected = _python_loop(model, _prompt(), tuple(stops))
        tokens = to_numpy(generate(model.next_token_fn, _prompt(), L, model.cache(),
                                   end_token_id=stops))
        np.testing.assert_array_equal(tokens, expected, err_msg=f"stops={stops}")
        # What the rule means, row by row: the first stop token emitted stays; after
        # it, the first stop token of the list. Some row must stop on another one.
        other = False
        for row in range(B):
            hits = np.flatnonzero(np.isin(greedy[row, P:], stops))
            if not hits.size:
                np.testing.assert_array_equal(tokens[row], greedy[row])
                continue
            cut = P + hits[0] + 1
            np.testing.assert_array_equal(tokens[row, :cut], greedy[row, :cut])
            assert (tokens[row, cut:] == stops[0]).all()
            other |= bool(greedy[row, cut - 1] != stops[0] and cut < L)
        assert other, f"stops={stops}: no row stopped on a stop token other than the first"


def test_end_token_id_forms():
    """NumPy ints, 0-d and 1-d integer tensors, tuples: all read as Python ints.

    `np.int64` used to reach XLA as an int64 operand next to int32 tokens on
    TensorFlow (an InvalidArgumentError in XlaDynamicUpdateSlice).
    """
    model = _TinyLM()
    greedy = _python_loop(model, _prompt())
    a, b = int(greedy[0, P + 1]), int(greedy[1, P + 2])
    single = _python_loop(model, _prompt(), (a,))
    several = _python_loop(model, _prompt(), (a, b))
    wide = "int32" if keras.backend.backend() == "jax" else "int64"  # JAX: int64 needs x64
    for end, expected in (
            (np.int64(a), single),
            (ops.convert_to_tensor(a, wide), single),
            (ops.convert_to_tensor([a, b], wide), several),
            ((np.int32(a), np.array(b)), several)):
        tokens = to_numpy(generate(model.next_token_fn, _prompt(), L, model.cache(),
                                   end_token_id=end))
        np.testing.assert_array_equal(tokens, expected, err_msg=repr(end))


def _float_tensor():
    return ops.convert_to_tensor(4.0, "float32")


_BAD_END_TOKEN_IDS = {
    # name: a function returning the value (built at run time: tensors need the backend)
    "float": lambda: 1.0,
    "numpy_float": lambda: np.float32(4),
    "float_tensor": _float_tensor,
    "bool": lambda: True,
    "numpy_bool": lambda: np.bool_(True),
    "negative": lambda: -1,
    "negative_in_list": lambda: [4, -2],
    "empty_list": lambda: [],
    "float_in_tuple": lambda: (4, 1.0),
    "2d_array": lambda: np.array([[4]]),
    "string": lambda: "4",
    "vocabulary_size": lambda: V,  # ids are < V, known after the prefill
    "above_vocabulary_in_list": lambda: [3, V + 5],
}


@pytest.mark.parametrize("name", sorted(_BAD_END_TOKEN_IDS))
def test_end_token_id_is_checked(name):
    value = _BAD_END_TOKEN_IDS[name]()
    received = repr(value)  # Python values and NumPy arrays (the NumPy backend's tensors)
    if name == "float_tensor" and keras.backend.backend() != "numpy":
        received = "tensor(4.0, shape=(), dtype=float32)"
    model = _TinyLM()
    with pytest.raises(ValueError, match=r"`end_token_id` must .* Received: end_token_id="
                                         + re.escape(received) + "$"):
        generate(model.next_token_fn, _prompt(), L, model.cache(), end_token_id=value)


def test_end_token_id_must_be_concrete():
    """A stop token traced by jax.jit / tf.function has no value to read: refused."""
    model = _TinyLM()
    end = int(_python_loop(model, _prompt())[0, P + 1])
    run = _device.compile_inference(
        lambda prompt, end: generate(model.next_token_fn, prompt, L, model.cache(),
                                     end_token_id=end))
    if keras.backend.backend() in ("jax", "tensorflow"):
        with pytest.raises(ValueError, match=r"`end_token_id` .* known when `generate` is "
                                             r"called \(not a tensor traced"):
            run(_prompt(), ops.convert_to_tensor(end, "int32"))
    else:  # eager: nothing is traced
        np.testing.assert_array_equal(to_numpy(run(_prompt(), ops.convert_to_tensor(end))),
                                      _python_loop(model, _prompt(), (end,)))


@pytest.mark.parametrize("value", [
    float("nan"), float("inf"), float("-inf"), np.float32("nan"), -0.5, np.int64(-1), True,
    np.bool_(True), "1.0", None, [1.0]], ids=repr)
def test_temperature_is_checked(value):
    model = _TinyLM()
    with pytest.raises(ValueError, match=r"`temperature` must be a finite number >= 0.*"
                                         r"Received: temperature=" + re.escape(repr(value)) + "$"):
        generate(model.next_token_fn, _prompt(), L, model.cache(), temperature=value)


@pytest.mark.parametrize("value", [0, -3, np.int64(0), 2.0, np.float32(2), True, "2"],
                         ids=repr)
def test_top_k_is_checked(value):
    model = _TinyLM()
    with pytest.raises(ValueError, match=r"`top_k` must be a positive integer\. "
                                         r"Received: top_k=" + re.escape(repr(value)) + "$"):
        generate(model.next_token_fn, _prompt(), L, model.cache(), temperature=1.0, top_k=value)


def test_numpy_temperature_and_top_k():
    """NumPy scalars are accepted: temperature np.float32 with top_k np.int64(1) is greedy."""
    model = _TinyLM()
    tokens = to_numpy(generate(model.next_token_fn, _prompt(), L, model.cache(),
                               temperature=np.float32(0.7), top_k=np.int64(1), seed=3))
    _assert_greedy(model, tokens)


@pytest.mark.parametrize("kind", ["numpy", "list", "tensor"])
def test_float_prompt_is_refused(kind):
    model = _TinyLM()
    prompt = _prompt().astype("float32")
    prompt = {"numpy": prompt, "list": prompt.tolist(),
              "tensor": ops.convert_to_tensor(prompt)}[kind]
    with pytest.raises(ValueError, match=r"`prompt` must be an integer tensor \(B, P\)\. "
                                         r"Received: prompt\.shape=\(2, 3\), prompt\.dtype="):
        generate(model.next_token_fn, prompt, L, model.cache())


def _breaks_contract(model, how, steps_only):
    """A `next_token_fn` that breaks its contract as `how` says (on steps only, or always)."""

    def fn(token_ids, cache, index):
        broken = not steps_only or token_ids.shape[1] == 1  # static: T = 1 on the steps
        listed = isinstance(cache, list)
        logits, new = model.next_token_fn(token_ids, cache[0] if listed else cache, index)
        if listed:
            new = [new]
        if not broken:
            return logits, new
        return {
            "logits_BV": lambda: (logits[:, -1], new),
            "logits_only": lambda: logits,
            "integer_logits": lambda: (ops.cast(logits, "int32"), new),
            "cache_none": lambda: (logits, None),
            "cache_grows": lambda: (logits, ops.concatenate([new, new[:, :, :1]], axis=2)),
            "cache_dtype": lambda: (logits, ops.cast(new, "float16")),
            "two_caches_for_one": lambda: (logits, [new[0], new[0]]),
            "tuple_for_list": lambda: (logits, tuple(new)),
        }[how]()

    return fn


_CONTRACT = re.escape("`next_token_fn` must return `(logits, cache)`: logits (B, T, V) = ")
_CACHE = (2, 2, L, 1, 4)
_BROKEN = {
    # how: (whether the cache is a list of one tensor, the end of the message as a regex;
    # <T> stands for the call's T)
    "logits_BV": (False, re.escape(f"Received: logits.shape=(2, {V})")),
    "logits_only": (False, re.escape(f" of shape (2, <T>, {V}) and dtype float32, not a pair "
                                     "`(logits, cache)`")),
    "integer_logits": (False, re.escape("Received: logits.dtype=int32")),
    "cache_none": (False, re.escape(f"Received: cache=None for a tensor of shape {_CACHE}")),
    "cache_grows": (False, re.escape(f"Received: cache.shape=(2, 2, {L + 1}, 1, 4) for {_CACHE}")),
    "cache_dtype": (False, re.escape("Received: cache.dtype=float16 for float32")),
    "two_caches_for_one": (True, re.escape(f"Received: a cache of structure [{_CACHE}, {_CACHE}] "
                                           f"for [{_CACHE}]")),
    "tuple_for_list": (True, re.escape(f"Received: a cache of structure ({_CACHE},) "
                                       f"for [{_CACHE}]")),
}


@pytest.mark.parametrize("steps_only", [False, True], ids=["prefill", "step"])
@pytest.mark.parametrize("how", sorted(_BROKEN))
def test_next_token_fn_contract(how, steps_only):
    """Checked on the prefill and on the first decoding step, with a message that states it."""
    listed, received = _BROKEN[how]
    model = _TinyLM()
    cache = [model.cache()] if listed else model.cache()
    length = 1 if steps_only else P
    expected = (f"\\(2, {length}, {V if steps_only else 'V'}\\)"
                + ("" if steps_only else " \\(or \\(2, 1, V\\)\\)"))
    call = "a decoding step, T = 1" if steps_only else f"the prefill, T = {P}"
    received = received.replace("<T>", str(length))
    with pytest.raises(ValueError, match=_CONTRACT + expected + " floating, .*"
                                         + re.escape(f"(checked on {call}).") + ".*" + received
                                         + r"(\n|$)"):  # (JAX may append a note on a new line)
        generate(_breaks_contract(model, how, steps_only), _prompt(), L, cache)


def test_next_token_fn_contract_under_compilation():
    """The step's check runs at trace time (static shapes) inside jax.jit / tf.function."""
    model = _TinyLM()
    run = _device.compile_inference(lambda prompt: generate(
        _breaks_contract(model, "cache_grows", steps_only=True), prompt, L, model.cache()))
    with pytest.raises(ValueError, match=r"checked on a decoding step, T = 1\)\. Received: "
                                         + re.escape(f"cache.shape=(2, 2, {L + 1}, 1, 4)")):
        run(_prompt())


def test_next_token_fn_contract_is_checked_once_per_call(monkeypatch):
    """The prefill and the first step: an eager loop (PyTorch, NumPy) does not re-check."""
    calls = []
    check = generation._check_returned

    def counted(*args, **kwargs):
        calls.append(kwargs["prefill"])
        return check(*args, **kwargs)

    monkeypatch.setattr(generation, "_check_returned", counted)
    model = _TinyLM()
    steps = []

    def next_token_fn(token_ids, cache, index):
        steps.append(token_ids.shape[1])
        return model.next_token_fn(token_ids, cache, index)

    tokens = to_numpy(generate(next_token_fn, _prompt(), L, model.cache()))
    _assert_greedy(model, tokens)
    assert calls == [True, False]
    assert steps[0] == P and len(steps) >= 2  # a compiled loop traces its body once


def test_left_padded_prompts_and_a_mask_zero_embedding():
    """Ragged prompts padded on the left, masked over the cache slots (the docstring's example).

    The embedding was trained with `mask_zero=True`: called as a layer it attaches
    a (B, T) Keras mask, which a cached decoder call refuses; `ops.take` over its
    table gives the same vectors without one, and `padding_mask` (B, L) marks the
    padded cache slots instead.
    """
    pad = 0
    model = _TinyLM()
    embedding = keras.layers.Embedding(V, D, mask_zero=True)
    embedding.build((B, L))
    embedding.set_weights(model.embedding.get_weights())
    prompt = np.array([[9, 7, 5], [pad, pad, 3]], "int32")  # row 1: one real token
    slots = np.concatenate([prompt != pad, np.ones((B, L - P), bool)], axis=1)  # (B, L)
    with pytest.raises(ValueError, match=r"`padding_mask` of shape \(B, S_max\)"):
        model.block(embedding(prompt), self_attention_cache=model.cache(),
                    self_attention_cache_update_index=0)

    def next_token_fn(token_ids, cache, index):
        x = ops.take(embedding.embeddings, token_ids, axis=0)  # no Keras mask
        x, cache = model.block(x, padding_mask=slots, self_attention_cache=cache,
                               self_attention_cache_update_index=index)
        return model.head(x), cache

    tokens = to_numpy(generate(next_token_fn, prompt, L, model.cache()))
    np.testing.assert_array_equal(tokens, _python_loop(model, prompt, padding_mask=slots[:, :-1]))
    # The padding is masked: other ids in the padded slots change nothing.
    other = prompt.copy()
    other[1, :2] = [6, 2]
    again = to_numpy(generate(next_token_fn, other, L, model.cache()))
    np.testing.assert_array_equal(again[:, P:], tokens[:, P:])
    # The mask_zero model's own Keras mask (uncached) predicts the same first token:
    # over the prompt, that mask and `padding_mask` are the same mask.
    masked = to_numpy(model.head(model.block(embedding(tokens[:, :-1]))))
    np.testing.assert_array_equal(masked[:, P - 1].argmax(-1), tokens[:, P])


def test_docstring_example_runs():
    """The `Example:` block of `generate`'s docstring runs as written."""
    namespace = {"generate": generate}
    test = doctest.DocTestParser().get_doctest(generate.__doc__, namespace, "generate", None, 0)
    runner = doctest.DocTestRunner()
    runner.run(test, clear_globs=False)
    assert runner.failures == 0 and runner.tries > 5
    tokens, prompt = to_numpy(test.globs["tokens"]), test.globs["prompt"]
    assert tokens.shape == (B, L) and tokens.dtype == np.int32
    np.testing.assert_array_equal(tokens[:, :P], prompt)
    assert ((tokens >= 0) & (tokens < V)).all()
    for row in tokens:  # after the first stop token (1 or 2), only 1
        hits = np.flatnonzero(np.isin(row[P:], [1, 2]))
        if hits.size:
            assert (row[P + hits[0] + 1:] == 1).all()
