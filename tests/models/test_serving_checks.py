"""Issue 38's checks: what a serving stack passes `CausalLM` that it must refuse by name.

Each test here failed before its fix (a silent wrong answer or a backend's raw error).
"""

import keras
import numpy as np
import pytest

import keras_attn

V, D = 16, 8


def _lm():
    block = keras_attn.TransformerDecoderLayer(
        intermediate_dim=12, num_heads=2, normalize_first=True, normalization="rms")
    lm = keras_attn.CausalLM(V, D, [block])
    lm(np.zeros((1, 3), "int32"))
    return lm


@pytest.fixture(scope="module")
def lm():
    return _lm()


@pytest.mark.parametrize("bad", [-1, V, V + 7])
def test_token_ids_outside_the_vocabulary_are_refused(lm, bad):
    """Before: id -1 (a common pad value) read row V - 1 on every backend, and id V gave
    an IndexError, NaN logits (JAX) or a clamped row (TensorFlow's XLA loop)."""
    ids = np.array([[1, 2, bad]], "int32")
    with pytest.raises(ValueError, match=rf"`token_ids` must hold token ids in \[0, "
                                         rf"vocabulary_size\).*Received: an id of {bad}"):
        lm(ids)
    with pytest.raises(ValueError, match=rf"`prompt_ids`.*Received: an id of {bad}"):
        lm.generate(ids, max_length=5)
    # The same ids as a backend tensor (eager): still concrete, still refused.
    with pytest.raises(ValueError, match="`token_ids` must hold token ids"):
        lm(keras.ops.convert_to_tensor(ids))


def test_ids_at_the_vocabulary_edges_are_accepted(lm):
    ids = np.array([[0, V - 1, 3]], "int32")
    assert tuple(lm(ids).shape) == (1, 3, V)
    assert tuple(lm.generate(ids, max_length=5).shape) == (1, 5)


def test_any_int_seed_samples_on_every_backend(lm):
    """Before: JAX and NumPy raised OverflowError (uint32) for these seeds; TensorFlow and
    PyTorch took them modulo 2**32 (Keras's own rule), which is now every backend's."""
    ids = np.array([[1, 2, 3]], "int32")
    sample = lambda seed: np.asarray(  # noqa: E731
        lm.generate(ids, max_length=8, temperature=1.0, seed=seed))
    negative = sample(-3)
    assert negative.shape == (1, 8) and negative.min() >= 0 and negative.max() < V
    np.testing.assert_array_equal(sample(2**40 + 5), sample(5))  # 2**40 + 5 = 5 mod 2**32


def test_a_quantized_model_is_refused_when_saved_not_when_used(tmp_path):
    """Before: `save` wrote a `.keras` file that failed to load ("Layer
    'intermediate_dense' expected 2 variables, but received 0"): the blocks rebuild float
    sublayers from their config. Now `save` refuses by name; the model still runs."""
    lm = _lm()
    lm.quantize("int8")
    ids = np.array([[1, 2, 3]], "int32")
    assert tuple(lm.generate(ids, max_length=5).shape) == (1, 5)
    with pytest.raises(ValueError, match=r"A quantized `CausalLM` cannot be saved.*"
                                         r"Received: quantization_mode='int8'"):
        lm.save(str(tmp_path / "quantized.keras"))
    assert not (tmp_path / "quantized.keras").exists()


def test_generate_takes_a_second_batch_size_with_the_same_max_length(lm):
    """Before, on TensorFlow: `generate` on (2, 4) then (1, 4) raised "batch_size must be a
    positive integer. Received: batch_size=None" (one kept loop per max_length, retraced
    with the batch relaxed). Each shape decodes as it does alone: greedy is deterministic."""
    first = np.asarray(lm.generate(np.array([[1, 2, 3, 4], [5, 6, 7, 8]], "int32"), 7))
    second = np.asarray(lm.generate(np.array([[5, 6, 7, 8]], "int32"), 7))
    np.testing.assert_array_equal(second[0], first[1])


def _enable_lora(lm):
    for layer in lm._flatten_layers():
        if isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense)):
            layer.enable_lora(2)
    rng = np.random.default_rng(0)
    for variable in lm.variables:  # A and B from NumPy (B as after fine-tuning: not zero)
        if "lora_kernel" in variable.path:
            variable.assign(rng.normal(0.0, 1.0, variable.shape))


@pytest.mark.parametrize("change", ["attribute", "lora", "quantize"])
def test_generate_decodes_the_model_as_it_is_now(change):
    """Before: the kept compiled loop decoded the model as it was at the first call:
    after `lm.embedding_scale = ...` on every backend (PyTorch's traced step too), after
    LoRA with a non-zero B or `quantize("int8")` on TensorFlow. Now each generate equals
    greedy decoding by uncached forwards of the current model."""
    from keras_attn.testing.weights import randomize_weights

    from ..helpers import assert_greedy_over_uncached

    lm = _lm()
    randomize_weights(lm, seed=3, scale=1.0)
    ids = np.array([[1, 2, 3], [4, 5, 6]], "int32")
    before = np.asarray(lm.generate(ids, max_length=10))
    assert_greedy_over_uncached(lm, before, 3)
    if change == "attribute":
        lm.embedding_scale = 5.0
    elif change == "lora":
        _enable_lora(lm)
    else:
        lm.quantize("int8")
    after = np.asarray(lm.generate(ids, max_length=10))
    assert_greedy_over_uncached(lm, after, 3)
    if change != "quantize":  # the ablation: the change matters (int8 may keep the argmax)
        assert not np.array_equal(after, before)


def test_predicting_or_training_keeps_the_compiled_loop():
    """Before: `predict_on_batch` and `train_on_batch` set Keras's `predict_function` /
    `train_function` (None before), which counted as a change of the model, so the next
    `generate` dropped its kept loop and compiled it again (JAX: 7.0 s against 0.02 s)."""
    from keras_attn.models._generate_loop import loops_of

    if keras.backend.backend() == "numpy":
        pytest.skip("NumPy keeps no compiled loop (generate runs the loop as it is) and "
                    "cannot train")
    lm = _lm()
    ids = np.array([[1, 2, 3], [4, 5, 6]], "int32")
    lm.generate(ids, max_length=10)
    (loop,) = loops_of(lm).values()
    lm.predict_on_batch(ids)
    lm.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    lm.train_on_batch(ids, ids)
    lm.generate(ids, max_length=10)
    assert list(loops_of(lm).values()) == [loop]
