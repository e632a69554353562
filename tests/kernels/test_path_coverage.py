"""Tests that observe which path ran, and blockwise in the places users train.

`keras_attn._policy.observe_paths()` counts every choice of path made inside it
(at trace time under a compiler), so a test can tell that `auto` really went
blockwise.
"""

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn import _device, config
from keras_attn._policy import block_size_for, device_kind, observe_paths, select_implementation
from keras_attn.testing.weights import randomize_weights, reference_params

from .. import reference
from ..fixtures import attention_settings_fixture
from ..helpers import assert_close, randn, rng, to_numpy

sdpa = keras_attn.scaled_dot_product_attention
BACKEND = keras.backend.backend()


# Blocks of 4 so that the test sizes span several, partial blocks.
_small_blocks = attention_settings_fixture(block_size=4)


# ----------------------------------------------------------------------------
# auto: observed, not inferred from the numbers.


def test_auto_goes_blockwise_and_the_spy_sees_it():
    config.set_blockwise_threshold(2 * 9 * 9)  # one head's scores fit, two don't
    g = rng(0)
    q, k, v = randn(g, 2, 2, 9, 4), randn(g, 2, 2, 9, 4), randn(g, 2, 2, 9, 3)
    mask = g.random((2, 1, 9, 9)) > 0.3
    with observe_paths() as taken:
        out = sdpa(q, k, v, mask=mask)
        assert taken == {"blockwise": 1}
        expected, _ = reference.scaled_dot_product_attention(q, k, v, mask=mask)
        assert_close(out, expected)
        sdpa(q[:1, :1], k[:1, :1], v[:1, :1], mask=mask[:1])
    assert taken == {"blockwise": 1, "fused": 1}


def test_unknown_batch_counts_as_one():
    config.set_blockwise_threshold(4 * 64 * 64)
    select = select_implementation
    kw = dict(backend=BACKEND, has_mask=False, has_bias=False, is_causal=True,
              needs_weights=False, symbolic=False)
    assert select("auto", lead=(None, 4), T=64, S=64, **kw) == "fused"
    torch_flash = "fused" if BACKEND == "torch" else "blockwise"
    assert select("auto", lead=(None, 4), T=65, S=65, **kw) == torch_flash
    assert select("auto", lead=(None, 4), T=65, S=65, **dict(kw, has_mask=True)) == "blockwise"


# The backend-aware policy (no setting made): pinned here per backend, so that it
# cannot change without a test saying so. benchmarks/crossover.py measures it.
CPU_LOOP_WINS = BACKEND in ("jax", "tensorflow")


def _policy(T, S, lead=(8, 8), device="cpu", **overrides):
    config.set_attention_block_size(None)
    kw = dict(backend=BACKEND, has_mask=False, has_bias=False, is_causal=True,
              needs_weights=False, symbolic=False, device=device)
    return select_implementation("auto", lead=lead, T=T, S=S, **{**kw, **overrides})


# (T, S, lead, causal) -> the backends whose CPU policy goes blockwise there.
POLICY = {
    (32, 32, (1, 1), True): {"jax"},                     # JAX's smallest blockwise scores
    (256, 256, (8, 8), True): {"jax"},                   # B=8, T=256, H=8: a training batch
    (16, 1024, (2, 8), False): {"jax"},                  # 16 queries over a long memory
    (512, 512, (1, 4), True): {"jax", "tensorflow"},     # TensorFlow's smallest, causal
    (512, 1024, (2, 8), False): {"jax"},                 # ... below its smallest full one
    (1024, 1024, (1, 4), False): {"jax", "tensorflow"},  # TensorFlow's smallest, full
    (2048, 2048, (1, 4), True): {"jax", "tensorflow"},   # B=1, T=2048, H=4: one long sequence
}


@pytest.mark.parametrize("shape", sorted(POLICY), ids=str)
def test_policy_on_this_backend_for_cpu_shapes(shape):
    T, S, lead, causal = shape
    loop = BACKEND in POLICY[shape]
    assert _policy(T, S, lead, is_causal=causal) == ("blockwise" if loop else "fused")
    assert _policy(T, S, lead, is_causal=causal, has_mask=True) == (
        "blockwise" if loop else "fused")
    assert _policy(T, S, lead, is_causal=causal, has_soft_cap=True) == (
        "blockwise" if loop else "explicit")


