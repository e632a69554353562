"""`MixtureOfExperts` against the float64 reference (both paths, forward and gradients), against
transformers' Mixtral and Qwen3-MoE blocks, its load-balancing loss, and its contract.

Routers are scaled so that every token's k-th and (k+1)-th router logits are far apart
(the margin is asserted), so that no rounding can flip a token's experts.
"""

import os

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn import _device, observe_paths
from keras_attn.layers.mixture_of_experts import MixtureOfExperts
from keras_attn.testing import moe_reference
from keras_attn.testing.reference import numerical_gradient

from ..helpers import assert_close, to_numpy
from ..shapes import B, D, T

E, K, F = 4, 2, 6
MIN_MARGIN = 0.05


def _inputs(seed=0, b=B, t=T):
    return np.random.default_rng(seed).standard_normal((b, t, D)).astype("float32")


def _weights(layer):
    return {"router": to_numpy(layer.router.kernel), "gate": to_numpy(layer.gate_kernel),
            "up": to_numpy(layer.intermediate_kernel), "down": to_numpy(layer.output_kernel)}


def _layer(seed=1, **kwargs):
    """A built layer with weights far from identity: std 0.35 experts, a std 1.5 router."""
    kwargs = {"num_experts": E, "num_experts_per_tok": K, "intermediate_dim": F, **kwargs}
    layer = MixtureOfExperts(**kwargs)
    layer.build((None, None, D))
    g = np.random.default_rng(seed)
    layer.router.kernel.assign(g.normal(0.0, 1.5, (D, kwargs["num_experts"])))
    for weight in (layer.gate_kernel, layer.intermediate_kernel, layer.output_kernel):
        weight.assign(g.normal(0.0, 0.35, tuple(weight.shape)))
    return layer


def _margin(logits, k):
    """The smallest gap between a token's k-th and (k+1)-th router logit (the order of the
    probabilities; float32 rounds a logit by about 1e-6)."""
    ordered = np.sort(logits, -1)[:, ::-1]
    return float((ordered[:, k - 1] - ordered[:, k]).min())


@pytest.mark.parametrize("implementation, b, t, path", [
    ("dense", B, T, "moe_dense"), ("sparse", B, T, "moe_sparse"),
    ("auto", B, T, "moe_dense"),  # N k = 20 >= E: dense reads fewer weights
    ("auto", 1, 1, "moe_sparse"),  # one token decoding: its 2 experts only
])
@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_matches_the_float64_reference(implementation, b, t, path, norm_topk_prob):
    layer = _layer(implementation=implementation, norm_topk_prob=norm_topk_prob)
    x = _inputs(2, b, t)
    with observe_paths() as taken:
        y = to_numpy(layer(x))
    assert taken == {path: 1}
    expected, logits = moe_reference.mixture_of_experts(x, _weights(layer), K, norm_topk_prob)
    assert _margin(logits, K) > MIN_MARGIN
    assert_close(y, expected, what=f"{implementation} output")
    if b * t == 1:
        return  # one token: its top-2 weights sum to 0.993, so the ablations are below
    # The ablations: the other normalisation, and top-1, are far off.
    other, _ = moe_reference.mixture_of_experts(x, _weights(layer), K, not norm_topk_prob)
    top1, _ = moe_reference.mixture_of_experts(x, _weights(layer), 1, norm_topk_prob)
    for wrong in (other, top1):
        assert np.abs(wrong - expected).max() > 0.05 * np.abs(expected).max()


@pytest.mark.skipif(keras.backend.backend() == "numpy", reason="the numpy backend has no gradients")
@pytest.mark.parametrize("implementation", ["dense", "sparse"])
def test_gradients_match_the_float64_reference(implementation):
    layer = _layer(seed=3, implementation=implementation)
    x = _inputs(4, 1, 3)
    probe = np.random.default_rng(5).standard_normal(x.shape)
    variables = [layer.router.kernel, layer.gate_kernel, layer.intermediate_kernel,
                 layer.output_kernel]

    def loss(inputs, *_):
        return keras.ops.sum(layer(inputs) * keras.ops.convert_to_tensor(probe, "float32"))

    _, grads = _device.value_and_grad(loss, [x] + variables)
    names = ("x", "router", "gate", "up", "down")
    arrays = {"x": x.astype(np.float64), **_weights(layer)}
    assert _margin(moe_reference.mixture_of_experts(x, _weights(layer), K)[1], K) > MIN_MARGIN
    for name, grad in zip(names, grads):
        def f(value, name=name):
            given = {**arrays, name: value}
            y, _ = moe_reference.mixture_of_experts(
                given["x"], {n: given[n] for n in names[1:]}, K)
            return float((y * probe).sum())
        assert_close(grad, numerical_gradient(f, arrays[name]), what=f"{name} gradient",
                     quantity="gradient")


def test_the_load_balancing_loss_is_the_reference_and_added_in_training_only():
    layer = _layer(router_aux_loss_coef=0.02)
    x = _inputs(6)
    _, _, logits = layer.route(keras.ops.reshape(x, (-1, D)))
    expected = moe_reference.load_balancing_loss(to_numpy(logits), K)
    assert abs(float(to_numpy(layer.load_balancing_loss(logits))) - expected) < 1e-6
    layer(x)
    assert not layer.losses
    layer(x, training=True)
    (added,) = layer.losses
    assert abs(float(to_numpy(added)) - 0.02 * expected) < 1e-7
    # Perfectly balanced routing has the minimum loss, k (here: far from this router's).
    assert expected > K + 0.1


