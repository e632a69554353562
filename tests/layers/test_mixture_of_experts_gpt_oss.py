"""`MixtureOfExperts` as gpt-oss's (issue 34): `routing="topk_softmax"`, the router's and
the experts' biases, `expert_activation="gpt_oss_swiglu"`; both paths against the float64
reference (outputs and gradients), with routers whose top-k logit margins are asserted
far from ties and a clamp that is asserted to bite; transformers' `GptOssMLP` with the
same random weights (torch); configs (old ones still load) and bad arguments."""

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn import _device
from keras_attn.testing import gpt_oss_moe_reference as reference
from keras_attn.testing.reference import numerical_gradient

from .. import shapes
from ..helpers import assert_close, randn, rng, to_numpy
from . import moe_forms

B, T, D = shapes.B, shapes.T, shapes.D
E, K, F = 4, 2, 8
ALPHA, LIMIT = 1.702, 1.0  # a limit the std-0.35 projections cross (asserted below)
MARGIN = 5e-2
NAMES = ("router", "router_bias", "gate", "up", "gate_bias", "up_bias", "down", "down_bias")
OPTIONS = dict(routing="topk_softmax", use_router_bias=True, use_expert_bias=True,
               expert_activation="gpt_oss_swiglu", swiglu_alpha=ALPHA, swiglu_limit=LIMIT)


def _problem(seed=41):
    """Inputs and weights far from identity (std 0.35, biases too); a router scaled so
    the k-th and (k+1)-th logits of every token are more than MARGIN apart, and a clamp
    that some gate and up values cross (both asserted, not assumed)."""
    g = rng(seed)
    x = randn(g, B, T, D)
    shapes_of = {"router": (D, E), "router_bias": (E,), "gate": (E, D, F), "up": (E, D, F),
                 "gate_bias": (E, F), "up_bias": (E, F), "down": (E, F, D),
                 "down_bias": (E, D)}
    params = {name: 0.35 * randn(g, *shapes_of[name]) for name in NAMES}
    params["router"] *= 3.0
    for k in (1, K):
        assert reference.logit_margin(x, params["router"], params["router_bias"], k) > MARGIN
    gate_clamped, up_clamped = reference.clamped_fraction(x, params, LIMIT)
    assert gate_clamped > 0.05 and up_clamped > 0.05, (gate_clamped, up_clamped)
    return x, params


def _layer(params, **kwargs):
    kwargs = {"num_experts": E, "num_experts_per_tok": K, "intermediate_dim": F,
              **OPTIONS, **kwargs}
    layer = keras_attn.MixtureOfExperts(**kwargs)
    layer.build((None, None, D))
    for weight, name in ((layer.router_kernel, "router"), (layer.gate_kernel, "gate"),
                         (layer.intermediate_kernel, "up"), (layer.output_kernel, "down")):
        weight.assign(params[name])
    if layer.use_router_bias:
        layer.router_bias.assign(params["router_bias"])
    if layer.use_expert_bias:
        layer.gate_bias.assign(params["gate_bias"])
        layer.intermediate_bias.assign(params["up_bias"])
        layer.output_bias.assign(params["down_bias"])
    return layer


@pytest.mark.parametrize("implementation", moe_forms.IMPLEMENTATIONS)
def test_each_path_matches_reference(implementation):
    x, params = _problem()
    expected = reference.mixture_of_experts(x, params, K, ALPHA, LIMIT)
    layer = _layer(params, implementation=moe_forms.layer_arg(implementation))
    with keras_attn.observe_paths() as taken, moe_forms.form(implementation):
        out = layer(x)
    assert taken == moe_forms.paths(implementation), dict(taken)
    assert_close(out, expected, what=implementation)


def test_each_option_moves_the_output_far_past_tolerance():
    """Ablations: softmax over all E (then top-k, not renormalised), the clamp removed,
    alpha 1, the biases dropped: each is far from the reference (the tests can fail)."""
    x, params = _problem()
    expected = reference.mixture_of_experts(x, params, K, ALPHA, LIMIT)
    scale = np.abs(expected).max()
    zero_bias = {n: (np.zeros_like(v) if n.endswith("bias") else v) for n, v in params.items()}
    ablations = {
        "softmax over all experts": _layer(params, routing="softmax_topk"),
        "no clamp": _layer(params, swiglu_limit=1e9),
        "alpha 1": _layer(params, swiglu_alpha=1.0),
        "no biases": _layer(zero_bias),
    }
    for what, layer in ablations.items():
        for implementation in ("dense", "sparse"):
            layer.implementation = implementation
            moved = np.abs(to_numpy(layer(x)) - expected).max() / scale
            assert moved > 1e-2, (what, implementation, moved)


