"""Property-based tests (Hypothesis) of the attention core and the layers.

Every path against the float64 reference, metamorphic relations (key
permutation, masked-out keys, row shifts of the logits), empty lengths,
half-precision range, argument checks, gradients across paths, and layer
shapes, configs and `.keras` round trips. Example counts come from the
Hypothesis profile (`ci` by default, `--hypothesis-profile=thorough`); see
tests/conftest.py. Tolerances come from keras_attn.testing.tolerances only.
"""

import dataclasses
import os
import tempfile

import keras
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import keras_attn
from keras_attn import _device
from keras_attn.testing.tolerances import tolerance
from keras_attn.testing.weights import randomize_weights

from .. import reference
from ..fixtures import attention_settings_fixture
from ..helpers import UNCACHED, assert_close, to_numpy
from ..strategies import (
    MAX_LEN,
    PATHS,
    build,
    large_logit_problems,
    mha_configs,
    problems,
    to_backend,
    transformer_configs,
)

sdpa = keras_attn.scaled_dot_product_attention
ops = keras.ops


def examples(fraction):
    """A share of the active profile's `max_examples` (at least 2)."""
    return settings(max_examples=max(2, round(settings.default.max_examples * fraction)))


# Blocks of 4 (several, partial blocks at these lengths); `auto` goes blockwise above
# 64 scores. Restored after the module.
_small_blocks = attention_settings_fixture(block_size=4, threshold=64, scope="module")


def attend(p, q, k, v, mask, bias, path=None, is_causal=None):
    """`scaled_dot_product_attention` of NumPy inputs in `p.dtype`, as float64 NumPy."""
    out = sdpa(to_backend(q, p.dtype), to_backend(k, p.dtype), to_backend(v, p.dtype),
               mask=mask, bias=to_backend(bias, p.dtype),
               is_causal=p.is_causal if is_causal is None else is_causal, scale=p.scale,
               implementation=path or p.implementation, **p.options)
    assert keras.backend.standardize_dtype(out.dtype) == p.dtype
    return np.asarray(to_numpy(ops.cast(out, "float32")), np.float64)


def expected(p, q, k, v, mask, bias):
    """The float64 reference; integer masks mean nonzero = may attend."""
    mask = None if mask is None else np.asarray(mask) != 0
    out, _ = reference.scaled_dot_product_attention(
        q, k, v, mask=mask, bias=bias, is_causal=p.is_causal, scale=p.scale, **p.options)
    return out


def close(actual, wanted, dtype, what):
    """Within the dtype's output tolerance, NaN never equal to a number."""
    np.testing.assert_allclose(actual, wanted, err_msg=what, **tolerance(dtype))


# ----------------------------------------------------------------------------
# Forward: every path against the float64 reference.


@examples(1.0)
@given(problems(paths=PATHS + ("auto",), modern=True))
def test_every_path_matches_the_reference(p):
    q, k, v, mask, bias = build(p)
    out = attend(p, q, k, v, mask, bias)
    assert np.isfinite(out).all(), f"{p.implementation}: non-finite output"
    assert_close(out, expected(p, q, k, v, mask, bias), dtype=p.dtype,
                 what=f"{p.implementation} output")


@examples(0.5)
@given(large_logit_problems())
def test_half_precision_large_logits_stay_finite_and_exact(p):
    """Logits up to ~1e5 in float16/bfloat16: the softmax must run in float32."""
    q, k, v, mask, bias = build(p)
    out = attend(p, q, k, v, mask, bias)
    assert np.isfinite(out).all(), f"{p.implementation} {p.dtype}: non-finite output"
    assert_close(out, expected(p, q, k, v, mask, bias), dtype=p.dtype,
                 what=f"{p.implementation} {p.dtype} output, large logits")


# ----------------------------------------------------------------------------
# Metamorphic relations.


def _full_mask(p, mask):
    """The mask with causality folded in, as bool `(..., T, S)` (S never broadcast)."""
    allowed = np.ones((p.T, p.S), bool) if mask is None else np.asarray(mask) != 0
    if p.is_causal:
        allowed = allowed & reference.causal_mask(p.T, p.S)
    return np.broadcast_to(allowed, allowed.shape[:-1] + (p.S,)).copy()


