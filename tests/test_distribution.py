"""keras_attn.distribution: weight layouts and sharded == single-device numerics.

Needs JAX with 8 devices. `tox -e multidevice` runs this module on JAX with
8 CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count=8, set
before JAX starts); in the ordinary environments it is skipped, except for
the check that other backends get a clear error.
"""

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn import _device
from keras_attn.distribution import get_layout_map
from keras_attn.testing.weights import randomize_weights

from .helpers import randn, rng

BACKEND = keras.backend.backend()
DEVICES = len(keras.distribution.list_devices()) if BACKEND == "jax" else 0
needs_8 = pytest.mark.skipif(
    DEVICES < 8,
    reason=(f"needs the JAX backend with 8 devices (found {DEVICES} on {BACKEND}); "
            "tox's parity environment (or `tox -e multidevice`) runs it on 8 CPU devices "
            "(XLA_FLAGS=--xla_force_host_platform_device_count=8)"),
)
# Sharded results are the single-device ones up to summation order.
TARGET = 1e-5
B, T, S, D, H, F = 8, 6, 5, 32, 4, 64
WORST = {}  # (layer, strategy, quantity) -> worst max abs difference


@pytest.fixture(scope="module", autouse=True)
def _report(request):
    yield
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None or not WORST:
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line("")
        for (layer, strategy, quantity), err in sorted(WORST.items()):
            reporter.write_line(f"keras_attn distribution: {layer:<8} {strategy:<12} "
                                f"{quantity:<11} max |sharded - single| = {err:.2e}")


def _record(layer, strategy, quantity, actual, expected, target=TARGET):
    actual = np.asarray(keras.ops.convert_to_numpy(actual), np.float64)
    expected = np.asarray(keras.ops.convert_to_numpy(expected), np.float64)
    assert actual.shape == expected.shape
    err = float(np.abs(actual - expected).max())
    key = (layer, strategy, quantity)
    WORST[key] = max(WORST.get(key, 0.0), err)
    assert err <= target, f"{layer} {strategy} {quantity}: max abs {err:.2e} > {target:.2e}"


def _mesh():
    return keras.distribution.DeviceMesh((2, 4), ("batch", "model"))


def _strategy(name):
    if name == "data":
        # DataParallel wants a 1-D mesh: all 8 devices split the batch.
        return keras.distribution.DataParallel(devices=keras.distribution.list_devices())
    return keras.distribution.ModelParallel(layout_map=get_layout_map(_mesh()))


def _spec(variable):
    """The JAX sharding of a variable's value as a tuple, one entry per dim."""
    spec = tuple(variable.value.sharding.spec)
    return spec + (None,) * (len(variable.shape) - len(spec))


_COLUMN = {"kernel": (None, "model"), "bias": ("model",)}
_ROW = {"kernel": ("model", None), "bias": (None,)}


def _expected_spec(path, strategy, kv_replicated=False):
    """The tensor-parallel plan of docs/guides/scaling-out.md, written out per weight name."""
    sublayer, weight = path.split("/")[-2:]
    if weight in ("gate_kernel", "intermediate_kernel", "output_kernel"):  # (E, ., .)
        split = strategy == "model" and not kv_replicated
        return ("model", None, None) if split else (None, None, None)
    if weight in ("gate_bias", "intermediate_bias", "output_bias"):  # (E, .): with its expert
        split = strategy == "model" and not kv_replicated
        return ("model", None) if split else (None, None)
    if weight == "router_kernel":  # (D, E): every device routes every token
        return (None, None)
    if weight == "router_bias":  # (E,): added to every token's router logits
        return (None,)
    if weight.startswith("shared_") or weight == "router_correction_bias":
        # DeepSeek V3's shared expert (every token runs it) and correction bias: replicated
        return (None, None) if weight != "router_correction_bias" else (None,)
    ndim = 2 if weight == "kernel" else 1
    if strategy == "data" or sublayer.endswith("_norm"):
        return (None,) * ndim
    if kv_replicated and sublayer in ("key_dense", "value_dense"):
        return (None,) * ndim
    if sublayer in ("query_dense", "key_dense", "value_dense", "intermediate_dense"):
        return _COLUMN[weight]
    assert sublayer == "output_dense", path
    return _ROW[weight]


