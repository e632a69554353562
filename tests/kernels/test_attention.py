"""The functional core and the mask helpers, against hand-worked values and the reference."""

import math

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn import _device

from .. import reference
from ..helpers import assert_close, randn, rng, to_numpy

sdpa = keras_attn.scaled_dot_product_attention


# ----------------------------------------------------------------------------
# Hand-checkable cases: the expected numbers are worked out on paper.


def test_two_keys_by_hand():
    # logits = q.k * scale = [1, 0]; weights = [e, 1] / (e + 1)
    q = np.array([[1.0, 0.0]], "float32")
    k = np.array([[1.0, 0.0], [0.0, 1.0]], "float32")
    v = np.array([[1.0, 2.0], [3.0, 4.0]], "float32")
    out, weights = sdpa(q, k, v, scale=1.0, return_attention_scores=True)
    w0, w1 = math.e / (math.e + 1), 1 / (math.e + 1)
    assert_close(weights, [[w0, w1]])
    assert_close(out, [[w0 * 1 + w1 * 3, w0 * 2 + w1 * 4]])


def test_default_scale_is_one_over_sqrt_dk():
    # d_k = 4, q.k = 4 for key 0 and 0 for key 1: logits [4/2, 0] = [2, 0].
    q = np.ones((1, 4), "float32")
    k = np.array([[1, 1, 1, 1], [0, 0, 0, 0]], "float32")
    v = np.array([[1.0], [0.0]], "float32")
    out = sdpa(q, k, v)
    assert_close(out, [[math.exp(2) / (math.exp(2) + 1)]])


def test_zero_query_averages_values():
    q = np.zeros((1, 3), "float32")
    k = randn(rng(1), 4, 3)
    v = np.array([[0.0], [1.0], [2.0], [5.0]], "float32")
    assert_close(sdpa(q, k, v), [[2.0]])  # mean of 0, 1, 2, 5


def test_mask_selects_single_key():
    q = randn(rng(2), 1, 2)
    k = randn(rng(3), 3, 2)
    v = np.array([[7.0], [8.0], [9.0]], "float32")
    mask = np.array([[False, True, False]])
    out, weights = sdpa(q, k, v, mask=mask, return_attention_scores=True)
    assert_close(weights, [[0.0, 1.0, 0.0]])
    assert_close(out, [[8.0]])


def test_fully_masked_row_is_zero_not_nan():
    q = randn(rng(4), 2, 2)
    k = randn(rng(5), 3, 2)
    v = randn(rng(6), 3, 2)
    mask = np.array([[True, False, True], [False, False, False]])
    out, weights = sdpa(q, k, v, mask=mask, return_attention_scores=True)
    assert_close(out[1], [0.0, 0.0])
    assert_close(weights[1], [0.0, 0.0, 0.0])
    assert np.isfinite(to_numpy(out)).all()


def test_minus_inf_bias_row_is_zero_not_nan():
    q = randn(rng(4), 1, 2)
    k = randn(rng(5), 2, 2)
    v = randn(rng(6), 2, 2)
    out = sdpa(q, k, v, bias=np.full((1, 2), -np.inf, "float32"))
    assert_close(out, [[0.0, 0.0]])


def test_causal_mask_by_hand():
    # T=2 new queries over S=3 keys: query 0 is position 1, query 1 is position 2.
    expected = [[True, True, False], [True, True, True]]
    np.testing.assert_array_equal(to_numpy(keras_attn.causal_mask(2, 3)), expected)
    np.testing.assert_array_equal(
        to_numpy(keras_attn.causal_mask(3, 3)),
        [[True, False, False], [True, True, False], [True, True, True]])
    # More queries than keys: the first T - S queries see nothing.
    np.testing.assert_array_equal(
        to_numpy(keras_attn.causal_mask(3, 2)),
        [[False, False], [True, False], [True, True]])


def test_padding_mask_by_hand():
    np.testing.assert_array_equal(
        to_numpy(keras_attn.padding_mask(np.array([1, 3, 0]), 3)),
        [[True, False, False], [True, True, True], [False, False, False]])


def test_combine_masks_broadcasts_and_ignores_none():
    a = np.array([[True, False], [True, True]])
    b = np.array([True, False])
    np.testing.assert_array_equal(
        to_numpy(keras_attn.combine_masks(None, a, b, None)), [[True, False], [True, False]])
    assert keras_attn.combine_masks(None, None) is None


