"""`CausalLM.generate` on PyTorch: the decoding step replayed from a traced graph.

`keras_attn._device.trace_step` records `CausalLM.next_token_logits` once per input shape
(make_fx with fake tensors, then torch.jit.trace) and replays it at every token. These
tests compare the graph with the eager step it replaces (logits and every cache slot, at
several cache indices), check that `generate` used it (`graph_calls`), that it reads the
weights afresh at each call, and that a step it cannot replay faithfully is refused. The
eager step itself is checked against transformers in tests/convert/test_families.py, whose
`generate` runs through this graph on PyTorch too.
"""

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn import _device
from keras_attn.layers.causal_lm import traced_step_of
from keras_attn.testing.weights import randomize_weights

from ..helpers import to_numpy

B, P, L, V, D = 2, 5, 12, 40, 16

torch_only = pytest.mark.skipif(keras.backend.backend() != "torch",
                                reason="the traced step is PyTorch's (see the first test)")


def test_only_pytorch_traces_its_step():
    """JAX and TensorFlow compile the whole loop (XLA); NumPy runs it as it is."""
    step = _device.trace_step(lambda *a: a, [])
    if keras.backend.backend() == "torch":
        assert isinstance(step, _device.TracedStep)
    else:
        assert step is None


def _lm(seed=0):
    blocks = [keras_attn.TransformerDecoderLayer(
        4, intermediate_dim=32, key_dim=4, num_key_value_heads=2, rope_max_wavelength=1e4,
        normalization="rms", normalize_first=True, gated_feed_forward=True,
        activation="silu", use_bias=False, sliding_window=window) for window in (None, 3)]
    lm = keras_attn.CausalLM(V, D, blocks, tie_word_embeddings=False)
    randomize_weights(lm, seed=seed, scale=0.5)  # far from identity: logits O(1)
    return lm


def _prompt():
    return np.random.default_rng(1).integers(1, V, (B, P)).astype("int32")


def _prefilled(lm):
    import torch

    caches = [keras_attn.empty_cache(block, B, L) for block in lm.blocks]
    with torch.no_grad():
        _, caches = lm.next_token_logits(_prompt(), caches, 0)
    return caches


def _index(value):
    return keras.ops.convert_to_tensor(value, "int32")


@torch_only
def test_the_graph_equals_the_eager_step_at_every_index():
    import torch

    lm = _lm()
    caches = _prefilled(lm)
    token = keras.ops.convert_to_tensor([[3], [7]], "int32")
    step = _device.trace_step(lm.next_token_logits, lm.variables)
    for index in (P, P + 1, P + 4, L - 1):  # the graph was traced at P only
        with torch.no_grad():
            expected_logits, expected = lm.next_token_logits(token, caches, _index(index))
            logits, got = step(token, caches, _index(index))
        np.testing.assert_allclose(to_numpy(logits), to_numpy(expected_logits),
                                   rtol=1e-6, atol=1e-6)
        assert type(got) is list and len(got) == len(expected)
        for a, b in zip(got, expected):
            np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
    assert step.graph_calls == 4 and len(step.graphs) == 1


@torch_only
def test_generate_decodes_through_the_graph():
    lm = _lm()
    eager = to_numpy(lm.generate(_prompt(), max_length=L, jit_compile=False))
    assert to_numpy(lm.generate(_prompt(), max_length=L)).tolist() == eager.tolist()
    step = traced_step_of(lm)
    # One graph for the (B, 1) token and the (B, 2, L, ...) caches; every decoding step
    # (positions P .. L - 2: the last token is chosen, not fed) came from it.
    assert step.graph_calls == L - 1 - P and len(step.graphs) == 1
    assert to_numpy(lm.generate(_prompt(), max_length=L)).tolist() == eager.tolist()
    assert step.graph_calls == 2 * (L - 1 - P) and len(step.graphs) == 1  # traced once
    # Another batch size is another graph.
    lm.generate(_prompt()[:1], max_length=L)
    assert len(step.graphs) == 2


@torch_only
def test_the_graph_reads_the_current_weights():
    lm = _lm()
    before = to_numpy(lm.generate(_prompt(), max_length=L))
    randomize_weights(lm, seed=7, scale=0.5)  # training would do this between calls
    after = to_numpy(lm.generate(_prompt(), max_length=L))
    eager = to_numpy(lm.generate(_prompt(), max_length=L, jit_compile=False))
    assert after.tolist() == eager.tolist()
    assert after[:, P:].tolist() != before[:, P:].tolist()  # the new weights moved the tokens
    assert traced_step_of(lm).graph_calls == 2 * (L - 1 - P)


@torch_only
def test_a_step_that_keeps_state_is_refused():
    """A Python counter is frozen into the graph: the check at trace time sees it."""
    import torch

    lm = _lm()
    caches = _prefilled(lm)
    calls = []

    def counting(token_ids, cache, index):
        calls.append(index)
        logits, cache = lm.next_token_logits(token_ids, cache, index)
        return logits + float(len(calls)), cache

    step = _device.trace_step(counting, lm.variables)
    token = keras.ops.convert_to_tensor([[3], [7]], "int32")
    with pytest.warns(UserWarning, match="disagrees with the eager one"), torch.no_grad():
        step(token, caches, _index(P))
    assert list(step.graphs.values()) == [None] and step.graph_calls == 0
    with torch.no_grad():
        logits, _ = step(token, caches, _index(P))  # eagerly: the counter goes on
    expected, _ = lm.next_token_logits(token, caches, _index(P))
    np.testing.assert_allclose(to_numpy(logits), to_numpy(expected) + len(calls), rtol=1e-6)


@torch_only
def test_a_step_that_reads_the_index_is_not_traced():
    """`int(index)` needs a value a fake tensor does not have: no graph, a warning."""
    import torch

    lm = _lm()
    caches = _prefilled(lm)

    def reading(token_ids, cache, index):
        return lm.next_token_logits(token_ids, cache, int(index))

    step = _device.trace_step(reading, lm.variables)
    token = keras.ops.convert_to_tensor([[3], [7]], "int32")
    with pytest.warns(UserWarning, match="could not be traced"), torch.no_grad():
        logits, _ = step(token, caches, _index(P + 2))
    expected, _ = lm.next_token_logits(token, caches, _index(P + 2))
    np.testing.assert_allclose(to_numpy(logits), to_numpy(expected), rtol=1e-6)
    assert list(step.graphs.values()) == [None]


@torch_only
def test_a_lora_enabled_after_the_trace_is_decoded_with():
    """New variables (and a new computation) drop the old graphs: no stale replay."""
    lm = _lm()
    before = to_numpy(lm.generate(_prompt(), max_length=L))
    for block in lm.blocks:
        for dense in (block.self_attention.query_dense, block.self_attention.value_dense):
            dense.enable_lora(2)
            rng = np.random.default_rng(3)
            dense.lora_kernel_b.assign(rng.normal(0, 1.0, dense.lora_kernel_b.shape))
    after = to_numpy(lm.generate(_prompt(), max_length=L))
    eager = to_numpy(lm.generate(_prompt(), max_length=L, jit_compile=False))
    assert after.tolist() == eager.tolist()
    assert after[:, P:].tolist() != before[:, P:].tolist()  # the LoRA moved the tokens
    step = traced_step_of(lm)
    # The model's variables changed, so `generate` made a new traced step (its kept loops
    # and step are dropped: `_generate_loop.forget_if_changed`), traced once and used.
    assert len(step.graphs) == 1 and step.graph_calls == L - 1 - P
