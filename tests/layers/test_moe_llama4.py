"""Llama 4's routing, `MixtureOfExperts(routing="llama4_sigmoid_topk")`: the sigmoid of the
top-k logits scales each chosen expert's INPUT (transformers' `Llama4Router`,
`Llama4TextMoe`), with the plain shared expert; both paths against the float64 reference
(outputs and gradients) with router margins asserted far from ties, against transformers'
`Llama4TextMoe` with the same random weights, and the ablation (the score on the output,
as the other rules do) far past the tolerance."""

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn import _device
from keras_attn.testing import moe_reference
from keras_attn.testing.reference import numerical_gradient

from .. import shapes
from ..helpers import assert_close, randn, rng, to_numpy
from . import moe_forms

B, T, D = shapes.B, shapes.T, shapes.D
E, F = 8, 8  # the shared expert is F wide too (Llama 4's intermediate_size for both)
MARGIN = 1e-2


def _problem(seed=34):
    """Inputs and weights far from identity (std 0.35), a router scaled by 3, where every
    token's k-th and (k+1)-th router probabilities are more than MARGIN apart (asserted)."""
    g = rng(seed)
    x = randn(g, B, T, D)
    params = {"router": 3.0 * 0.35 * randn(g, D, E),
              "gate": 0.35 * randn(g, E, D, F), "up": 0.35 * randn(g, E, D, F),
              "down": 0.35 * randn(g, E, F, D), "shared_gate": 0.35 * randn(g, D, F),
              "shared_up": 0.35 * randn(g, D, F), "shared_down": 0.35 * randn(g, F, D)}
    for k in (1, 2):
        assert moe_reference.top_k_margin(x, params["router"], k) > MARGIN
    return x, params


def _layer(params, k=1, **kwargs):
    layer = keras_attn.MixtureOfExperts(
        num_experts=E, num_experts_per_tok=k, intermediate_dim=F,
        routing="llama4_sigmoid_topk",
        shared_intermediate_dim=F if "shared_gate" in params else None, **kwargs)
    layer.build((None, None, D))
    for name, weight in (("router", layer.router_kernel), ("gate", layer.gate_kernel),
                         ("up", layer.intermediate_kernel), ("down", layer.output_kernel)):
        weight.assign(params[name])
    if "shared_gate" in params:
        layer.shared_gate_kernel.assign(params["shared_gate"])
        layer.shared_intermediate_kernel.assign(params["shared_up"])
        layer.shared_output_kernel.assign(params["shared_down"])
    return layer


@pytest.mark.parametrize("implementation", moe_forms.IMPLEMENTATIONS)
@pytest.mark.parametrize("k", [1, 2])
def test_matches_the_reference(implementation, k):
    x, params = _problem()
    expected = moe_reference.mixture_of_experts(x, params, k, False, grouping="llama4")
    # The ablation: the sigmoid score on the expert's output instead of its input.
    on_output = moe_reference.mixture_of_experts(x, params, k, False, grouping="llama4",
                                                 scale_output=True)
    assert np.abs(expected - on_output).max() > 0.05
    layer = _layer(params, k, implementation=moe_forms.layer_arg(implementation))
    with keras_attn.observe_paths() as taken, moe_forms.form(implementation):
        out = layer(x)
    assert taken == moe_forms.paths(implementation), dict(taken)
    assert_close(out, expected, what=implementation)