def test_causal_first_query_copies_first_value():
    q = randn(rng(7), 3, 2)
    k = randn(rng(8), 3, 2)
    v = randn(rng(9), 3, 2)
    out = sdpa(q, k, v, is_causal=True)
    assert_close(out[0], v[0])  # query 0 may attend only key 0


# ----------------------------------------------------------------------------
# Against the float64 reference, with every kind of mask.


@pytest.mark.parametrize("T,S", [(5, 5), (3, 6), (6, 4)])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_reference(T, S, causal):
    g = rng(T * 10 + S)
    q, k, v = randn(g, 2, 3, T, 4), randn(g, 2, 3, S, 4), randn(g, 2, 3, S, 5)
    mask = g.random((2, 1, T, S)) > 0.3
    mask[0, 0, 1] = False  # one fully masked row
    bias = randn(g, 1, 3, T, S)
    out, weights = sdpa(q, k, v, mask=mask, bias=bias, is_causal=causal,
                        return_attention_scores=True)
    ref_out, ref_weights = reference.scaled_dot_product_attention(
        q, k, v, mask=mask, bias=bias, is_causal=causal)
    assert_close(out, ref_out, what="output")
    assert_close(weights, ref_weights, what="weights")


def test_custom_scale_matches_reference():
    g = rng(11)
    q, k, v = randn(g, 4, 3), randn(g, 6, 3), randn(g, 6, 2)
    assert_close(sdpa(q, k, v, scale=0.3),
                 reference.scaled_dot_product_attention(q, k, v, scale=0.3)[0])


def test_accepts_integer_mask():
    g = rng(12)
    q, k, v = randn(g, 2, 3), randn(g, 4, 3), randn(g, 4, 2)
    mask = np.array([[1, 0, 1, 1], [0, 0, 1, 0]], "int32")
    assert_close(sdpa(q, k, v, mask=mask),
                 reference.scaled_dot_product_attention(q, k, v, mask=mask.astype(bool))[0])


# ----------------------------------------------------------------------------
# Dropout on the attention weights.


def test_dropout_zeroes_or_rescales_weights():
    # With value = identity, the output row *is* the (dropped) weight row.
    g = rng(14)
    S = 8
    q, k = randn(g, 6, 4), randn(g, S, 4)
    v = np.eye(S, dtype="float32")
    rate = 0.5
    clean = to_numpy(sdpa(q, k, v))
    dropped = to_numpy(sdpa(q, k, v, dropout_rate=rate, seed=3, training=True))
    kept = dropped != 0
    assert 0 < kept.mean() < 1
    np.testing.assert_allclose(dropped[kept], clean[kept] / (1 - rate), rtol=1e-5)
    # Inference ignores the rate.
    assert_close(sdpa(q, k, v, dropout_rate=rate, seed=3, training=False), clean)


# ----------------------------------------------------------------------------
# Gradients (trainable backends): finite on masked rows, equal to the reference's.


@pytest.mark.requires_trainable_backend
def test_gradients_match_reference_with_fully_masked_row():
    g = rng(15)
    q, k, v = randn(g, 3, 2), randn(g, 4, 2), randn(g, 4, 3)
    mask = np.array([[1, 1, 0, 1], [0, 0, 0, 0], [1, 0, 0, 1]], bool)
    probe = randn(g, 3, 3)  # loss = sum(output * probe)

    def loss(q_, k_, v_):
        return keras.ops.sum(keras.ops.multiply(sdpa(q_, k_, v_, mask=mask, is_causal=True), probe))

    value, grads = _device.value_and_grad(loss, [q, k, v])
    for grad in grads:
        assert np.isfinite(grad).all()

    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))

    def ref_loss(which):
        def f(x):
            args = [q64, k64, v64]
            args[which] = x
            out = reference.scaled_dot_product_attention(*args, mask=mask, is_causal=True)[0]
            return float((out * probe).sum())
        return f

    assert value == pytest.approx(ref_loss(0)(q64), abs=1e-5)
    for which, grad in enumerate(grads):
        assert_close(grad, reference.numerical_gradient(ref_loss(which), [q64, k64, v64][which]),
                     what=f"gradient {which}")
    assert_close(grads[0][1], [0.0, 0.0], what="masked row query gradient")