def test_policy_keeps_the_fused_kernel_for_small_scores_gpus_and_unknown_lengths():
    assert _policy(16, 16) == "fused"            # one head's scores below 32 x 32
    assert _policy(31, 32) == "fused"
    assert _policy(4, 1024) == "fused"           # decoding: fewer than 16 queries
    assert _policy(1, 4096, has_mask=True) == "fused"
    assert _policy(16, 16, has_soft_cap=True) == "explicit"
    for device in ("gpu", "cuda", "tpu"):        # cuDNN / flash kernels there
        assert _policy(2048, 2048, (1, 4), device=device) == "fused"
    assert _policy(None, 2048, (1, 4)) == "fused"  # blockwise needs static lengths
    assert _policy(511, 512, (1, 4)) == ("blockwise" if BACKEND == "jax" else "fused")
    # Scores that don't fit go blockwise on every backend and device, except
    # unmasked PyTorch, whose SDPA flash kernel is linear in memory.
    huge = dict(T=8192, S=8192, lead=(1, 4), device="gpu")
    assert _policy(**huge, has_mask=True) == "blockwise"
    assert _policy(**huge) == ("fused" if BACKEND == "torch" else "blockwise")


def test_decode_steps_over_a_cache_run_explicit_on_cpus():
    # Fewer than 16 queries over a key/value cache: explicit on every backend's CPU.
    for T in (1, 4, 15):
        assert _policy(T, 768, (1, 8), cached=True, has_mask=True) == "explicit"
    assert _policy(1, 768, (1, 8), cached=True, has_mask=True, has_soft_cap=True) == "explicit"
    # A prefill into the cache follows the ordinary rule; GPUs keep the fused kernel.
    assert _policy(512, 768, (1, 8), cached=True, has_mask=True) == (
        "blockwise" if CPU_LOOP_WINS else "fused")
    assert _policy(1, 768, (1, 8), cached=True, has_mask=True, device="gpu") == "fused"
    # Without a cache, few queries keep the fused kernel (the crossover tables).
    assert _policy(1, 768, (1, 8), has_mask=True) == "fused"


def test_a_set_threshold_replaces_the_policy():
    config.set_blockwise_threshold(2**30)
    assert _policy(2048, 2048, (1, 4)) == "fused"
    config.set_blockwise_threshold(100)
    assert _policy(16, 16, (1, 1), has_mask=True) == "blockwise"
    config.set_blockwise_threshold(None)
    assert _policy(2048, 2048, (1, 4)) == ("blockwise" if CPU_LOOP_WINS else "fused")
    assert _policy(32, 32, (1, 1)) == ("blockwise" if BACKEND == "jax" else "fused")


def test_block_size_follows_the_shape_unless_set():
    config.set_attention_block_size(None)
    size = block_size_for
    assert size((1, 4), 4096, 4096) == 512               # 4 x 512^2 = 2^20 scores a tile
    assert size((1, 4), 4096, 4096, banded=True) == 256  # causal / windowed: half the tile
    assert size((2, 4), 4096, 4096) == 256
    assert size((8, 8), 256, 256) == 128
    assert size((8, 8), 256, 256, banded=True) == 64     # 64 x 64^2 = 2^18 scores a tile
    assert size((8, 8), 512, 512, banded=True) == 128    # blocks below 128: at most 4 of them
    assert size((8, 8), 128, 128, banded=True) == 128    # one block: no loop at all
    assert size((8, 8), 1, 128, banded=True) == 128
    assert size((64, 64), 256, 256) == 64                # never below the smallest
    assert size((64, 64), 4096, 4096) == 128
    assert size((None, 4), 4096, 4096) == 512            # an unknown batch counts as 1
    config.set_attention_block_size(64)
    assert size((1, 4), 4096, 4096) == 64