@examples(0.5)
@given(problems(), st.data())
def test_permuting_keys_with_mask_and_bias_changes_nothing(p, data):
    q, k, v, mask, bias = build(p)
    mask = _full_mask(p, mask)  # causality as a mask: it is not permutation-invariant
    perm = np.asarray(data.draw(st.permutations(range(p.S)), label="perm"))
    out = attend(p, q, k, v, mask, bias, is_causal=False)

    def permute(x):
        return x if x is None or x.shape[-1] != p.S else np.take(x, perm, axis=-1)

    out_perm = attend(p, q, np.take(k, perm, axis=-2), np.take(v, perm, axis=-2),
                      permute(mask), permute(bias), is_causal=False)
    close(out_perm, out, p.dtype, f"{p.implementation}: permuted keys")


@examples(0.5)
@given(problems(), st.data())
def test_a_masked_out_key_changes_nothing(p, data):
    """A key no query may attend (by the mask or by a -inf bias column), whose
    key and value may hold anything (NaN, inf), leaves every output unchanged."""
    q, k, v, mask, bias = build(p)
    # Prepending keeps the causal alignment (S - T grows by one with the keys).
    pos = 0 if p.is_causal else data.draw(st.integers(0, p.S), label="position")
    how = data.draw(st.sampled_from(["mask", "bias"]), label="masked by")
    fill_v = data.draw(st.sampled_from([np.nan, np.inf, -np.inf, 1e4, 0.5]), label="value")
    fill_k = data.draw(st.sampled_from([np.nan, 1e4, 0.5]), label="key")
    out = attend(p, q, k, v, mask, bias)

    def insert(x, value):
        x = np.broadcast_to(x, x.shape[:-1] + (p.S,))
        return np.insert(x, pos, value, axis=-1)

    k2 = np.insert(k, pos, fill_k, axis=-2)
    v2 = np.insert(v, pos, fill_v, axis=-2)
    mask2, bias2 = mask, bias
    if how == "mask":
        mask2 = insert(np.ones(p.S, bool) if mask is None else mask, 0)
        if bias is not None:
            bias2 = insert(bias, 1.0)
    else:
        if mask is not None:
            mask2 = insert(mask, 1)
        bias2 = insert(np.zeros(p.S, np.float32) if bias is None else bias, -np.inf)
    out2 = attend(p, q, k2, v2, mask2, bias2)
    assert np.isfinite(out2).all(), (
        f"{p.implementation}: a key masked by the {how} (key {fill_k}, value {fill_v}) "
        "leaked into the output")
    close(out2, out, p.dtype, f"{p.implementation}: masked-out key at {pos} by the {how}")


@examples(0.5)
@given(problems(dtypes=("float32",)), st.data())
def test_adding_a_constant_to_a_row_of_logits_changes_nothing(p, data):
    q, k, v, mask, bias = build(p)
    per_head = data.draw(st.booleans(), label="per (batch, head) constants")
    shape = (p.lead if per_head else ()) + (p.T, 1)
    shift = np.random.default_rng(p.seed + 1).uniform(-20, 20, shape).astype(np.float32)
    out = attend(p, q, k, v, mask, bias)
    shifted = attend(p, q, k, v, mask, shift if bias is None else bias + shift)
    close(shifted, out, p.dtype, f"{p.implementation}: logits shifted row-wise")


# ----------------------------------------------------------------------------
# Empty lengths.


@examples(0.25)
@given(problems(T=(0, 0), S=(0, MAX_LEN)))
def test_no_queries_give_an_empty_output(p):
    q, k, v, mask, bias = build(p)
    out = attend(p, q, k, v, mask, bias)
    assert out.shape == p.lead + (0, p.d_v)


@examples(0.25)
@given(problems(S=(0, 0)))
def test_no_keys_give_zero_rows(p):
    q, k, v, mask, bias = build(p)
    out = attend(p, q, k, v, mask, bias)
    np.testing.assert_array_equal(out, np.zeros(p.lead + (p.T, p.d_v)))


