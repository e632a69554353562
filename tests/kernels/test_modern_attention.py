"""Grouped-query heads, sliding windows and logit soft-capping in the functional core.

Every path against the float64 reference (forward and gradients), the
routing of `auto`, the blocks the blockwise path skips, and the errors.
"""

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn import _device, config
from keras_attn._kernels.blockwise import _Blocks
from keras_attn._policy import observe_paths
from keras_attn.options import KernelSpec

from .. import reference
from ..fixtures import attention_settings_fixture
from ..helpers import assert_close, randn, rng

sdpa = keras_attn.scaled_dot_product_attention
PATHS = ["explicit", "fused", "blockwise"]


# Blocks of 4 so that the test sizes span several, partial blocks.
_small_blocks = attention_settings_fixture(block_size=4)


def _problem(seed, T, S, H=4, H_kv=2, d_k=5, d_v=3):
    g = rng(seed)
    return g, randn(g, 2, H, T, d_k), randn(g, 2, H_kv, S, d_k), randn(g, 2, H_kv, S, d_v)


# (H_kv, T, S, causal, window): every value of each axis appears, T > S and T < S too.
# (The property tests in test_properties.py draw further combinations.)
COMBOS = [
    (4, 9, 9, False, None), (2, 9, 9, True, None), (1, 5, 11, True, 3), (2, 11, 6, True, 1),
    (2, 5, 11, False, 3), (1, 9, 9, False, 1), (4, 11, 6, False, 3), (2, 9, 9, True, 3),
]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("H_kv,T,S,causal,window", COMBOS)
def test_grouped_heads_and_windows_match_reference(path, H_kv, T, S, causal, window):
    g, q, k, v = _problem(T * S + H_kv, T, S, H_kv=H_kv)
    mask = g.random((2, 1, T, S)) > 0.2
    out = sdpa(q, k, v, mask=mask, is_causal=causal, sliding_window=window, implementation=path)
    expected, _ = reference.scaled_dot_product_attention(
        q, k, v, mask=mask, is_causal=causal, sliding_window=window)
    assert_close(out, expected, what=f"{path} H_kv={H_kv} W={window}")


@pytest.mark.parametrize("path", ["auto", "explicit", "blockwise"])
@pytest.mark.parametrize("cap", [0.5, 3.0])
def test_soft_cap_matches_reference(path, cap):
    g, q, k, v = _problem(1, 7, 9)
    bias = randn(g, 1, 4, 7, 9)
    bias[0, 3, 2] = -np.inf
    out = sdpa(3 * q, k, v, bias=bias, is_causal=True, logit_soft_cap=cap, implementation=path)
    expected, _ = reference.scaled_dot_product_attention(
        3 * q, k, v, bias=bias, is_causal=True, logit_soft_cap=cap)
    assert_close(out, expected)


def test_grouped_heads_equal_explicitly_repeated_keys():
    g, q, k, v = _problem(2, 6, 8)
    mask = g.random((2, 4, 6, 8)) > 0.3  # a per-head mask
    for path in PATHS:
        grouped = sdpa(q, k, v, mask=mask, implementation=path)
        repeated = sdpa(q, np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1), mask=mask,
                        implementation=path)
        assert_close(grouped, keras.ops.convert_to_numpy(repeated), what=path)


def test_window_wider_than_the_keys_is_no_window():
    g, q, k, v = _problem(3, 6, 8, H_kv=4)
    for causal in (False, True):
        for path in PATHS:
            windowed = sdpa(q, k, v, is_causal=causal, sliding_window=8 + 6, implementation=path)
            plain = sdpa(q, k, v, is_causal=causal, implementation=path)
            assert_close(windowed, keras.ops.convert_to_numpy(plain))


