"""Chunked (block-diagonal) attention, Llama 4's `attention_chunk_size`: position p
attends key j only if `floor(j / C) == floor(p / C)` (and causal).

Each path against the float64 reference (outputs, and gradients on the blockwise and
explicit paths), observed to run; with a window, sinks, a mask, grouped heads and
T != S; the rule against transformers' `chunked_causal_mask_function`; the blocks the
blockwise path skips; and the errors. Every comparison comes with its ablation: the
same call without the chunks is far from the chunked reference.
"""

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn import _device, config
from keras_attn._kernels.blocks import _Blocks
from keras_attn._masks import positional_mask
from keras_attn._policy import observe_paths
from keras_attn.options import AttentionOptions, KernelSpec

from .. import reference
from ..helpers import assert_close, randn, rng, to_numpy

sdpa = keras_attn.scaled_dot_product_attention
PATHS = ["explicit", "fused", "blockwise"]
B, H, H_KV, D = 2, 4, 2, 5


@pytest.fixture
def small_blocks():
    """Blocks of 4: the test sizes span several, partial blocks and chunks."""
    config.set_attention_block_size(4)
    yield
    config.set_attention_block_size(None)


def _problem(seed, T, S, H_kv=H_KV):
    g = rng(seed)
    return randn(g, B, H, T, D), randn(g, B, H_kv, S, D), randn(g, B, H_kv, S, 3)


def _far(a, b, floor=0.05):
    """The ablation: `a` and `b` differ by more than `floor` (far past the 1e-5 tolerance)."""
    gap = float(np.abs(np.asarray(to_numpy(a), np.float64) - b).max())
    assert gap > floor, f"the ablation moved the output by {gap} only"
    return gap


# (T, S, causal, C, H_kv, extra): chunks that split blocks (C = 3, 5), align with them
# (C = 4), are wider than the keys (C = 16: no chunk), and T > S, T < S (a query's
# position p = i + S - T; a negative p shares no chunk with any key).
CASES = [
    (13, 13, True, 5, 2, {}),
    (13, 13, False, 4, 1, {}),
    (9, 13, True, 3, 4, {}),
    (13, 9, True, 4, 2, {}),
    (11, 11, True, 5, 2, {"sliding_window": 3}),
    (11, 11, False, 6, 2, {"sliding_window": 4}),
    (12, 12, True, 5, 2, {"mask": True}),
    (12, 12, True, 4, 2, {"sinks": True}),
    (10, 10, True, 16, 2, {}),
]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("T,S,causal,C,H_kv,extra", CASES)
def test_each_path_matches_reference(path, T, S, causal, C, H_kv, extra, small_blocks):
    g, (q, k, v) = rng(T * S + C), _problem(T + S + C, T, S, H_kv)
    kwargs = dict(is_causal=causal, sliding_window=extra.get("sliding_window"))
    if extra.get("mask"):
        kwargs["mask"] = g.random((B, 1, T, S)) > 0.3
    if extra.get("sinks"):
        kwargs["sinks"] = np.array([1.5, -0.5, 3.0, 0.2], "float32")
    expected, _ = reference.scaled_dot_product_attention(q, k, v, attention_chunk_size=C, **kwargs)
    with observe_paths() as taken:
        out = sdpa(q, k, v, attention_chunk_size=C, implementation=path, **kwargs)
    assert taken == {path: 1}
    assert_close(out, expected, what=f"{path} C={C}")
    plain, _ = reference.scaled_dot_product_attention(q, k, v, **kwargs)
    if C < max(T, S):  # the ablation: without the chunks
        _far(plain, expected)


def test_the_rule_is_transformers_chunked_causal_mask():
    """`positional_mask` and the reference's `chunked_mask` against transformers'
    `chunked_causal_mask_function` (no left padding), at T == S and over a prefix."""
    torch = pytest.importorskip("torch")
    masking = pytest.importorskip("transformers.masking_utils")
    C = 3
    fn = masking.chunked_causal_mask_function(C, torch.zeros(1, dtype=torch.long))
    for T, S in ((10, 10), (4, 10)):
        q_idx = torch.arange(S - T, S)[:, None]  # absolute positions of the queries
        kv_idx = torch.arange(S)[None, :]
        theirs = fn(0, 0, q_idx, kv_idx).numpy()
        ours = to_numpy(positional_mask(T, S, is_causal=True, attention_chunk_size=C))
        np.testing.assert_array_equal(ours, theirs)
        np.testing.assert_array_equal(
            reference.chunked_mask(T, S, C) & reference.causal_mask(T, S), theirs)
        assert not np.array_equal(reference.causal_mask(T, S), theirs)  # the ablation