# ----------------------------------------------------------------------------
# Argument checks.


@examples(0.15)
@given(problems(biases=False).filter(lambda p: p.mask_shape is not None),
       st.sampled_from(["float32", "float16"]))
def test_a_floating_mask_is_rejected(p, mask_dtype):
    q, k, v, mask, _ = build(p)
    with pytest.raises(ValueError, match="bias"):
        attend(p, q, k, v, (np.asarray(mask) != 0).astype(mask_dtype), None)


@examples(0.15)
@given(problems(masks=False, biases=False, dtypes=("float32",)),
       st.sampled_from(["query", "key", "value"]), st.sampled_from(["int32", "bool"]))
def test_integer_or_bool_query_key_value_are_rejected(p, which, dtype):
    q, k, v, _, _ = build(p)
    tensors = {"query": q, "key": k, "value": v}
    tensors[which] = ops.cast(np.round(tensors[which]), dtype)
    with pytest.raises(ValueError):
        sdpa(*(ops.convert_to_tensor(tensors[n]) for n in ("query", "key", "value")),
             is_causal=p.is_causal, implementation=p.implementation)


# ----------------------------------------------------------------------------
# Gradients (trainable backends).


def _gradients(p, q, k, v, mask, bias, path):
    """Gradients of `sum(out * probe)` w.r.t. q, k, v (and bias), as float64 NumPy."""
    np_dtype = np.float16 if p.dtype == "float16" else np.float32
    args = [x.astype(np_dtype) for x in (q, k, v)] + ([] if bias is None else [bias.astype(np_dtype)])
    probe = np.random.default_rng(p.seed + 2).standard_normal(p.lead + (p.T, p.d_v))

    def loss(*xs):
        out = sdpa(xs[0], xs[1], xs[2], mask=mask, bias=xs[3] if bias is not None else None,
                   is_causal=p.is_causal, scale=p.scale, implementation=path,
                   **(p.options if path != "fused" else dict(p.options, logit_soft_cap=None)))
        return ops.sum(ops.cast(out, "float32") * ops.convert_to_tensor(probe.astype(np.float32)))

    value, grads = _device.value_and_grad(loss, args)
    assert np.isfinite(value), f"{path}: non-finite loss"
    return [np.asarray(g, np.float64) for g in grads]


NAMES = ("query", "key", "value", "bias")


@pytest.mark.requires_trainable_backend
@examples(0.2)
@given(problems(dtypes=("float32", "float16"), paths=("explicit",), modern=True))
def test_gradients_are_finite_and_agree_across_paths(p):
    q, k, v, mask, bias = build(p)
    base = _gradients(p, q, k, v, mask, bias, "explicit")
    tol = tolerance(p.dtype, "gradient")
    for path in PATHS if p.soft_cap is None else ("explicit", "blockwise"):
        grads = base if path == "explicit" else _gradients(p, q, k, v, mask, bias, path)
        for name, g, g0 in zip(NAMES, grads, base):
            assert np.isfinite(g).all(), f"{path}: non-finite gradient of {name}"
            np.testing.assert_allclose(g, g0, err_msg=f"{path} vs explicit: d{name}", **tol)


@pytest.mark.requires_trainable_backend
@examples(0.2)
@given(st.sampled_from(["T", "S"]).flatmap(
    lambda empty: problems(dtypes=("float32",), **{empty: (0, 0)})))
def test_gradients_of_empty_lengths_are_empty_or_zero(p):
    q, k, v, mask, bias = build(p)
    for path in PATHS:
        grads = _gradients(p, q, k, v, mask, bias, path)
        for name, g, x in zip(NAMES, grads, (q, k, v, bias)):
            assert g.shape == x.shape, f"{path}: d{name} shape"
            np.testing.assert_array_equal(g, 0.0, err_msg=f"{path}: d{name}")


# ----------------------------------------------------------------------------
# Layers: declared shapes, config round trip, `.keras` round trip.