def _case(name):
    """`(make layer, inputs, call)` for each layer under test."""
    g = rng(1)
    x = randn(g, B, T, D)
    memory = randn(g, B, S, D)
    if name == "mha":
        return (lambda: keras_attn.MultiHeadAttention(H, D // H, name="mha"), [x, memory],
                lambda layer, q, kv: layer(q, kv, use_causal_mask=True))
    if name in ("mha_gqa_rope", "mha_mqa"):  # H_kv = 2 or 1 does not divide the model axis (4)
        kv_heads = 2 if name == "mha_gqa_rope" else 1
        rope = 10000.0 if name == "mha_gqa_rope" else None
        return (lambda: keras_attn.MultiHeadAttention(
            H, D // H, num_key_value_heads=kv_heads, rope_max_wavelength=rope, name=name),
            [x, memory], lambda layer, q, kv: layer(q, kv, use_causal_mask=True))
    if name == "ffn":
        return (lambda: keras_attn.PositionwiseFeedForward(F, activation="gelu", name="ffn"),
                [x], lambda layer, a: layer(a))
    if name in ("moe", "moe_uneven"):  # 8 experts split 2 per device; 6 do not divide 4
        experts = 8 if name == "moe" else 6
        return (lambda: keras_attn.MixtureOfExperts(experts, 2, F // 4, name=name),
                [x], lambda layer, a: layer(a))
    if name == "moe_deepseek":  # DeepSeek V3's routing and shared expert: the experts split
        return (lambda: keras_attn.MixtureOfExperts(
            8, 2, F // 4, routing="sigmoid_group_topk", n_group=4, topk_group=2,
            shared_intermediate_dim=F // 4, name=name), [x], lambda layer, a: layer(a))
    if name == "moe_gpt_oss":  # per-expert biases split with their experts; the router's not
        return (lambda: keras_attn.MixtureOfExperts(
            8, 2, F // 4, use_router_bias=True, use_expert_bias=True,
            expert_activation="gpt_oss_swiglu", name=name), [x], lambda layer, a: layer(a))
    if name == "encoder":
        return (lambda: keras_attn.TransformerEncoderLayer(H, intermediate_dim=F, name="enc"),
                [x], lambda layer, a: layer(a))
    return (lambda: keras_attn.TransformerDecoderLayer(H, intermediate_dim=F, name="dec"),
            [x, memory], lambda layer, a, m: layer(a, memory=m))


def _loss_fn(layer, call, cotangent):
    def loss(*args):
        inputs, weights = args[:-len(layer.weights)], args[-len(layer.weights):]
        del weights  # read through the variables (value_and_grad maps them)
        return keras.ops.sum(call(layer, *inputs) * cotangent)

    return loss


@needs_8
# Every layer under both strategies; the mixture of experts under ModelParallel only (its
# data-parallel run is the feed-forward's: no weight of it is laid out differently).
@pytest.mark.parametrize("name, strategy", [
    (name, strategy) for name in ("mha", "mha_gqa_rope", "mha_mqa", "ffn", "encoder",
                                  "decoder")
    for strategy in ("data", "model")] + [("moe", "model"), ("moe_uneven", "model"),
                                          ("moe_deepseek", "model"), ("moe_gpt_oss", "model")])
def test_sharded_layer_matches_single_device(name, strategy):
    make, inputs, call = _case(name)
    keras.utils.set_random_seed(0)
    single = make()
    expected = call(single, *inputs)
    if name == "moe_gpt_oss":  # biases built as zeros: every weight random, far from them
        randomize_weights(single, seed=3, scale=0.35)
        expected = call(single, *inputs)
    cotangent = randn(rng(2), *expected.shape)
    loss_single, grads_single = _device.value_and_grad(
        _loss_fn(single, call, cotangent), [*inputs, *single.weights])

    distribution = _strategy(strategy)
    with distribution.scope():
        layer = make()
        sharded_inputs = [keras.distribution.distribute_tensor(
            a, distribution.get_data_layout(a.shape)) for a in inputs]
        call(layer, *sharded_inputs)  # build
        layer.set_weights(single.get_weights())
        specs = {w.path: _spec(w) for w in layer.weights}
        replicated = name in ("mha_gqa_rope", "mha_mqa", "moe_uneven")
        assert specs == {w.path: _expected_spec(w.path, strategy, replicated)
                         for w in layer.weights}
        assert tuple(sharded_inputs[0].sharding.spec)[0] == "batch"
        actual = call(layer, *sharded_inputs)
        loss, grads = _device.value_and_grad(
            _loss_fn(layer, call, cotangent), [*sharded_inputs, *layer.weights])
    _record(name, strategy, "output", actual, expected)
    # (The scalar loss, a sum of B*T*D products, differs by its float32 rounding: at most
    # the outputs' error, checked above, times sum |cotangent|; a loss near 0 after
    # cancellation, as the DeepSeek mixture's, is off by more than 1e-5 relative.)
    np.testing.assert_allclose(float(loss), float(loss_single), rtol=1e-5,
                               atol=TARGET * float(np.abs(cotangent).sum()))
    for g, g_single in zip(grads, grads_single, strict=True):
        # Random weights of std 0.35 give gradients up to ~100 (the router kernel's): their
        # summation-order error is relative, 1e-5 of the largest (measured 1.1e-7 of it).
        scale = float(np.abs(keras.ops.convert_to_numpy(g_single)).max())
        target = TARGET * max(1.0, scale) if name == "moe_gpt_oss" else TARGET
        _record(name, strategy, "gradient", g, g_single, target)


@needs_8
@pytest.mark.parametrize("via_model", [False, True])
def test_key_value_replicated_when_heads_do_not_divide(via_model):
    """keras-hub #1613: H_kv = 1 or 2 on a model axis of 4 must not crash."""
    mesh = _mesh()
    inputs = keras.Input((T, D))
    h = keras_attn.MultiHeadAttention(H, D // H, num_key_value_heads=2, name="gqa")(inputs)
    h = keras_attn.MultiHeadAttention(1, 6, name="mqa width 6")(h)  # H * d = 6: 6 % 4 != 0
    h = keras_attn.PositionwiseFeedForward(6, name="narrow_ffn")(h)
    outputs = keras.layers.Dense(3, name="custom head")(h)
    model = keras.Model(inputs, outputs)
    if via_model:  # exact paths, decided from the built model
        layout_map = get_layout_map(mesh, model=model)
        assert layout_map["gqa/key_dense/kernel"].axes == (None, None)
        assert layout_map["gqa/query_dense/kernel"].axes == (None, "model")
        assert layout_map["mqa width 6/query_dense/kernel"].axes == (None, None)
    keras.backend.clear_session()
    with keras.distribution.ModelParallel(layout_map=get_layout_map(mesh)).scope():
        inputs = keras.Input((T, D))
        h = keras_attn.MultiHeadAttention(H, D // H, num_key_value_heads=2, name="gqa")(inputs)
        h = keras_attn.MultiHeadAttention(1, 6, name="mqa width 6")(h)
        h = keras_attn.PositionwiseFeedForward(6, name="narrow_ffn")(h)
        sharded = keras.Model(inputs, keras.layers.Dense(3, name="custom head")(h))
        specs = {w.path: _spec(w) for w in sharded.weights}
        out = sharded(np.ones((B, T, D), "float32"))
    assert out.shape == (B, T, 3)
    for weight in ("key_dense", "value_dense"):
        assert specs[f"gqa/{weight}/kernel"] == (None, None)
        assert specs[f"gqa/{weight}/bias"] == (None,)
    assert specs["gqa/query_dense/kernel"] == (None, "model")
    assert specs["gqa/output_dense/kernel"] == ("model", None)
    assert all(spec == (None,) * len(spec) for path, spec in specs.items()
               if not path.startswith("gqa/")), specs


@needs_8
def test_paths_in_subclassed_and_nested_models_with_data_axis():
    class Blocks(keras.Model):
        def __init__(self):
            super().__init__(name="my_model")
            self.stack = [keras_attn.TransformerDecoderLayer(H, intermediate_dim=F)
                          for _ in range(2)]
            self.head = keras.layers.Dense(5, name="logits")

        def call(self, x):
            for block in self.stack:
                x = block(x)
            return self.head(x)

    layout_map = get_layout_map(_mesh(), data_axis="batch")
    with keras.distribution.ModelParallel(layout_map=layout_map).scope():
        model = Blocks()
        model(np.ones((B, T, D), "float32"))
        specs = {w.path: _spec(w) for w in model.weights}
    block = "my_model/transformer_decoder_layer_1"
    assert specs[f"{block}/self_attention/key_dense/kernel"] == ("batch", "model")
    assert specs[f"{block}/feed_forward/output_dense/kernel"] == ("model", "batch")
    assert specs[f"{block}/feed_forward/intermediate_dense/bias"] == ("model",)
    assert specs[f"{block}/self_attention_norm/gamma"] == (None,)
    assert specs["my_model/logits/kernel"] == (None, None)
    assert sum(spec != (None,) * len(spec) for spec in specs.values()) == 2 * (7 + 3)


@needs_8
def test_one_fit_step_under_model_parallel_matches_one_device():
    from keras_attn.demo.data import VOCAB_SIZE, make_split
    from keras_attn.demo.model import build_model

    (sources, decoder_inputs, targets), _ = make_split("reverse", 16, 4, 2, 4, seed=0)
    sources, decoder_inputs, targets = sources[:B], decoder_inputs[:B], targets[:B]

    def train(weights=None):
        keras.utils.set_random_seed(0)
        model = build_model(VOCAB_SIZE, 4, 5, model_dim=D, num_heads=H,
                            intermediate_dim=F, num_layers=1)
        if weights is not None:
            model.set_weights(weights)
        initial = model.get_weights()
        # SGD: the update is lr * gradient, so the weights show the gradients' agreement.
        # (Adam's first step, lr * g / (|g| + eps), turns float32 noise in near-zero
        # gradients into steps of up to lr.)
        model.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss=keras.losses.SparseCategoricalCrossentropy(
                          from_logits=True, ignore_class=0))
        history = model.fit([sources, decoder_inputs], targets, batch_size=B, epochs=1,
                            shuffle=False, verbose=0)
        return initial, history.history["loss"][0], model.get_weights(), model

    initial, loss_single, after_single, _ = train()
    keras.backend.clear_session()  # (outside the scope: it would clear the distribution)
    distribution = _strategy("model")
    with distribution.scope():
        _, loss, after, model = train(weights=initial)
        sharded = [w for w in model.weights if _spec(w) != (None,) * len(w.shape)]
    # Per attention 7 of 8 weights (not the output bias), per FFN 3 of 4 (likewise).
    assert len(sharded) == (7 + 3) + (2 * 7 + 3)  # encoder + decoder
    _record("demo", "model", "fit loss", np.float64(loss), np.float64(loss_single))
    for w, w_single in zip(after, after_single, strict=True):
        _record("demo", "model", "fit weights", w, w_single)


@pytest.mark.skipif(BACKEND == "jax", reason="checks the error on the other backends")
def test_other_backends_get_a_clear_error():
    with pytest.raises(RuntimeError, match="needs the JAX backend"):
        get_layout_map(None)


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@needs_8
def test_two_processes_train_data_parallel_like_one(tmp_path):
    """Two local JAX processes (2 CPU devices each) join through
    `keras.distribution.initialize` and train the demo model data-parallel on
    one global batch; losses and weights match one process training alone."""
    import json
    import os
    import subprocess
    import sys

    from keras_attn.demo.data import VOCAB_SIZE, make_split
    from keras_attn.demo.model import build_model

    steps, batch = 3, 8
    (sources, decoder_inputs, targets), _ = make_split("reverse", batch, 4, 2, 4, seed=0)
    config = {"vocab_size": VOCAB_SIZE, "source_length": 4, "target_length": 5,
              "model_dim": 16, "num_heads": 4, "intermediate_dim": 32, "num_layers": 1}
    keras.utils.set_random_seed(0)
    model = build_model(**config)
    data = tmp_path / "data.npz"
    np.savez(data, sources=sources, decoder_inputs=decoder_inputs, targets=targets,
             steps=steps, config=json.dumps(config),
             **{f"w{i}": w for i, w in enumerate(model.get_weights())})
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(
                      from_logits=True, ignore_class=0))
    expected = model.fit([sources, decoder_inputs], targets, batch_size=batch, epochs=steps,
                         shuffle=False, verbose=0).history["loss"]

    worker = os.path.join(os.path.dirname(__file__), "distribution_worker.py")
    coordinator = f"127.0.0.1:{_free_port()}"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    outs = [tmp_path / f"out{i}.json" for i in range(2)]
    procs = [subprocess.Popen(
        [sys.executable, worker, coordinator, "2", str(i), str(data), str(outs[i])],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(2)]
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=180)[0])
    finally:
        for proc in procs:  # on a timeout or a failure, leave nothing running
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for proc, log in zip(procs, logs, strict=True):
        assert proc.returncode == 0, f"worker failed ({proc.returncode}):\n{log[-3000:]}"
    results = [json.loads(out.read_text()) for out in outs]
    assert [r["devices"] for r in results] == [4, 4]
    assert [r["local_devices"] for r in results] == [2, 2]
    for result in results:
        _record("demo", "2 processes", "fit loss", np.array(result["losses"]),
                np.array(expected))
    trained = np.load(str(outs[0]) + ".npz")
    for i, w in enumerate(model.get_weights()):
        _record("demo", "2 processes", "fit weights", trained[f"arr_{i}"], w)


TINY_DEMO = ["--epochs", "1", "--num-train", "256", "--num-test", "16", "--max-length", "4",
             "--model-dim", "16", "--num-layers", "1", "--batch-size", "32", "--examples", "0"]


@needs_8
def test_demo_trains_under_model_parallel(tmp_path, capsys):
    from keras_attn.cli import main

    assert main(["demo", *TINY_DEMO, "--distribute", "model", "--output", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "distribution: ModelParallel on 8 device(s), mesh {'batch': 2, 'model': 4}" in out
    assert "reloaded model decodes identically: yes" in out


@pytest.mark.skipif(BACKEND == "jax", reason="checks the error on the other backends")
def test_demo_distribute_model_needs_jax(tmp_path, capsys):
    from keras_attn.cli import main

    assert main(["demo", *TINY_DEMO, "--distribute", "model", "--output", str(tmp_path)]) == 2
    assert "--distribute model needs the JAX backend" in capsys.readouterr().err
