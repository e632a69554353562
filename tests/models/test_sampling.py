"""Sampling (temperature, top_k, top_p), the sampling settings as inputs of the kept
compiled loop, the seeded noise, and streaming (issue 38 item 3)."""

import keras
import numpy as np
import pytest
from keras import ops

import keras_attn
from keras_attn import _sampling
from keras_attn.generation import generate
from keras_attn.models import _generate_loop

from ..helpers import to_numpy
from .test_generation import B, L, P, V, _prompt, _TinyLM

# (temperature, top_k, top_p) over (B, V) logits; each filter matters in some row.
SETTINGS = [(1.0, None, 0.9), (0.7, None, 0.5), (1.3, 4, 0.8), (1.0, 3, 0.6), (2.0, 6, None),
            (1.0, None, 1.0), (0.5, 2, 0.99)]


def _logits(rows=6, vocabulary=V, seed=0):
    return np.random.default_rng(seed).normal(0.0, 2.0, (rows, vocabulary)).astype("float32")


def _reference(logits, temperature, top_k, top_p):
    """transformers' Temperature, TopK and TopP warpers (in that order), in NumPy float32."""
    scores = logits.astype("float32") / np.float32(temperature)
    if top_k is not None:
        kth = np.sort(scores, axis=-1)[:, -min(top_k, scores.shape[-1])][:, None]
        scores = np.where(scores < kth, -np.inf, scores)
    if top_p is not None and top_p < 1.0:
        order = np.argsort(scores, axis=-1, kind="stable")  # ascending
        ascending = np.take_along_axis(scores, order, axis=-1)
        shifted = np.exp(ascending - ascending[:, -1:])
        cumulative = np.cumsum(shifted / shifted.sum(-1, keepdims=True), axis=-1)
        remove = cumulative <= np.float32(1 - top_p)
        remove[:, -1] = False  # min_tokens_to_keep=1
        np.put_along_axis(remove, order, remove.copy(), axis=-1)
        scores = np.where(remove, -np.inf, scores)
    return scores


def _filtered(logits, temperature, top_k, top_p):
    return to_numpy(_sampling.filter_logits(ops.convert_to_tensor(logits), temperature,
                                            top_k or 0, _sampling.top_p_cut(top_p)))


@pytest.mark.parametrize("temperature, top_k, top_p", SETTINGS)
def test_filter_matches_a_numpy_reference(temperature, top_k, top_p):
    logits = _logits()
    expected, got = _reference(logits, temperature, top_k, top_p), _filtered(
        logits, temperature, top_k, top_p)
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(expected))
    kept = np.isfinite(expected)
    np.testing.assert_allclose(got[kept], expected[kept], rtol=1e-6)
    assert 1 <= kept.sum(-1).min() and (top_p in (None, 1.0) or kept.sum() < kept.size)


def test_filter_matches_transformers_warpers():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    logits = _logits(rows=8, seed=1)
    for temperature, top_k, top_p in SETTINGS:
        scores = torch.tensor(logits)
        warpers = [TemperatureLogitsWarper(temperature)]
        warpers += [TopKLogitsWarper(top_k)] if top_k is not None else []
        warpers += [TopPLogitsWarper(top_p)] if top_p not in (None, 1.0) else []
        for warper in warpers:
            scores = warper(None, scores)
        expected = scores.numpy()
        got = _filtered(logits, temperature, top_k, top_p)
        np.testing.assert_array_equal(np.isfinite(got), np.isfinite(expected),
                                      err_msg=str((temperature, top_k, top_p)))
        kept = np.isfinite(expected)
        np.testing.assert_allclose(got[kept], expected[kept], rtol=1e-6)


def test_top_p_removes_a_cumulative_probability_equal_to_the_cut():
    """`<=`, not `<`: the cut set to the cumulative probability of the j-th least likely
    token (computed by the same ops) removes it, and keeps the next one."""
    logits = _logits(rows=1)
    ascending = ops.sort(ops.convert_to_tensor(logits), axis=-1)
    cumulative = to_numpy(ops.cumsum(ops.softmax(ascending, axis=-1), axis=-1))[0]
    order = np.argsort(logits[0])
    for j in (2, 5, V - 3):
        got = to_numpy(_sampling.filter_logits(ops.convert_to_tensor(logits), 1.0, 0,
                                               np.float32(cumulative[j])))[0]
        assert not np.isfinite(got[order[:j + 1]]).any(), j
        assert np.isfinite(got[order[j + 1:]]).all(), j


