"""The fused, blockwise and explicit paths: each against the float64 reference."""

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn import _device, config
from keras_attn._policy import select_implementation
from keras_attn.testing.weights import randomize_weights, reference_params

from .. import reference
from ..fixtures import attention_settings_fixture
from ..helpers import assert_close, randn, rng, to_numpy

sdpa = keras_attn.scaled_dot_product_attention
PATHS = ["explicit", "fused", "blockwise"]


# Blocks of 4 so that the test sizes span several, partial blocks.
_small_blocks = attention_settings_fixture(block_size=4)


def _inputs(seed, T, S, d_k=4, d_v=5, lead=(2, 3)):
    g = rng(seed)
    q, k, v = randn(g, *lead, T, d_k), randn(g, *lead, S, d_k), randn(g, *lead, S, d_v)
    return g, q, k, v


def _masks(g, T, S, kind):
    """(mask, bias) of a given kind; every masked kind has a fully masked row."""
    if kind == "none":
        return None, None
    if kind == "mask":
        mask = g.random((2, 1, T, S)) > 0.3
        mask[0, 0, T - 1] = False
        return mask, None
    if kind == "key_padding":
        mask = np.ones((2, 1, 1, S), bool)
        mask[1, ..., S // 2:] = False
        return mask, None
    if kind == "bias":
        bias = randn(g, 1, 3, T, S)
        bias[0, 2, T - 1] = -np.inf  # a row forbidden by the bias alone
        return None, bias
    if kind == "mask_and_key_bias":
        mask = g.random((2, 3, T, S)) > 0.4
        mask[1, 1, T - 1] = False
        return mask, randn(g, 2, 1, 1, S)
    raise ValueError(kind)


# ----------------------------------------------------------------------------
# Forward: every path against the reference.


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("T,S", [(9, 9), (5, 11), (11, 6), (1, 7)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kind", ["none", "mask", "key_padding", "bias", "mask_and_key_bias"])
def test_paths_match_reference(path, T, S, causal, kind):
    g, q, k, v = _inputs(T * 100 + S, T, S)
    mask, bias = _masks(g, T, S, kind)
    out = sdpa(q, k, v, mask=mask, bias=bias, is_causal=causal, implementation=path)
    expected, _ = reference.scaled_dot_product_attention(
        q, k, v, mask=mask, bias=bias, is_causal=causal)
    assert_close(out, expected, what=f"{path} output")
    assert np.isfinite(to_numpy(out)).all()


@pytest.mark.parametrize("path", PATHS)
def test_fully_masked_rows_are_zero_on_every_path(path):
    g, q, k, v = _inputs(3, 6, 6)
    mask = np.ones((2, 3, 6, 6), bool)
    mask[0, 1, 2] = False  # by the mask
    bias = np.zeros((1, 3, 6, 6), "float32")
    bias[0, 0, 4] = -np.inf  # by the bias
    out = to_numpy(sdpa(q, k, v, mask=mask, bias=bias, implementation=path))
    np.testing.assert_array_equal(out[0, 1, 2], 0.0)
    np.testing.assert_array_equal(out[:, 0, 4], 0.0)
    # Causal with more queries than keys: the first T - S queries see nothing.
    q = randn(g, 2, 3, 7, 4)
    out = to_numpy(sdpa(q, k, v, is_causal=True, implementation=path))
    np.testing.assert_array_equal(out[:, :, :1], 0.0)
    assert np.abs(out[:, :, 1:]).sum() > 0


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("lead", [(), (3,), (2, 2, 3)])
def test_paths_accept_any_leading_dims(path, lead):
    g, q, k, v = _inputs(4, 6, 9, lead=lead)
    mask = g.random((6, 9)) > 0.3
    out = sdpa(q, k, v, mask=mask, is_causal=True, implementation=path)
    expected, _ = reference.scaled_dot_product_attention(q, k, v, mask=mask, is_causal=True)
    assert_close(out, expected)


@pytest.mark.parametrize("path", ["fused", "blockwise"])
def test_paths_broadcast_key_value_over_heads(path):
    g = rng(5)
    q, k, v = randn(g, 2, 3, 6, 4), randn(g, 2, 1, 8, 4), randn(g, 2, 1, 8, 4)
    out = sdpa(q, k, v, is_causal=True, implementation=path)
    expected, _ = reference.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert_close(out, expected)


@pytest.mark.parametrize("path", ["fused", "blockwise"])
def test_scores_and_dropout_use_the_explicit_path(path):
    g, q, k, v = _inputs(6, 5, 5)
    out, weights = sdpa(q, k, v, is_causal=True, return_attention_scores=True,
                        implementation=path)
    ref_out, ref_weights = reference.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert_close(out, ref_out)
    assert_close(weights, ref_weights, what="weights")
    # With value = identity the output row is the (dropped) weight row.
    eye = np.eye(5, dtype="float32")
    clean = to_numpy(sdpa(q, k, eye, implementation=path))
    dropped = to_numpy(sdpa(q, k, eye, dropout_rate=0.5, seed=1, training=True,
                            implementation=path))
    kept = dropped != 0
    assert 0 < kept.mean() < 1  # dropout happened: only the explicit path can do it
    np.testing.assert_allclose(dropped[kept], clean[kept] / 0.5, rtol=1e-5)


@pytest.mark.parametrize("path", ["fused", "blockwise"])
@pytest.mark.parametrize("policy,dtype", [("float16", "float16"), ("bfloat16", "bfloat16")])
def test_half_precision_paths(path, policy, dtype):
    if keras.backend.backend() == "numpy" and dtype == "bfloat16":
        pytest.skip("numpy has no bfloat16 matmul")
    g, q, k, v = _inputs(7, 9, 9)
    q, k, v = (keras.ops.cast(x, dtype) for x in (q, k, v))
    out = sdpa(q, k, v, is_causal=True, implementation=path)
    assert keras.backend.standardize_dtype(out.dtype) == dtype
    expected, _ = reference.scaled_dot_product_attention(
        *(to_numpy(keras.ops.cast(x, "float32")) for x in (q, k, v)), is_causal=True)
    assert_close(keras.ops.cast(out, "float32"), expected, dtype=dtype)


# ----------------------------------------------------------------------------
# Gradients: finite, and equal to the reference's (float64 central differences).


@pytest.mark.requires_trainable_backend
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("T,S,row", [(1, 1, 0), (4, 5, 2)])
def test_a_row_killed_by_a_minus_inf_bias_has_zero_finite_gradients(path, T, S, row):
    """No mask, but a bias of -inf over a whole row: output and gradients 0 there.

    Found by the property tests (JAX, explicit path, T = S = 1): a floor on the
    softmax denominator so small that its square underflowed gave 0 / 0 = NaN
    in the gradient.
    """
    g = rng(31 + T)
    q, k, v = randn(g, 2, 3, T, 3), randn(g, 2, 3, S, 3), randn(g, 2, 3, S, 3)
    bias = randn(g, T, S)
    bias[row] = -np.inf
    probe = randn(g, 2, 3, T, 3)

    def loss(q, k, v):
        out = sdpa(q, k, v, bias=bias, implementation=path)
        return keras.ops.sum(out * keras.ops.convert_to_tensor(probe))

    _, grads = _device.value_and_grad(loss, [q, k, v])
    for name, grad in zip("qkv", grads, strict=True):
        assert np.isfinite(grad).all(), f"{path}: non-finite gradient of {name}"
    np.testing.assert_array_equal(grads[0][:, :, row], 0.0)
    out = to_numpy(sdpa(q, k, v, bias=bias, implementation=path))
    np.testing.assert_array_equal(out[:, :, row], 0.0)
    expected, _ = reference.scaled_dot_product_attention(q, k, v, bias=bias)
    assert_close(out, expected)


@pytest.mark.slow
@pytest.mark.requires_trainable_backend
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("T,S", [(6, 6), (3, 7), (7, 5)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gradients_match_reference(path, T, S, with_bias):
    g = rng(T * 10 + S)
    q, k, v = randn(g, 2, 1, T, 3), randn(g, 2, 1, S, 3), randn(g, 2, 1, S, 2)
    mask = g.random((2, 1, T, S)) > 0.3
    mask[0, 0, T - 1] = False  # a fully masked row
    bias = randn(g, 1, 1, T, S)
    probe = randn(g, 2, 1, T, 2)  # loss = sum(output * probe)
    args = [q, k, v] + ([bias] if with_bias else [])

    def loss(*xs):
        b = xs[3] if with_bias else None
        out = sdpa(xs[0], xs[1], xs[2], mask=mask, bias=b, is_causal=True,
                   implementation=path)
        return keras.ops.sum(out * keras.ops.convert_to_tensor(probe))

    value, grads = _device.value_and_grad(loss, args)
    args64 = [a.astype(np.float64) for a in args]

    def ref_loss(which):
        def f(x):
            xs = list(args64)
            xs[which] = x
            b = xs[3] if with_bias else None
            out, _ = reference.scaled_dot_product_attention(
                xs[0], xs[1], xs[2], mask=mask, bias=b, is_causal=True)
            return float((out * probe).sum())
        return f

    assert value == pytest.approx(ref_loss(0)(args64[0]), abs=1e-5)
    for which, grad in enumerate(grads):
        assert np.isfinite(grad).all()
        assert_close(grad, reference.numerical_gradient(ref_loss(which), args64[which]),
                     what=f"{path} gradient {which}")
    assert_close(grads[0][0, 0, T - 1], np.zeros(3), what="masked row query gradient")


# ----------------------------------------------------------------------------
# Selection, configuration and argument checks.


def _select(implementation="auto", T=128, S=128, lead=(8, 8), **kw):
    args = dict(backend=keras.backend.backend(), has_mask=False, has_bias=False,
                is_causal=True, needs_weights=False, symbolic=False)
    args.update(kw)
    return select_implementation(implementation, lead=lead, T=T, S=S, **args)


def test_auto_selection_follows_the_threshold():
    config.set_blockwise_threshold(8 * 8 * 128 * 128)
    assert _select() == "fused"  # exactly at the threshold
    assert _select(has_mask=True, T=129, S=129) == "blockwise"
    assert _select(T=129, S=129, needs_weights=True) == "explicit"
    assert _select(T=None, S=None) == "fused"  # unknown size: the fused path
    torch_unmasked = "fused" if keras.backend.backend() == "torch" else "blockwise"
    assert _select(T=129, S=129) == torch_unmasked
    assert _select(T=64, S=300) == "blockwise"  # causal with T != S needs a mask
    for path in PATHS:
        assert _select(path) == path
        assert _select(path, needs_weights=True) == "explicit"


def test_auto_goes_blockwise_above_the_threshold_and_agrees():
    config.set_blockwise_threshold(16)
    g, q, k, v = _inputs(8, 9, 9)
    mask, _ = _masks(g, 9, 9, "mask")
    out = sdpa(q, k, v, mask=mask, is_causal=True)
    expected, _ = reference.scaled_dot_product_attention(q, k, v, mask=mask, is_causal=True)
    assert_close(out, expected)


def test_blockwise_needs_static_lengths():
    with pytest.raises(ValueError, match="static"):
        _select("blockwise", T=None)


def test_config_setters_validate_and_apply():
    config.set_attention_block_size(7)
    assert config.attention_block_size() == 7
    config.set_blockwise_threshold(123)
    assert config.blockwise_threshold() == 123
    with pytest.raises(ValueError, match="Received: block_size=0"):
        config.set_attention_block_size(0)
    with pytest.raises(ValueError, match="Received: num_scores=-1"):
        config.set_blockwise_threshold(-1)


def test_bad_implementation_is_rejected():
    q = np.zeros((2, 3), "float32")
    with pytest.raises(ValueError, match=r"implementation.*Received: implementation='flash'$"):
        sdpa(q, q, q, implementation="flash")
    with pytest.raises(ValueError, match=r"Received: implementation='flash'$"):
        keras_attn.MultiHeadAttention(2, 4, implementation="flash")


# ----------------------------------------------------------------------------
# MultiHeadAttention on every path.


@pytest.mark.parametrize("path", ["auto"] + PATHS)
@pytest.mark.parametrize("causal", [False, True])
def test_mha_paths_match_reference(path, causal):
    g = rng(9)
    B, T, S = 2, 7, 9
    q, kv = randn(g, B, T, 6), randn(g, B, S, 10)
    layer = keras_attn.MultiHeadAttention(num_heads=2, key_dim=3, value_dim=5,
                                          implementation=path)
    layer.build(q.shape, kv.shape)
    randomize_weights(layer, seed=9)
    mask = g.random((B, T, S)) > 0.3
    mask[1, 2] = False
    out = layer(q, kv, attention_mask=mask, use_causal_mask=causal)
    expected, _ = reference.multi_head_attention(
        reference_params(layer), q, kv, num_heads=2, mask=mask, is_causal=causal)
    assert_close(out, expected)


def test_mha_implementation_in_config():
    layer = keras_attn.MultiHeadAttention(2, 4, implementation="blockwise")
    config_ = layer.get_config()
    assert config_["implementation"] == "blockwise"
    assert keras_attn.MultiHeadAttention.from_config(config_).implementation == "blockwise"
    assert keras_attn.MultiHeadAttention(2, 4).implementation == "auto"


@pytest.mark.requires_trainable_backend
@pytest.mark.parametrize("jit_compile", [True, False], ids=["jit", "graph"])
@pytest.mark.parametrize("path", ["fused", "blockwise"])
def test_compiled_train_step_matches_explicit(path, jit_compile):
    """One compiled SGD step gives the explicit path's weights.

    `graph`: a `tf.function` without XLA on TensorFlow (graph-mode while
    loops), the same as `jit` elsewhere.
    """
    g = rng(10)
    x = randn(g, 2, 9, 8)
    y = randn(g, 2, 9, 8)

    def step(implementation):
        keras.utils.set_random_seed(0)
        inputs = keras.Input((9, 8))
        layer = keras_attn.MultiHeadAttention(2, 4, implementation=implementation)
        outputs = layer(inputs, use_causal_mask=True)
        model = keras.Model(inputs, outputs)
        randomize_weights(layer, seed=10)
        model.compile(keras.optimizers.SGD(0.1), "mse",
                      jit_compile=jit_compile and keras.backend.backend() != "torch")
        loss = model.train_on_batch(x, y)
        return loss, [to_numpy(w) for w in model.weights]

    loss, weights = step(path)
    ref_loss, ref_weights = step("explicit")
    assert loss == pytest.approx(ref_loss, abs=1e-5)
    for w, w_ref in zip(weights, ref_weights, strict=True):
        assert np.isfinite(w).all()
        assert_close(w, w_ref, what=f"{path} weights after one step")


@pytest.mark.parametrize("implementation", ["fused", "explicit"])
@pytest.mark.parametrize("projection", ["query", "output"])
def test_mha_with_lora_on_a_projection_matches_reference(projection, implementation):
    """A LoRA-enabled sublayer is called as a layer; its effective kernel is used.

    The output projection reads `(B, T, H, d)` after the fused path and
    `(B, H, T, d)` after the others: both layouts reach a LoRA sublayer.
    """
    g = rng(11)
    x = randn(g, 2, 6, 8)
    layer = keras_attn.MultiHeadAttention(num_heads=2, key_dim=4, implementation=implementation)
    layer.build(x.shape)
    randomize_weights(layer, seed=11)
    dense = getattr(layer, f"{projection}_dense")
    dense.enable_lora(rank=2)
    dense.lora_kernel_b.assign(randn(g, *dense.lora_kernel_b.shape))
    out = layer(x, use_causal_mask=True)
    params = reference_params(layer)  # reads `kernel`, which includes the LoRA term
    plain = to_numpy(dense._kernel).astype(np.float64)
    assert np.abs(params[projection]["kernel"] - plain).max() > 1e-3  # LoRA is not a no-op
    expected, _ = reference.multi_head_attention(params, x, num_heads=2, is_causal=True)
    assert_close(out, expected)


# ----------------------------------------------------------------------------
# Eager calls of the blockwise kernel: compiled once per shape on JAX.


def test_eager_blockwise_calls_trace_once_per_shape_on_jax(monkeypatch):
    """On JAX a repeated eager call at one shape reuses one compiled program (before, each
    call traced and compiled its loops again, about 1 s a call); elsewhere nothing is
    compiled, so every call runs the kernel. Both give the reference's numbers."""
    from keras_attn._kernels import blockwise, compiled

    traces = []
    inner = blockwise._blockwise

    def counted(*args, **kwargs):
        traces.append(1)
        return inner(*args, **kwargs)

    monkeypatch.setattr(blockwise, "_blockwise", counted)
    monkeypatch.setattr(compiled, "_CACHE", {})
    g, q, k, v = _inputs(7, 9, 9)
    want, _ = reference.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5)
    for _ in range(3):
        out = blockwise.blockwise_attention(q, k, v, is_causal=True, scale=0.5, block_size=4)
        assert_close(to_numpy(out), want, "float32")
    assert len(traces) == (1 if keras.backend.backend() == "jax" else 3)


@pytest.mark.parametrize("path", PATHS)
def test_eager_attention_calls_trace_once_per_shape_on_jax(monkeypatch, path):
    """On JAX an eager call is one compiled program per shape and settings (op by op, an
    explicit call of this size compiled about 20 programs, 1.4 s); elsewhere `_attend` runs
    at every call. A changed block size or a replaced kernel is not answered from a
    program traced before it."""
    from keras_attn import attention
    from keras_attn._kernels import compiled

    traces = []
    inner = attention._attend

    def counted(*args, **kwargs):
        traces.append(kwargs.get("block_size"))
        return inner(*args, **kwargs)

    monkeypatch.setattr(attention, "_attend", counted)
    monkeypatch.setattr(compiled, "_CACHE", {})
    g, q, k, v = _inputs(8, 9, 9)
    want, _ = reference.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5)
    for block in (4, 4, 8):
        config.set_attention_block_size(block)
        out = sdpa(q, k, v, is_causal=True, scale=0.5, implementation=path)
        assert_close(to_numpy(out), want, "float32")
    config.set_attention_block_size(None)
    jax = keras.backend.backend() == "jax"
    if path == "blockwise":  # the block size is a setting of the call
        assert traces == ([4, 8] if jax else [4, 4, 8])
    else:
        assert len(traces) == (1 if jax else 3)