def test_auto_routes_chunks_through_a_mask_or_the_blocks():
    """`auto`: a chunk is a positional mask for the fused kernel (never PyTorch's
    `is_causal` flag, which would drop it), or blocks skipped above the threshold."""
    q, k, v = _problem(5, 12, 12)
    expected, _ = reference.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                         attention_chunk_size=4)
    with observe_paths() as taken:
        out = sdpa(q, k, v, is_causal=True, attention_chunk_size=4)
    assert taken == {"fused": 1}  # small scores: fused on every backend's CPU row
    assert_close(out, expected)
    config.set_blockwise_threshold(16)
    try:
        with observe_paths() as taken:
            out = sdpa(q, k, v, is_causal=True, attention_chunk_size=4)
    finally:
        config.set_blockwise_threshold(None)
    assert taken == {"blockwise": 1}
    assert_close(out, expected)


def test_blockwise_skips_blocks_outside_the_chunks():
    """Causal, C = 16 over T = S = 64 in blocks of 8: each query block sees the key
    blocks of its own chunk up to the diagonal, 1 or 2 (of 36 causal), and each key
    block is seen by the query blocks of its chunk from the diagonal on."""
    spec = KernelSpec(is_causal=True, attention_chunk_size=16)
    blocks = _Blocks(64, 64, 8, [1], spec=spec)

    def ranges(f, count):
        return [tuple(int(keras.ops.convert_to_numpy(x)) for x in f(i)) for i in range(count)]

    keys = ranges(blocks.key_range, blocks.nq)
    assert keys == [(0, 1), (0, 2), (2, 3), (2, 4), (4, 5), (4, 6), (6, 7), (6, 8)]
    assert sum(hi - lo for lo, hi in keys) == 12  # of 36 causal
    assert ranges(blocks.query_range, blocks.nk) == [
        (0, 2), (1, 2), (2, 4), (3, 4), (4, 6), (5, 6), (6, 8), (7, 8)]
    # Not causal, C = 12 (chunks straddle blocks): the blocks the chunks touch.
    two_sided = _Blocks(64, 64, 8, [1], spec=KernelSpec(attention_chunk_size=12))
    assert ranges(two_sided.key_range, 3) == [(0, 2), (0, 3), (1, 3)]
    # The same with a window W = 4 inside: the tighter of the two bounds.
    both = _Blocks(64, 64, 8, [1], spec=KernelSpec(is_causal=True, sliding_window=4,
                                                   attention_chunk_size=16))
    assert ranges(both.key_range, 4) == [(0, 1), (0, 2), (2, 3), (2, 4)]
    # Grouped heads (4 query heads per key head: rows are positions times 4).
    grouped = _Blocks(64 * 4, 64, 8, [1], spec=spec, group=4)
    assert ranges(grouped.key_range, 12)[10] == (2, 3)  # rows 80..87: positions 20, 21
    assert ranges(grouped.query_range, 3)[2] == (8, 16)  # keys 16..23: positions 16..31
    # The ablation: without chunks, the causal bounds alone.
    causal = _Blocks(64, 64, 8, [1], spec=KernelSpec(is_causal=True))
    assert sum(hi - lo for lo, hi in ranges(causal.key_range, 8)) == 36