def test_gumbel_noise_is_the_same_hash_on_every_backend():
    """The noise of an int seed (modulo 2**32) against a NumPy uint32 reimplementation."""
    def mix(x):
        x = x & 0xFFFFFFFF
        x ^= x >> 16
        x = (x * 0x7FEB352D) & 0xFFFFFFFF
        x ^= x >> 15
        x = (x * 0x846CA68B) & 0xFFFFFFFF
        return x ^ (x >> 16)

    for seed in (0, 7, 2**31 + 7, -3, 2**40 + 7):
        words = _sampling.seed_pair(seed).astype(np.int64) & 0xFFFFFFFF
        k0 = mix(words[0] ^ 0x9E3779B9)
        k1 = mix(words[1] ^ k0 ^ 0x85EBCA6B)
        bits = mix(mix(np.arange(2 * 3 * V, dtype=np.int64) ^ k0) ^ k1)
        uniform = ((bits >> 9).astype("float32") + np.float32(0.5)) * np.float32(2.0 ** -23)
        expected = -np.log(-np.log(uniform)).reshape(2, 3, V)
        got = to_numpy(_sampling.gumbel_noise(ops.convert_to_tensor(
            _sampling.seed_pair(seed)), (2, 3, V)))
        np.testing.assert_allclose(got, expected, atol=1e-5)
    assert (_sampling.seed_pair(2**40 + 7) == _sampling.seed_pair(7)).all()


def _allowed(model, tokens, temperature, top_k, top_p):
    """Per generated position, the tokens the filter allows, from the uncached model."""
    logits = to_numpy(model.logits(tokens[:, :-1]))[:, P - 1:]  # (B, L - P, V)
    return np.stack([np.isfinite(_reference(logits[:, i], temperature, top_k, top_p))
                     for i in range(L - P)], axis=1)


def test_sampled_tokens_come_from_the_allowed_set_and_tiny_top_p_is_greedy():
    model = _TinyLM()
    greedy = to_numpy(generate(model.next_token_fn, _prompt(), L, model.cache()))
    tiny = to_numpy(generate(model.next_token_fn, _prompt(), L, model.cache(),
                             temperature=1.0, top_p=1e-6, seed=1))
    np.testing.assert_array_equal(tiny, greedy)
    settings = (1.5, 6, 0.7)
    drawn = []
    for seed in (1, 2):
        tokens = to_numpy(generate(model.next_token_fn, _prompt(), L, model.cache(),
                                   temperature=settings[0], top_k=settings[1],
                                   top_p=settings[2], seed=seed))
        allowed = _allowed(model, tokens, *settings)
        chosen = np.take_along_axis(allowed, tokens[:, P:, None], axis=-1)
        assert chosen.all(), (seed, tokens)
        drawn.append(tokens)
    assert (allowed.sum(-1) > 1).any()  # a real choice at some step
    assert any((d != greedy).any() for d in drawn)  # and sampling made one


class _Collect:
    """transformers' streamer protocol: `put(value)`, `end()`."""

    def __init__(self):
        self.values, self.ended = [], 0

    def put(self, value):
        assert self.ended == 0
        self.values.append(np.array(value))

    def end(self):
        self.ended += 1


def _check_stream(streamer, tokens):
    assert streamer.ended == 1
    np.testing.assert_array_equal(streamer.values[0], tokens[:, :P])
    new = streamer.values[1:]
    assert 1 <= len(new) <= L - P and all(v.shape == (B,) for v in new)
    np.testing.assert_array_equal(np.stack(new, 1), tokens[:, P:P + len(new)])


@pytest.mark.parametrize("kwargs", [{}, {"temperature": 1.2, "top_k": 6, "top_p": 0.9,
                                         "seed": 4}])
def test_streaming_gives_the_tokens_of_the_loop(kwargs):
    model = _TinyLM()
    plain = to_numpy(generate(model.next_token_fn, _prompt(), L, model.cache(), **kwargs))
    end = int(plain[0, P + 1])
    stopped = to_numpy(generate(model.next_token_fn, _prompt(), L, model.cache(),
                                end_token_id=end, **kwargs))
    for expected, stop in ((plain, None), (stopped, end)):
        streamer = _Collect()
        with keras_attn.observe_paths() as paths:
            tokens = to_numpy(generate(model.next_token_fn, _prompt(), L, model.cache(),
                                       end_token_id=stop, streamer=streamer, **kwargs))
        assert paths["streamed"] == 1
        np.testing.assert_array_equal(tokens, expected)
        _check_stream(streamer, tokens)