def test_a_block_takes_it_as_its_feed_forward():
    block = keras_attn.TransformerDecoderLayer(
        2, feed_forward=_layer(), normalize_first=True, normalization="rms")
    x = _inputs(7)
    y = to_numpy(block(x, use_causal_mask=True))
    h = x + to_numpy(block.self_attention(block.self_attention_norm(x), use_causal_mask=True))
    expected = h + to_numpy(block.feed_forward(block.feed_forward_norm(h)))
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
    assert isinstance(block.feed_forward, MixtureOfExperts)


def test_config_and_keras_file_round_trip(tmp_path):
    layer = _layer(norm_topk_prob=False, router_aux_loss_coef=0.01, implementation="sparse")
    x = _inputs(8)
    again = MixtureOfExperts.from_config(layer.get_config())
    assert again.get_config() == layer.get_config()
    model = keras.Sequential([keras.Input((None, D)), layer])
    path = os.path.join(tmp_path, "moe.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(to_numpy(loaded(x)), to_numpy(model(x)))
    assert [w.path for w in loaded.layers[0].weights] == [w.path for w in layer.weights]


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_experts=0), r"Received: num_experts=0"),
    (dict(num_experts_per_tok=5), r"Received: num_experts_per_tok=5, num_experts=4"),
    (dict(routing="sigmoid"), r"Received: routing='sigmoid'"),
    (dict(norm_topk_prob=1), r"Received: norm_topk_prob=1"),
    (dict(router_aux_loss_coef=-1.0), r"Received: router_aux_loss_coef=-1.0"),
    (dict(implementation="grouped"), r"Received: implementation='grouped'"),
])
def test_bad_arguments_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MixtureOfExperts(**{"num_experts": E, "num_experts_per_tok": K, "intermediate_dim": F,
                            **kwargs})


def test_a_wrong_rank_is_refused():
    with pytest.raises(ValueError, match=r"inputs"):
        _layer()(np.zeros((2, D), "float32"))


def _hf_block(family, norm_topk_prob=True):
    """transformers' Mixtral / Qwen3-MoE sparse block with random weights (experts std 0.35,
    router std 1.5), and the `MixtureOfExperts` holding the same weights."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    if family == "mixtral":
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock as Block
        config = transformers.MixtralConfig(hidden_size=D, intermediate_size=F,
                                            num_local_experts=E, num_experts_per_tok=K)
    else:
        from transformers.models.qwen3_moe.modeling_qwen3_moe import (
            Qwen3MoeSparseMoeBlock as Block,
        )
        config = transformers.Qwen3MoeConfig(hidden_size=D, moe_intermediate_size=F,
                                             num_experts=E, num_experts_per_tok=K,
                                             norm_topk_prob=norm_topk_prob)
    torch.manual_seed(0)
    block = Block(config).eval()
    with torch.no_grad():
        block.gate.weight.normal_(0.0, 1.5)
        block.experts.gate_up_proj.normal_(0.0, 0.35)
        block.experts.down_proj.normal_(0.0, 0.35)
    layer = MixtureOfExperts(E, K, F, norm_topk_prob=norm_topk_prob)
    layer.build((None, None, D))
    gate_up = block.experts.gate_up_proj.detach().numpy()  # (E, 2F, D): gate rows, then up
    layer.router.kernel.assign(block.gate.weight.detach().numpy().T)
    layer.gate_kernel.assign(gate_up[:, :F].transpose(0, 2, 1))
    layer.intermediate_kernel.assign(gate_up[:, F:].transpose(0, 2, 1))
    layer.output_kernel.assign(block.experts.down_proj.detach().numpy().transpose(0, 2, 1))
    return torch, block, layer


@pytest.mark.parametrize("family, norm_topk_prob", [
    ("mixtral", True), ("qwen3_moe", True), ("qwen3_moe", False)])
@pytest.mark.parametrize("implementation", ["dense", "sparse"])
def test_matches_transformers_sparse_moe_blocks(family, norm_topk_prob, implementation):
    if keras.backend.backend() != "torch":
        pytest.skip("compared with transformers in the torch environment")
    torch, block, layer = _hf_block(family, norm_topk_prob)
    layer.implementation = implementation
    x = _inputs(19)  # a seed whose smallest top-2 logit margin is 0.63
    with torch.no_grad():
        expected = block(torch.from_numpy(x)).numpy()
        logits = torch.from_numpy(x).reshape(-1, D) @ block.gate.weight.T
    assert _margin(logits.numpy(), K) > MIN_MARGIN
    error = np.abs(to_numpy(layer(x)) - expected).max() / np.abs(expected).max()
    assert error < 1e-5, error
    # The ablations: the other normalisation and top-1 are far off.
    for changes in (dict(norm_topk_prob=not norm_topk_prob), dict(num_experts_per_tok=1)):
        wrong = MixtureOfExperts.from_config({**layer.get_config(), **changes})
        wrong.build((None, None, D))
        wrong.set_weights(layer.get_weights())
        assert np.abs(to_numpy(wrong(x)) - expected).max() > 1e-2 * np.abs(expected).max()


def test_the_load_balancing_loss_is_transformers():
    if keras.backend.backend() != "torch":
        pytest.skip("compared with transformers in the torch environment")
    torch, block, layer = _hf_block("mixtral")
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    x = _inputs(19)
    logits = torch.from_numpy(x).reshape(-1, D) @ block.gate.weight.T.detach()
    expected = float(load_balancing_loss_func((logits,), E, K))
    _, _, ours = layer.route(keras.ops.reshape(x, (-1, D)))
    assert abs(float(to_numpy(layer.load_balancing_loss(ours))) - expected) < 1e-5