def test_topk_softmax_equals_renormalised_softmax_topk_weights():
    """gpt-oss's weights are Mixtral's renormalised ones: the routes agree."""
    x, params = _problem()
    tokens = keras.ops.reshape(x, (-1, D))
    ours = _layer(params).route(tokens)
    mixtral = _layer(params, routing="softmax_topk", norm_topk_prob=True).route(tokens)
    for a, b in zip(ours, mixtral, strict=True):
        np.testing.assert_allclose(to_numpy(a), to_numpy(b), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("implementation", moe_forms.IMPLEMENTATIONS)
def test_gradients_match_reference(implementation):
    if keras.backend.backend() == "numpy":
        pytest.skip("the NumPy backend cannot differentiate")
    x, params = _problem()
    probe = randn(rng(2), B, T, D)
    layer = _layer(params, implementation=moe_forms.layer_arg(implementation))
    weights = [layer.router_kernel, layer.router_bias, layer.gate_kernel,
               layer.intermediate_kernel, layer.gate_bias, layer.intermediate_bias,
               layer.output_kernel, layer.output_bias]

    def loss(x, *_):
        return keras.ops.sum(layer(x) * keras.ops.convert_to_tensor(probe))

    with keras_attn.observe_paths() as taken, moe_forms.form(implementation):
        value, grads = _device.value_and_grad(loss, [x, *weights])
    assert all(taken[p] for p in moe_forms.paths(implementation)), dict(taken)
    args = {"x": x.astype(np.float64), **{n: p.astype(np.float64) for n, p in params.items()}}

    def f(**a):
        out = reference.mixture_of_experts(a["x"], {n: a[n] for n in NAMES}, K, ALPHA, LIMIT)
        return float((out * probe).sum())

    assert_close(value, f(**args), what="loss")
    for name, grad in zip(("x", *NAMES), grads, strict=True):
        def g(v, name=name):
            return f(**dict(args, **{name: v}))
        assert_close(grad, numerical_gradient(g, args[name]), what=f"d/d{name}",
                     quantity="gradient")


def test_transformers_gpt_oss_mlp():
    torch = pytest.importorskip("torch")
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

    x, params = _problem()
    config = GptOssConfig(hidden_size=D, intermediate_size=F, num_local_experts=E,
                          num_experts_per_tok=K, swiglu_alpha=ALPHA, swiglu_limit=LIMIT)
    block = GptOssMLP(config).eval()
    gate_up = np.empty((E, D, 2 * F), np.float32)  # gate the even columns, up the odd
    gate_up[..., ::2], gate_up[..., 1::2] = params["gate"], params["up"]
    gate_up_bias = np.empty((E, 2 * F), np.float32)
    gate_up_bias[..., ::2], gate_up_bias[..., 1::2] = params["gate_bias"], params["up_bias"]
    with torch.no_grad():
        for target, value in ((block.router.weight, params["router"].T),
                              (block.router.bias, params["router_bias"]),
                              (block.experts.gate_up_proj, gate_up),
                              (block.experts.gate_up_proj_bias, gate_up_bias),
                              (block.experts.down_proj, params["down"]),
                              (block.experts.down_proj_bias, params["down_bias"])):
            target.copy_(torch.tensor(np.ascontiguousarray(value)))
        expected = block(torch.tensor(x))[0].numpy().astype(np.float64)
    scale = np.abs(expected).max()
    for implementation in ("dense", "sparse"):
        out = to_numpy(_layer(params, implementation=implementation)(x))
        assert np.abs(out - expected).max() <= 1e-5 * scale, implementation
    # Ablations against transformers: softmax over all experts, the clamp removed.
    for kwargs in (dict(routing="softmax_topk"), dict(swiglu_limit=1e9)):
        assert np.abs(to_numpy(_layer(params, **kwargs)(x)) - expected).max() > 1e-2 * scale


def test_config_round_trip_and_old_configs_load():
    x, params = _problem()
    layer = _layer(params, implementation="sparse")
    config = layer.get_config()
    again = keras_attn.MixtureOfExperts.from_config(config)
    assert again.get_config() == config
    again.build((None, None, D))
    again.set_weights(layer.get_weights())
    np.testing.assert_array_equal(to_numpy(again(x)), to_numpy(layer(x)))
    assert [w.name for w in layer.weights] == [
        "router_kernel", "gate_kernel", "intermediate_kernel", "output_kernel",
        "router_bias", "gate_bias", "intermediate_bias", "output_bias"]
    # A config saved before these options (none of their keys): today's defaults.
    old = {k: v for k, v in config.items() if k not in (
        "use_router_bias", "use_expert_bias", "expert_activation", "swiglu_alpha",
        "swiglu_limit")}
    old.update(routing="softmax_topk")
    plain = keras_attn.MixtureOfExperts.from_config(old)
    assert (plain.use_router_bias, plain.use_expert_bias, plain.expert_activation) == (
        False, False, "gated")
    plain.build((None, None, D))
    assert len(plain.weights) == 4


@pytest.mark.parametrize("kwargs, match", [
    (dict(expert_activation="swiglu"), r"Received: expert_activation='swiglu'"),
    (dict(swiglu_alpha=0.0), r"Received: swiglu_alpha=0.0"),
    (dict(swiglu_limit=-1.0), r"Received: swiglu_limit=-1.0"),
    (dict(use_router_bias=1), r"Received: use_router_bias=1"),
    (dict(use_expert_bias="yes"), r"Received: use_expert_bias='yes'"),
])
def test_bad_arguments_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        keras_attn.MixtureOfExperts(num_experts=E, num_experts_per_tok=K,
                                    intermediate_dim=F, **kwargs)