def test_the_geometry_is_the_mask():
    """Every (query block, key block) pair that `key_range` / `query_range` leave out has
    no allowed key in the mask, over many shapes (the bounds never cut a live block)."""
    for T, S, causal, C, W, group, bs in [(13, 13, True, 5, None, 1, 4), (9, 17, True, 3, 4, 2, 4),
                                          (17, 9, False, 4, None, 1, 3), (16, 16, True, 7, 5, 4, 8),
                                          (10, 14, False, 6, 3, 2, 4)]:
        spec = KernelSpec(is_causal=causal, sliding_window=W, attention_chunk_size=C)
        g = _Blocks(T * group, S, bs, [1], spec=spec, group=group)
        rows = np.arange(g.Tp)[:, None] // group + (S - T)
        cols = np.arange(g.Sp)[None, :]
        allowed = (rows // C == cols // C) & (cols < S)
        if causal:
            allowed &= cols <= rows
        if W is not None:
            allowed &= ((rows - cols) < W) & ((rows - cols) >= 0) if causal else (
                np.abs(rows - cols) < W)
        for i in range(g.nq):
            lo, hi = (int(keras.ops.convert_to_numpy(x)) for x in g.key_range(i))
            for j in range(g.nk):
                live = allowed[i * bs:(i + 1) * bs, j * bs:(j + 1) * bs].any()
                q_lo, q_hi = (int(keras.ops.convert_to_numpy(x)) for x in g.query_range(j))
                assert not live or (lo <= j < hi and q_lo <= i < q_hi), (T, S, C, W, i, j)


@pytest.mark.requires_trainable_backend
@pytest.mark.parametrize("path", ["explicit", "blockwise"])
@pytest.mark.parametrize("spec", [
    dict(T=9, S=9, causal=True, C=4, window=None, H_kv=2, bias=False),
    dict(T=7, S=10, causal=True, C=3, window=2, H_kv=1, bias=True),
    dict(T=9, S=9, causal=False, C=5, window=None, H_kv=2, bias=False),
], ids=["gqa_causal", "mqa_window_bias", "two_sided"])
def test_gradients_match_reference(path, spec, small_blocks):
    g = rng(7)
    q, k, v = (randn(g, 1, H, spec["T"], 3), randn(g, 1, spec["H_kv"], spec["S"], 3),
               randn(g, 1, spec["H_kv"], spec["S"], 2))
    bias = randn(g, 1, H, spec["T"], spec["S"]) if spec["bias"] else None
    probe = randn(g, 1, H, spec["T"], 2)
    kwargs = dict(is_causal=spec["causal"], sliding_window=spec["window"],
                  attention_chunk_size=spec["C"])
    args = [q, k, v] + ([bias] if bias is not None else [])

    def loss(*xs):
        out = sdpa(xs[0], xs[1], xs[2], bias=xs[3] if bias is not None else None,
                   implementation=path, **kwargs)
        return keras.ops.sum(out * keras.ops.convert_to_tensor(probe))

    with observe_paths() as taken:
        _, grads = _device.value_and_grad(loss, args)
    assert set(taken) == {path}
    args64 = [a.astype(np.float64) for a in args]

    def reference_loss(xs, **options):
        out, _ = reference.scaled_dot_product_attention(
            xs[0], xs[1], xs[2], bias=xs[3] if bias is not None else None, **options)
        return float((out * probe).sum())

    for which, grad in enumerate(grads):
        def f(x, which=which, **options):
            xs = list(args64)
            xs[which] = x
            return reference_loss(xs, **{**kwargs, **options})
        expected = reference.numerical_gradient(f, args64[which])
        assert_close(grad, expected, what=f"{path} gradient {which}", quantity="gradient")
        if which == 0:  # the ablation: the gradient without the chunks
            _far(grad, reference.numerical_gradient(
                lambda x: f(x, attention_chunk_size=None), args64[0]), floor=0.02)


@pytest.mark.parametrize("value", [0, -2, 2.5, True])
def test_bad_chunk_sizes_are_refused_by_name(value):
    q, k, v = _problem(9, 4, 4)
    with pytest.raises(ValueError, match=rf"Received: attention_chunk_size={value!r}"):
        sdpa(q, k, v, attention_chunk_size=value)
    with pytest.raises(ValueError, match=rf"Received: attention_chunk_size={value!r}"):
        AttentionOptions(attention_chunk_size=value)


def test_a_callable_implementation_gets_the_chunk_only_when_set():
    """A user's `attention_fn` written before chunks keeps working; one that takes
    `attention_chunk_size` gets it."""
    x = randn(rng(10), 1, 6, 8)
    seen = []

    def old_style(q, k, v, mask=None, **kwargs):
        seen.append(sorted(kwargs))
        return sdpa(q, k, v, mask=mask, **kwargs)

    keras_attn.MultiHeadAttention(2, 4, implementation=old_style)(x, x, use_causal_mask=True)
    assert "attention_chunk_size" not in seen[-1]
    layer = keras_attn.MultiHeadAttention(2, 4, implementation=old_style, attention_chunk_size=2)
    layer(x, x, use_causal_mask=True)
    assert "attention_chunk_size" in seen[-1]