def _round_trips(layer, inputs):
    """`from_config` + weights, and a `.keras` save/load, reproduce the outputs."""
    out = to_numpy(layer(*inputs))
    config_ = layer.get_config()
    clone = type(layer).from_config(config_)
    assert clone.get_config() == config_
    clone(*inputs)  # builds
    clone.set_weights(layer.get_weights())
    np.testing.assert_array_equal(to_numpy(clone(*inputs)), out, err_msg="from_config")

    symbolic = [keras.Input(x.shape[1:]) for x in inputs]
    model = keras.Model(symbolic, layer(*symbolic))
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "model.keras")
        model.save(path)
        loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(to_numpy(loaded(list(inputs))), out, err_msg=".keras")
    return out


@st.composite
def _lengths(draw):
    return draw(st.integers(1, 2)), draw(st.integers(1, 6)), draw(st.integers(1, 6))


@st.composite
def mha_cases(draw):
    """(config, input shapes `[(B, T, q_dim)]` or `[.., (B, S, kv_dim)]`, seed)."""
    cfg = draw(mha_configs())
    B, T, S = draw(_lengths())
    shapes = [(B, T, draw(st.integers(1, 6)))]
    if draw(st.booleans()):  # cross-attention
        shapes.append((B, S, draw(st.integers(1, 6))))
    return cfg, shapes, draw(st.integers(0, 2**16))


@st.composite
def transformer_cases(draw):
    """(kind, num_heads, keyword arguments, input shapes, seed) of an encoder,
    decoder-only or encoder-decoder layer."""
    num_heads, kwargs, D = draw(transformer_configs())
    B, T, S = draw(_lengths())
    kind = draw(st.sampled_from(["encoder", "decoder", "decoder with memory"]))
    shapes = [(B, T, D)]
    if kind == "decoder with memory":
        shapes.append((B, S, draw(st.integers(1, 6))))
    return kind, num_heads, kwargs, shapes, draw(st.integers(0, 2**16))


def _built(make, shapes, seed):
    """The layer, built on random inputs of `shapes` and given random weights."""
    rng = np.random.default_rng(seed)
    inputs = tuple(rng.standard_normal(shape).astype(np.float32) for shape in shapes)
    layer = make()
    layer(*inputs)  # builds
    randomize_weights(layer, seed=seed)
    return layer, inputs


def _make_mha(cfg):
    return lambda: keras_attn.MultiHeadAttention(**cfg)


def _make_transformer(kind, num_heads, kwargs):
    cls = keras_attn.TransformerEncoderLayer if kind == "encoder" else keras_attn.TransformerDecoderLayer
    return lambda: cls(num_heads, **kwargs)  # arguments after num_heads are keyword-only


def _check_declared_shape(layer, inputs):
    out = to_numpy(layer(*inputs))
    assert out.shape == tuple(layer.compute_output_shape(*(x.shape for x in inputs)))
    assert np.isfinite(out).all()
    return out


@examples(0.15)
@given(mha_cases())
def test_multi_head_attention_output_has_the_declared_shape(case):
    cfg, shapes, seed = case
    _check_declared_shape(*_built(_make_mha(cfg), shapes, seed))


@examples(0.1)
@given(mha_cases())
def test_multi_head_attention_survives_config_and_keras_round_trips(case):
    cfg, shapes, seed = case
    _round_trips(*_built(_make_mha(cfg), shapes, seed))


@examples(0.15)
@given(transformer_cases())
def test_transformer_layers_output_has_the_declared_shape(case):
    kind, num_heads, kwargs, shapes, seed = case
    out = _check_declared_shape(*_built(_make_transformer(kind, num_heads, kwargs), shapes, seed))
    assert out.shape == shapes[0]


@examples(0.1)
@given(transformer_cases())
def test_transformer_layers_survive_config_and_keras_round_trips(case):
    kind, num_heads, kwargs, shapes, seed = case
    _round_trips(*_built(_make_transformer(kind, num_heads, kwargs), shapes, seed))