@pytest.mark.slow
@pytest.mark.requires_trainable_backend
@pytest.mark.parametrize("path", ["explicit", "blockwise"])
@pytest.mark.parametrize("spec", [
    dict(T=7, S=7, causal=True, window=3, cap=None, H_kv=2),
    dict(T=5, S=9, causal=True, window=None, cap=1.5, H_kv=1, bias=True),
    dict(T=9, S=6, causal=False, window=2, cap=2.0, H_kv=2, bias=True),
], ids=["gqa_window", "mqa_cap_bias", "window_two_sided_cap"])
def test_gradients_match_reference(path, spec):
    g, q, k, v = _problem(4, spec["T"], spec["S"], H_kv=spec["H_kv"], d_k=3, d_v=2)
    bias = randn(g, 1, 4, spec["T"], spec["S"]) if spec.get("bias") else None
    probe = randn(g, 2, 4, spec["T"], 2)
    kwargs = dict(is_causal=spec["causal"], sliding_window=spec["window"],
                  logit_soft_cap=spec["cap"])
    args = [q, k, v] + ([bias] if bias is not None else [])

    def loss(*xs):
        b = xs[3] if bias is not None else None
        out = sdpa(xs[0], xs[1], xs[2], bias=b, implementation=path, **kwargs)
        return keras.ops.sum(out * keras.ops.convert_to_tensor(probe))

    _, grads = _device.value_and_grad(loss, args)
    args64 = [a.astype(np.float64) for a in args]
    for which, grad in enumerate(grads):
        def f(x, which=which):
            xs = list(args64)
            xs[which] = x
            b = xs[3] if bias is not None else None
            out, _ = reference.scaled_dot_product_attention(xs[0], xs[1], xs[2], bias=b, **kwargs)
            return float((out * probe).sum())
        assert_close(grad, reference.numerical_gradient(f, args64[which]),
                     what=f"{path} gradient {which}", quantity="gradient")


def test_auto_routes_soft_cap_around_the_fused_kernel():
    g, q, k, v = _problem(5, 6, 6)
    with observe_paths() as taken:
        sdpa(q, k, v, logit_soft_cap=2.0)
        assert taken == {"explicit": 1}
        config.set_blockwise_threshold(16)
        sdpa(q, k, v, logit_soft_cap=2.0)
        assert taken == {"explicit": 1, "blockwise": 1}
        config.set_blockwise_threshold(16)
        sdpa(q, k, v, sliding_window=2)  # a window is a mask: blockwise even on torch
    assert taken["blockwise"] == 2


def test_blockwise_skips_blocks_outside_the_window():
    """Causal W = 8 over T = S = 64 in blocks of 8: at most 2 key blocks per query block."""
    blocks = _Blocks(64, 64, 8, [1], spec=KernelSpec(is_causal=True, sliding_window=8))
    ranges = [tuple(int(keras.ops.convert_to_numpy(x)) for x in blocks.key_range(i))
              for i in range(blocks.nq)]
    assert ranges == [(0, 1)] + [(i - 1, i + 1) for i in range(1, 8)]
    assert sum(hi - lo for lo, hi in ranges) == 15  # of 36 (causal) or 64 (full)
    grouped = _Blocks(64 * 4, 64, 8, [1], spec=KernelSpec(is_causal=True, sliding_window=8),
                      group=4)  # 4 query heads per key head
    lo, hi = (int(keras.ops.convert_to_numpy(x)) for x in grouped.key_range(10))
    assert (lo, hi) == (1, 3)  # rows 80..87 are positions 20 and 21: keys 13..21
    q_lo, q_hi = (int(keras.ops.convert_to_numpy(x)) for x in grouped.query_range(2))
    assert (q_lo, q_hi) == (8, 16)  # keys 16..23 are seen by positions 16..30: rows 64..123


@pytest.mark.parametrize("kwargs, match", [
    (dict(sliding_window=0), r"Received: sliding_window=0"),
    (dict(sliding_window=2.5), r"Received: sliding_window=2.5"),
    (dict(logit_soft_cap=0.0), r"Received: logit_soft_cap=0.0"),
    (dict(logit_soft_cap=-1), r"Received: logit_soft_cap=-1"),
    (dict(logit_soft_cap=2.0, implementation="fused"), r"cannot soft-cap"),
])
def test_argument_errors(kwargs, match):
    _, q, k, v = _problem(6, 4, 4)
    with pytest.raises(ValueError, match=match):
        sdpa(q, k, v, **kwargs)


def test_heads_not_divisible_by_kv_heads():
    _, q, k, v = _problem(7, 4, 4, H=4, H_kv=3)
    with pytest.raises(ValueError, match=r"multiple of the key/value heads.*Received: "
                                         r"query.shape=\(2, 4, 4, 5\), key.shape=\(2, 3, 4, 5\)"):
        sdpa(q, k, v)


def test_sliding_window_mask_is_public_and_bottom_right():
    mask = keras.ops.convert_to_numpy(keras_attn.sliding_window_mask(3, 5, 2))
    np.testing.assert_array_equal(mask, reference.sliding_window_mask(3, 5, 2))
    np.testing.assert_array_equal(mask[0], [False, True, True, False, False])
    two_sided = keras.ops.convert_to_numpy(keras_attn.sliding_window_mask(3, 5, 2, False))
    np.testing.assert_array_equal(two_sided[0], [False, True, True, True, False])