def test_auto_takes_the_policy_path_in_a_real_call():
    """End to end on this machine's device (the tests run on CPUs)."""
    config.set_attention_block_size(None)
    g = rng(3)
    q, k, v = randn(g, 1, 1, 32, 4), randn(g, 1, 1, 32, 4), randn(g, 1, 1, 32, 4)
    with observe_paths() as taken:
        out = sdpa(q, k, v, is_causal=True)
    cpu = device_kind(keras.ops.convert_to_tensor(q)) == "cpu"
    assert taken == {"blockwise" if BACKEND == "jax" and cpu else "fused": 1}
    expected, _ = reference.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert_close(out, expected)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.function input signatures")
def test_tf_function_with_unknown_batch_goes_blockwise():
    import tensorflow as tf

    config.set_blockwise_threshold(150)  # per example: 2 heads x 10 x 10 = 200
    g = rng(1)
    layer = keras_attn.MultiHeadAttention(2, 4)
    x = randn(g, 3, 10, 8)
    layer.build(x.shape)
    randomize_weights(layer, seed=1)
    fn = tf.function(lambda t: layer(t, use_causal_mask=True),
                     input_signature=[tf.TensorSpec((None, 10, 8), tf.float32)])
    with observe_paths() as taken:
        out = fn(x)
    assert taken == {"blockwise": 1}
    expected, _ = reference.multi_head_attention(reference_params(layer), x, num_heads=2,
                                                 is_causal=True)
    assert_close(out, expected)


@pytest.mark.skipif(BACKEND != "tensorflow" or device_kind() != "cpu",
                    reason="TensorFlow's execution modes on a CPU (GPUs: one row)")
def test_tensorflow_auto_follows_how_the_call_runs():
    """One causal call (B=1, H=4, T=512) in each mode: XLA goes blockwise; a plain
    tf.function (Keras's fit and predict on a CPU) and eager stay fused."""
    import tensorflow as tf

    from keras_attn import _hooks

    assert _hooks.get("execution_mode") is _device.execution_mode  # registered in _device
    g = rng(3)
    q, k, v = (randn(g, 1, 4, 512, 8) for _ in range(3))
    expected, _ = reference.scaled_dot_product_attention(q, k, v, is_causal=True)
    modes = []

    def attend(q, k, v):
        modes.append(_device.execution_mode())
        return sdpa(q, k, v, is_causal=True)

    runs = {"xla": tf.function(attend, jit_compile=True), "graph": tf.function(attend),
            "eager": attend}
    for mode, run in runs.items():
        with observe_paths() as taken:
            out = run(q, k, v)
        assert modes[-1] == mode
        assert taken == {"blockwise" if mode == "xla" else "fused": 1}, mode
        assert_close(out, expected)
    # What Keras runs: `predict` on a CPU-only machine is a plain tf.function.
    for jit_compile, path in (("auto", "fused"), (True, "blockwise")):
        inputs = keras.Input((512, 8))
        attention = keras_attn.MultiHeadAttention(4, 2)
        model = keras.Model(inputs, attention(inputs, inputs, use_causal_mask=True))
        model.compile(jit_compile=jit_compile)
        with observe_paths() as taken:
            model.predict(q[0, :1], verbose=0)  # (1, 512, 8)
        assert taken == {path: 1}, jit_compile


@pytest.mark.skipif(BACKEND != "jax", reason="jax.export symbolic shapes")
def test_jax_export_with_symbolic_batch_goes_blockwise():
    import jax
    from jax import export

    config.set_blockwise_threshold(150)  # per example: 2 heads x 10 x 10 = 200
    g = rng(2)
    layer = keras_attn.MultiHeadAttention(2, 4)
    x = randn(g, 3, 10, 8)
    layer.build(x.shape)
    randomize_weights(layer, seed=2)
    weights = [w.value for w in layer.weights]

    def fn(values, t):
        with keras.StatelessScope(state_mapping=list(zip(layer.weights, values, strict=True))):
            return layer(t, use_causal_mask=True)

    (batch,) = export.symbolic_shape("b")
    spec = jax.ShapeDtypeStruct((batch, 10, 8), "float32")
    with observe_paths() as taken:
        exported = export.export(jax.jit(fn))(weights, spec)
    assert taken == {"blockwise": 1}
    out = exported.call(weights, x)
    expected, _ = reference.multi_head_attention(reference_params(layer), x, num_heads=2,
                                                 is_causal=True)
    assert_close(out, expected)