# ----------------------------------------------------------------------------
# Grouped heads, windows and soft-caps: metamorphic properties.


@examples(1.0)
@given(problems(paths=PATHS, dtypes=("float32",), modern=True))
def test_grouped_heads_equal_explicitly_repeated_keys(p):
    """GQA equals attention over keys/values repeated G times (and H_kv = H is plain MHA)."""
    q, k, v, mask, bias = build(p)
    grouped = attend(p, q, k, v, mask, bias)
    repeated = attend(p, q, np.repeat(k, p.kv_group, axis=-3), np.repeat(v, p.kv_group, axis=-3),
                      mask, bias)
    close(grouped, repeated, p.dtype, f"{p.implementation}: grouped vs repeated")


@examples(1.0)
@given(problems(paths=PATHS, dtypes=("float32",), modern=True))
def test_a_window_wider_than_the_sequences_is_no_window(p):
    q, k, v, mask, bias = build(p)
    wide = dataclasses.replace(p, window=p.T + p.S + 1)
    none = dataclasses.replace(p, window=None)
    close(attend(wide, q, k, v, mask, bias), attend(none, q, k, v, mask, bias), p.dtype,
          f"{p.implementation}: W >= T + S vs no window")


@examples(1.0)
@given(problems(paths=("explicit", "blockwise"), dtypes=("float32",), modern=True))
def test_a_huge_soft_cap_is_no_cap(p):
    q, k, v, mask, bias = build(p)
    huge = dataclasses.replace(p, soft_cap=1e6)
    none = dataclasses.replace(p, soft_cap=None)
    close(attend(huge, q, k, v, mask, bias), attend(none, q, k, v, mask, bias), p.dtype,
          f"{p.implementation}: c = 1e6 vs no cap")


# ----------------------------------------------------------------------------
# Cached decoding: prefill, then the rest in random chunks, equals the full forward.


@st.composite
def cached_decoding_cases(draw):
    """(layer options, B, T, S_max, chunk lengths summing to T, seed)."""
    num_heads = draw(st.sampled_from([1, 2, 4]))
    options = dict(
        num_heads=num_heads,
        key_dim=2 * draw(st.integers(1, 2)),  # even: RoPE rotates pairs
        num_key_value_heads=draw(st.sampled_from([h for h in (1, 2, 4) if num_heads % h == 0])),
        rope_max_wavelength=draw(st.sampled_from([None, 100.0])),
        rope_interleaved=draw(st.booleans()),
        sliding_window=draw(st.none() | st.integers(1, 4)),
        qk_norm=draw(st.sampled_from([None, "rms"])),
        implementation=draw(st.sampled_from(("auto",) + PATHS)),
    )
    B, T = draw(st.integers(1, 2)), draw(st.integers(1, 7))
    chunks, left = [], T
    while left:
        chunks.append(draw(st.integers(1, left)))
        left -= chunks[-1]
    S_max = T + draw(st.integers(0, 3))  # unwritten slots at the end
    return options, B, T, S_max, chunks, draw(st.integers(0, 2**16))


@examples(0.5)
@given(cached_decoding_cases())
def test_prefill_then_random_chunks_equal_the_full_forward(case):
    options, B, T, S_max, chunks, seed = case
    g = np.random.default_rng(seed)
    x = g.standard_normal((B, T, 3)).astype("float32")
    layer = keras_attn.MultiHeadAttention(**options)
    layer.build(x.shape)
    randomize_weights(layer, seed=seed)
    full = to_numpy(layer(x, use_causal_mask=True))
    cache = keras_attn.empty_cache(layer, B, S_max)
    # Slots not yet written hold NaN: attending one would show in the output.
    cache = ops.convert_to_tensor(np.full(tuple(cache.shape), np.nan, "float32"))
    start = 0
    for length in chunks:
        out, cache = layer(x[:, start:start + length], cache=cache, cache_update_index=start,
                           use_causal_mask=True)
        assert_close(out, full[:, start:start + length], against=UNCACHED,
                     what=f"rows {start}:{start + length} of chunks {chunks}")
        start += length