@pytest.mark.parametrize("implementation", moe_forms.IMPLEMENTATIONS)
def test_gradients_match_reference(implementation):
    if keras.backend.backend() == "numpy":
        pytest.skip("the NumPy backend cannot differentiate")
    x, params = _problem(13)
    probe = randn(rng(2), B, T, D)
    layer = _layer(params, 1, implementation=moe_forms.layer_arg(implementation))
    names = ["router", "gate", "up", "down", "shared_gate", "shared_up", "shared_down"]
    weights = [layer.router_kernel, layer.gate_kernel, layer.intermediate_kernel,
               layer.output_kernel, layer.shared_gate_kernel, layer.shared_intermediate_kernel,
               layer.shared_output_kernel]
    assert {id(w) for w in layer.trainable_weights} == {id(w) for w in weights}

    def loss(x, *_):
        return keras.ops.sum(layer(x) * keras.ops.convert_to_tensor(probe))

    with keras_attn.observe_paths() as taken, moe_forms.form(implementation):
        value, grads = _device.value_and_grad(loss, [x, *weights])
    assert all(taken[p] for p in moe_forms.paths(implementation)), dict(taken)
    args = {"x": x.astype(np.float64), **{n: p.astype(np.float64) for n, p in params.items()}}

    def f(**a):
        out = moe_reference.mixture_of_experts(a["x"], {n: a[n] for n in names}, 1, False,
                                               grouping="llama4")
        return float((out * probe).sum())

    assert_close(value, f(**args), what="loss")
    for name, grad in zip(["x", *names], grads, strict=True):
        def g(v, name=name):
            return f(**dict(args, **{name: v}))
        assert_close(grad, numerical_gradient(g, args[name]), what=f"d/d{name}",
                     quantity="gradient")


def test_transformers_llama4_text_moe():
    """transformers' block: experts `gate_up_proj` `(E, D, 2F)` (gate columns first),
    `down_proj` `(E, F, D)`, `router` `(E, D)`, `shared_expert` a plain SwiGLU MLP."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import Llama4TextConfig
    from transformers.models.llama4.modeling_llama4 import Llama4TextMoe

    x, params = _problem(4)
    config = Llama4TextConfig(hidden_size=D, intermediate_size=F, num_local_experts=E,
                              num_experts_per_tok=1, hidden_act="silu")
    block = Llama4TextMoe(config)
    with torch.no_grad():
        block.router.weight.copy_(torch.tensor(params["router"].T))
        gate_up = np.concatenate([params["gate"], params["up"]], axis=-1)  # (E, D, 2F)
        block.experts.gate_up_proj.copy_(torch.tensor(gate_up))
        block.experts.down_proj.copy_(torch.tensor(params["down"]))
        block.shared_expert.gate_proj.weight.copy_(torch.tensor(params["shared_gate"].T))
        block.shared_expert.up_proj.weight.copy_(torch.tensor(params["shared_up"].T))
        block.shared_expert.down_proj.weight.copy_(torch.tensor(params["shared_down"].T))
        expected = block.eval()(torch.tensor(x).reshape(-1, D))[0].numpy().reshape(x.shape)
    scale = np.abs(expected).max()
    for implementation in ("dense", "sparse"):
        out = to_numpy(_layer(params, 1, implementation=implementation)(x))
        assert np.abs(out - expected).max() <= 1e-5 * scale, implementation
    on_output = moe_reference.mixture_of_experts(x, params, 1, False, grouping="llama4",
                                                 scale_output=True)
    assert np.abs(on_output - expected).max() > 1e-2 * scale


def test_config_round_trip_and_bad_arguments():
    _, params = _problem()
    layer = _layer(params, 1)
    config = layer.get_config()
    assert config["routing"] == "llama4_sigmoid_topk"
    assert keras_attn.MixtureOfExperts.from_config(config).get_config() == config
    with pytest.raises(ValueError, match=r"Received: norm_topk_prob=True"):
        keras_attn.MixtureOfExperts(num_experts=E, num_experts_per_tok=1, intermediate_dim=F,
                                    routing="llama4_sigmoid_topk", norm_topk_prob=True)
    with pytest.raises(ValueError, match=r"Received: n_group=2"):
        keras_attn.MixtureOfExperts(num_experts=E, num_experts_per_tok=1, intermediate_dim=F,
                                    routing="llama4_sigmoid_topk", n_group=2)