# ----------------------------------------------------------------------------
# Blockwise gradients in the configurations users hit.


def _key_padding_bias(B, S, lengths):
    bias = np.zeros((B, 1, 1, S), "float32")
    for b, n in enumerate(lengths):
        bias[b, ..., n:] = -np.inf
    return bias


CASES = {
    "no_causal_no_mask": dict(causal=False),
    "key_padding_bias": dict(causal=False, bias="padding"),
    "causal_key_padding_bias": dict(causal=True, bias="padding"),
    "minus_inf_rows": dict(causal=False, bias="rows"),
    "mask_and_rows_causal_T_lt_S": dict(causal=True, bias="rows", mask=True, T=5, S=9),
}


@pytest.mark.slow
@pytest.mark.requires_trainable_backend
@pytest.mark.parametrize("case", sorted(CASES))
def test_blockwise_gradients_against_reference(case):
    spec = CASES[case]
    T, S = spec.get("T", 7), spec.get("S", 7)
    g = rng(len(case))
    q, k, v = randn(g, 2, 2, T, 3), randn(g, 2, 2, S, 3), randn(g, 2, 2, S, 2)
    probe = randn(g, 2, 2, T, 2)
    bias = None
    if spec.get("bias") == "padding":
        bias = _key_padding_bias(2, S, [S, S - 3])
    elif spec.get("bias") == "rows":
        bias = randn(g, 1, 2, T, S)
        bias[0, 1, 2] = -np.inf  # a fully forbidden row
    mask = (g.random((2, 1, T, S)) > 0.3) if spec.get("mask") else None

    def loss(q_, k_, v_):
        out = sdpa(q_, k_, v_, mask=mask, bias=bias, is_causal=spec["causal"],
                   implementation="blockwise")
        return keras.ops.sum(out * keras.ops.convert_to_tensor(probe))

    with observe_paths() as taken:
        _, grads = _device.value_and_grad(loss, [q, k, v])
    assert taken == {"blockwise": 1}

    def ref_loss(which):
        def f(x):
            xs = [q, k, v]
            xs[which] = x
            out, _ = reference.scaled_dot_product_attention(
                *xs, mask=mask, bias=bias, is_causal=spec["causal"])
            return float((out * probe).sum())
        return f

    for which, grad in enumerate(grads):
        assert np.isfinite(grad).all()
        expected = reference.numerical_gradient(ref_loss(which), [q, k, v][which])
        assert_close(grad, expected, what=f"{case} gradient {which}")


@pytest.mark.slow
@pytest.mark.requires_trainable_backend
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_blockwise_gradients_in_half_precision(dtype):
    g = rng(3)
    q, k, v = randn(g, 2, 2, 7, 4), randn(g, 2, 2, 7, 4), randn(g, 2, 2, 7, 3)
    probe = randn(g, 2, 2, 7, 3)
    q, k, v = (to_numpy(keras.ops.cast(keras.ops.cast(x, dtype), "float32")) for x in (q, k, v))

    def loss(q_, k_, v_):
        q_, k_, v_ = (keras.ops.cast(x, dtype) for x in (q_, k_, v_))
        out = sdpa(q_, k_, v_, is_causal=True, implementation="blockwise")
        return keras.ops.sum(keras.ops.cast(out, "float32") * keras.ops.convert_to_tensor(probe))

    _, grads = _device.value_and_grad(loss, [q, k, v])
    for which, grad in enumerate(grads):
        def f(x, which=which):
            xs = [q, k, v]
            xs[which] = x
            return float((reference.scaled_dot_product_attention(*xs, is_causal=True)[0]
                          * probe).sum())
        assert np.isfinite(grad).all()
        assert_close(grad, reference.numerical_gradient(f, [q, k, v][which]), dtype=dtype,
                     what=f"{dtype} gradient {which}")