def _lm():
    block = keras_attn.TransformerDecoderLayer(
        intermediate_dim=12, num_heads=2, normalize_first=True, normalization="rms")
    lm = keras_attn.CausalLM(V, 8, [block])
    lm(np.zeros((1, P), "int32"))
    from keras_attn.testing.weights import randomize_weights
    randomize_weights(lm, seed=5, scale=0.35)
    return lm


def test_sampling_settings_are_inputs_of_one_kept_loop(monkeypatch):
    """A new seed, temperature, top_k or top_p reuses the compiled loop (jax, tensorflow:
    one trace); a given int seed samples the same tokens each time, streamed or not."""
    lm = _lm()
    prompt = _prompt()
    greedy = to_numpy(lm.generate(prompt, max_length=L))
    settings = [{"temperature": 1.0, "seed": 1}, {"temperature": 1.0, "seed": 2},
                {"temperature": 0.6, "seed": 1, "top_k": 5},
                {"temperature": 1.4, "seed": -9, "top_p": 0.8},
                {"temperature": 1.0, "seed": 1}]
    drawn = [to_numpy(lm.generate(prompt, max_length=L, **kwargs)) for kwargs in settings]
    np.testing.assert_array_equal(drawn[0], drawn[-1])
    assert (drawn[0] != drawn[1]).any() and (drawn[0] != greedy).any()
    loops = _generate_loop.loops_of(lm)
    if keras.backend.backend() == "numpy":  # the loop runs as it is, no model
        assert loops == {}
    else:
        assert [loop.sampled for loop in loops.values()] == [False, True]
    if keras.backend.backend() in ("jax", "tensorflow"):
        assert [loop.traces for loop in loops.values()] == [1, 1]
    elif keras.backend.backend() == "torch":  # eager: the loop runs at every call
        assert [loop.traces for loop in loops.values()] == [1, len(settings)]
    step = _generate_loop.traced_step_of(lm)  # PyTorch's traced step, None elsewhere
    calls = getattr(step, "graph_calls", 0)
    for kwargs, expected in ((settings[3], drawn[3]), ({}, greedy)):
        streamer = _Collect()
        with keras_attn.observe_paths() as paths:
            tokens = to_numpy(lm.generate(prompt, max_length=L, streamer=streamer, **kwargs))
        assert paths["streamed"] == 1
        np.testing.assert_array_equal(tokens, expected)
        _check_stream(streamer, tokens)
    if keras.backend.backend() == "torch":  # the streamed steps replayed the traced graph
        assert step.graph_calls == calls + 2 * (L - 1 - P)
    if keras.backend.backend() != "numpy":
        # The least recently used loop goes past MAX_KEPT_LOOPS (here 1): the sampled one.
        monkeypatch.setattr(_generate_loop, "MAX_KEPT_LOOPS", 1)
        lm.generate(prompt, max_length=L)
        assert [loop.sampled for loop in loops.values()] == [False]


@pytest.mark.parametrize("value", [0, 0.0, -0.1, 1.5, float("nan"), True, "0.5"])
def test_top_p_is_checked(value):
    model = _TinyLM()
    match = r"`top_p` must be None or a number with 0 < top_p <= 1.*Received: top_p="
    with pytest.raises(ValueError, match=match):
        generate(model.next_token_fn, _prompt(), L, model.cache(), temperature=1.0,
                 top_p=value)


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="a prompt traced by jax.jit")
def test_a_traced_prompt_cannot_stream():
    import jax

    model = _TinyLM()

    def run(prompt):
        return generate(model.next_token_fn, prompt, L, model.cache(), streamer=_Collect())

    with pytest.raises(ValueError, match=r"`streamer` needs a prompt whose values are known"):
        jax.jit(run)(_prompt())


def test_streamer_and_top_p_are_checked_by_causal_lm():
    lm = _lm()
    with pytest.raises(ValueError, match=r"`streamer` must be None or an object with "
                                         r"`put\(value\)` and `end\(\)`.*Received: streamer="):
        lm.generate(_prompt(), max_length=L, streamer=object())
    with pytest.raises(ValueError, match=r"Received: top_p=2"):
        lm.generate(_prompt(), max_length=L, temperature=1.0, top_p=2)