@pytest.mark.requires_trainable_backend
def test_blockwise_gradients_through_mha_with_masks():
    g = rng(4)
    x, memory = randn(g, 2, 6, 8), randn(g, 2, 9, 8)
    mask = g.random((2, 6, 9)) > 0.3
    mask[1, 3] = False
    key_mask = np.arange(9)[None, :] < np.array([[9], [5]])

    def run(implementation):
        keras.utils.set_random_seed(0)
        layer = keras_attn.MultiHeadAttention(2, 4, implementation=implementation)
        layer.build(x.shape, memory.shape)
        randomize_weights(layer, seed=4)

        def loss(*weights):
            out = layer(x, memory, attention_mask=mask, value_mask=key_mask)
            return keras.ops.sum(out * out)

        return _device.value_and_grad(loss, list(layer.trainable_weights))

    with observe_paths() as taken:
        value, grads = run("blockwise")
    assert taken.get("blockwise") and "explicit" not in taken
    ref_value, ref_grads = run("explicit")
    assert value == pytest.approx(ref_value, rel=1e-5)
    for grad, ref in zip(grads, ref_grads, strict=True):
        assert_close(grad, ref, what="MHA weight gradient, blockwise vs explicit",
                     quantity="gradient")


@pytest.mark.requires_trainable_backend
def test_blockwise_fit_with_a_partial_last_batch():
    """`fit` on 10 samples in batches of 4: the last batch has 2 (a retrace, None batch on TF)."""
    g = rng(5)
    x, y = randn(g, 10, 9, 8), randn(g, 10, 9, 8)

    def train(implementation):
        keras.utils.set_random_seed(0)
        inputs = keras.Input((9, 8))
        layer = keras_attn.MultiHeadAttention(2, 4, implementation=implementation)
        model = keras.Model(inputs, layer(inputs, use_causal_mask=True))
        randomize_weights(layer, seed=5)
        model.compile(keras.optimizers.SGD(0.05), "mse", jit_compile=BACKEND != "torch")
        history = model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
        return history.history["loss"][-1], [to_numpy(w) for w in model.weights]

    with observe_paths() as taken:
        loss, weights = train("blockwise")
    assert taken.get("blockwise")
    ref_loss, ref_weights = train("explicit")
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    for w, ref in zip(weights, ref_weights, strict=True):
        assert_close(w, ref, what="weights after one epoch")


# ----------------------------------------------------------------------------
# Layers: the decoder's Keras memory mask; mixed precision against the reference.


def test_decoder_memory_mask_from_an_embedding():
    g = rng(6)
    memory_ids = np.array([[3, 4, 5, 0, 0, 0], [1, 2, 3, 4, 5, 6]], "int32")
    target = keras.Input((5, 8))
    ids = keras.Input((6,), dtype="int32")
    memory = keras.layers.Embedding(10, 8, mask_zero=True, name="embed")(ids)
    decoder = keras_attn.TransformerDecoderLayer(2, intermediate_dim=16, name="decoder")
    model = keras.Model([target, ids], decoder(target, memory))
    randomize_weights(decoder, seed=6)
    x = randn(g, 2, 5, 8)
    out = model.predict_on_batch([x, memory_ids])
    embedded = to_numpy(model.get_layer("embed")(memory_ids))
    expected = reference.decoder_layer(reference_params(decoder), x, num_heads=2,
                                       memory=embedded, memory_padding_mask=memory_ids != 0)
    assert_close(out, expected)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("path", ["auto", "explicit", "fused", "blockwise"])
def test_mha_mixed_precision_against_reference(policy, path):
    if BACKEND == "numpy" and policy == "mixed_bfloat16":
        pytest.skip("NumPy has no bfloat16 matmul (Keras's NumPy backend cannot run it)")
    keras.config.set_dtype_policy(policy)
    g = rng(7)
    x, memory = randn(g, 2, 6, 8), randn(g, 2, 9, 8)
    mask = g.random((2, 6, 9)) > 0.3
    layer = keras_attn.MultiHeadAttention(2, 4, implementation=path)
    layer.build(x.shape, memory.shape)
    randomize_weights(layer, seed=7)
    out = layer(x, memory, attention_mask=mask, use_causal_mask=True)
    dtype = policy.split("_")[1]
    assert keras.backend.standardize_dtype(out.dtype) == dtype
    expected, _ = reference.multi_head_attention(reference_params(layer), x, memory,
                                                 num_heads=2, mask=mask, is_causal=True)
    assert_close(keras.ops.cast(out, "float32"), expected, dtype=dtype)
