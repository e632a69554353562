"""Gemma 4's mixture of experts (issue 34): `MixtureOfExperts`' `router_input_norm` and
`use_per_expert_scale` (transformers' `Gemma4TextRouter`), routed on other tokens than
the experts run on (`router_inputs`), and `ParallelMixtureOfExperts` (the dense MLP and
the experts side by side with their norms, as a block's `feed_forward=` without the
block's own feed-forward norm): both paths against the float64 reference (outputs and
gradients), with routers whose top-k logit margins are asserted far from ties; each
option's ablation; configs (old ones still load) and bad arguments."""

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn import _device
from keras_attn.layers._common import gelu_approximate
from keras_attn.testing import gemma4_moe_reference as reference
from keras_attn.testing.reference import numerical_gradient

from .. import shapes
from ..helpers import assert_close, randn, rng, to_numpy
from . import moe_forms

B, T, D = shapes.B, shapes.T, shapes.D
E, K, F, F_DENSE = 4, 2, 8, 12
EPS = 1e-6
MARGIN = 5e-2
MOE_NAMES = ("router", "router_scale", "per_expert_scale", "gate", "up", "down")
NORMS = ("dense_norm", "post_dense_norm", "experts_norm", "post_experts_norm")


def _problem(seed=43):
    """The residual `x`, another input for the experts, and weights far from identity
    (std 0.35; the scales around 1 but far from it); a router scaled so that the k-th and
    (k+1)-th logits of every token are more than MARGIN apart (asserted, not assumed)."""
    g = rng(seed)
    x, y = randn(g, B, T, D), randn(g, B, T, D)
    shapes_of = {"router": (D, E), "router_scale": (D,), "per_expert_scale": (E,),
                 "gate": (E, D, F), "up": (E, D, F), "down": (E, F, D),
                 "mlp_gate": (D, F_DENSE), "mlp_up": (D, F_DENSE), "mlp_down": (F_DENSE, D),
                 **{name: (D,) for name in NORMS}}
    params = {name: 0.35 * randn(g, *shape) for name, shape in shapes_of.items()}
    for name in ("router_scale", "per_expert_scale", *NORMS):
        params[name] += 1.0
    params["router"] *= 12.0  # the router's input is scaled by D**-0.5
    for k in (1, K):
        assert reference.logit_margin(x, params, k, EPS) > MARGIN
    return x, y, params


def _assign_moe(layer, params):
    for weight, name in ((layer.router_kernel, "router"), (layer.gate_kernel, "gate"),
                         (layer.intermediate_kernel, "up"), (layer.output_kernel, "down")):
        weight.assign(params[name])
    if layer.router_input_norm:
        layer.router_scale.assign(params["router_scale"])
    if layer.use_per_expert_scale:
        layer.per_expert_scale.assign(params["per_expert_scale"])


def _moe(params, **kwargs):
    kwargs = {"num_experts": E, "num_experts_per_tok": K, "intermediate_dim": F,
              "activation": gelu_approximate, "norm_topk_prob": True,
              "router_input_norm": True, "router_norm_epsilon": EPS,
              "use_per_expert_scale": True, **kwargs}
    layer = keras_attn.MixtureOfExperts(**kwargs)
    layer.build((None, None, D))
    _assign_moe(layer, params)
    return layer


def _parallel(params, **kwargs):
    layer = keras_attn.ParallelMixtureOfExperts(
        intermediate_dim=F_DENSE, num_experts=E, num_experts_per_tok=K,
        expert_intermediate_dim=F, epsilon=EPS, **kwargs)
    layer.build((None, None, D))
    _assign_moe(layer.experts, params)
    for dense, name in ((layer.dense.gate_dense, "mlp_gate"),
                        (layer.dense.intermediate_dense, "mlp_up"),
                        (layer.dense.output_dense, "mlp_down")):
        dense.kernel.assign(params[name])
    for name in NORMS:
        getattr(layer, name).scale.assign(params[name])
    return layer


def _moe_reference(x, y, params):
    """The experts run on `y`, routed on `x`."""
    out = reference.mixture_of_experts(y.reshape(-1, D), x.reshape(-1, D), params, K, EPS)
    return out.reshape(x.shape)


@pytest.mark.parametrize("implementation", moe_forms.IMPLEMENTATIONS)
def test_router_options_match_reference(implementation):
    x, y, params = _problem()
    layer = _moe(params, implementation=moe_forms.layer_arg(implementation))
    with keras_attn.observe_paths() as taken, moe_forms.form(implementation):
        out = layer(y, router_inputs=x)
    assert taken == moe_forms.paths(implementation), dict(taken)
    assert_close(out, _moe_reference(x, y, params), what=implementation)


@pytest.mark.parametrize("implementation", moe_forms.IMPLEMENTATIONS)
def test_parallel_feed_forward_matches_reference(implementation):
    x, _, params = _problem()
    layer = _parallel(params, implementation=moe_forms.layer_arg(implementation))
    with keras_attn.observe_paths() as taken, moe_forms.form(implementation):
        out = layer(x)
    assert taken == moe_forms.paths(implementation), dict(taken)
    assert_close(out, reference.feed_forward(x, params, K, EPS), what=implementation)


def test_each_option_moves_the_output_far_past_tolerance():
    """Ablations: the per-expert scale dropped, the router's input norm dropped, the
    router reading the experts' input; in the parallel layer, the router reading the
    normed input and the dense branch dropped: each is far from the reference."""
    x, y, params = _problem()
    expected = _moe_reference(x, y, params)
    scale = np.abs(expected).max()
    moved = {
        "per_expert_scale dropped": _moe(params, use_per_expert_scale=False)(y, router_inputs=x),
        "no router input norm": _moe(params, router_input_norm=False)(y, router_inputs=x),
        "routed on the experts' input": _moe(params)(y),
    }
    for what, out in moved.items():
        error = np.abs(to_numpy(out) - expected).max() / scale
        assert error > 1e-2, (what, error)
    layer = _parallel(params)
    expected = reference.feed_forward(x, params, K, EPS)
    normed = layer.experts_norm(x)
    routed_on_normed = (layer.post_dense_norm(layer.dense(layer.dense_norm(x)))
                        + layer.post_experts_norm(layer.experts(normed, router_inputs=normed)))
    error = np.abs(to_numpy(routed_on_normed) - expected).max() / np.abs(expected).max()
    assert error > 1e-2, ("router on the normed input", error)


@pytest.mark.parametrize("implementation", moe_forms.IMPLEMENTATIONS)
def test_gradients_match_reference(implementation):
    if keras.backend.backend() == "numpy":
        pytest.skip("the NumPy backend cannot differentiate")
    x, y, params = _problem()
    probe = randn(rng(2), B, T, D)
    layer = _moe(params, implementation=moe_forms.layer_arg(implementation))
    weights = [layer.router_kernel, layer.router_scale, layer.per_expert_scale,
               layer.gate_kernel, layer.intermediate_kernel, layer.output_kernel]

    def loss(x, y, *_):
        return keras.ops.sum(layer(y, router_inputs=x) * keras.ops.convert_to_tensor(probe))

    with keras_attn.observe_paths() as taken, moe_forms.form(implementation):
        value, grads = _device.value_and_grad(loss, [x, y, *weights])
    assert all(taken[p] for p in moe_forms.paths(implementation)), dict(taken)
    args = {"x": x.astype(np.float64), "y": y.astype(np.float64),
            **{n: p.astype(np.float64) for n, p in params.items() if n in MOE_NAMES}}

    def f(**a):
        out = _moe_reference(a["x"], a["y"], {n: a[n] for n in MOE_NAMES})
        return float((out * probe).sum())

    assert_close(value, f(**args), what="loss")
    for name, grad in zip(("x", "y", *MOE_NAMES), grads, strict=True):
        def g(v, name=name):
            return f(**dict(args, **{name: v}))
        assert_close(grad, numerical_gradient(g, args[name]), what=f"d/d{name}",
                     quantity="gradient")


def test_parallel_feed_forward_gradient_matches_reference():
    if keras.backend.backend() == "numpy":
        pytest.skip("the NumPy backend cannot differentiate")
    x, _, params = _problem()
    probe = randn(rng(3), B, T, D)
    layer = _parallel(params, implementation="dense")
    weights = [layer.experts.router_scale, layer.dense_norm.scale, layer.experts_norm.scale]

    def loss(x, *_):
        return keras.ops.sum(layer(x) * keras.ops.convert_to_tensor(probe))

    value, grads = _device.value_and_grad(loss, [x, *weights])
    names = ("x", "router_scale", "dense_norm", "experts_norm")
    args = {"x": x.astype(np.float64), **{n: p.astype(np.float64) for n, p in params.items()}}

    def f(**a):
        return float((reference.feed_forward(a["x"], a, K, EPS) * probe).sum())

    assert_close(value, f(**args), what="loss")
    for name, grad in zip(names, grads, strict=True):
        def g(v, name=name):
            return f(**dict(args, **{name: v}))
        assert_close(grad, numerical_gradient(g, args[name]), what=f"d/d{name}",
                     quantity="gradient")


def test_as_a_block_feed_forward_without_the_block_norm():
    """In a pre-norm RMS block with `use_feed_forward_norm=False` the layer reads the
    residual stream: `x + N(ffn(x))` after the attention; configs round-trip."""
    x, _, params = _problem()
    block = keras_attn.TransformerDecoderLayer(
        2, key_dim=4, normalize_first=True, normalization="rms", use_bias=False,
        use_post_ffw_norm=True, use_feed_forward_norm=False, layer_norm_epsilon=EPS,
        feed_forward=_parallel(params))
    block.build((None, None, D))
    assert block.feed_forward_norm is None
    attention_zero = [w for w in block.self_attention.weights if w.name == "kernel"][-1]
    attention_zero.assign(np.zeros(tuple(attention_zero.shape), "float32"))  # attn(x) = 0
    expected = x + reference.rms_norm(reference.feed_forward(x, params, K, EPS), None, EPS)
    assert_close(block(x), expected, what="block")
    config = block.get_config()
    assert config["use_feed_forward_norm"] is False
    again = keras_attn.TransformerDecoderLayer.from_config(config)
    again.build((None, None, D))
    again.set_weights(block.get_weights())
    np.testing.assert_allclose(to_numpy(again(x)), to_numpy(block(x)), rtol=1e-6, atol=1e-6)
    assert "use_feed_forward_norm" not in keras_attn.TransformerDecoderLayer(
        2, key_dim=4, intermediate_dim=8).get_config()


def test_configs_round_trip_and_old_configs_load():
    x, _, params = _problem()
    layer = _parallel(params, implementation="sparse")
    config = layer.get_config()
    again = keras_attn.ParallelMixtureOfExperts.from_config(config)
    assert again.get_config() == config
    again.build((None, None, D))
    again.set_weights(layer.get_weights())
    np.testing.assert_array_equal(to_numpy(again(x)), to_numpy(layer(x)))
    moe = layer.experts.get_config()
    assert (moe["router_input_norm"], moe["use_per_expert_scale"]) == (True, True)
    old = {k: v for k, v in moe.items() if k not in (
        "router_input_norm", "router_norm_epsilon", "use_per_expert_scale")}
    plain = keras_attn.MixtureOfExperts.from_config(old)
    assert (plain.router_input_norm, plain.use_per_expert_scale) == (False, False)
    plain.build((None, None, D))
    assert len(plain.weights) == 4
    assert "router_input_norm" not in plain.get_config()


@pytest.mark.parametrize("kwargs, match", [
    (dict(router_input_norm=1), r"Received: router_input_norm=1"),
    (dict(use_per_expert_scale="yes"), r"Received: use_per_expert_scale='yes'"),
    (dict(router_norm_epsilon=0.0), r"Received: router_norm_epsilon=0.0"),
])
def test_bad_arguments_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        keras_attn.MixtureOfExperts(num_experts=E, num_experts_per_tok=K,
                                    intermediate_dim=F, **kwargs)


@pytest.mark.parametrize("kwargs, match", [
    (dict(expert_intermediate_dim=0), r"Received: expert_intermediate_dim=0"),
    (dict(num_experts_per_tok=5), r"Received: num_experts_per_tok=5"),
    (dict(epsilon=-1.0), r"Received: epsilon=-1.0"),
])
def test_parallel_bad_arguments_are_refused_by_name(kwargs, match):
    kwargs = dict(dict(intermediate_dim=F_DENSE, num_experts=E, num_experts_per_tok=K,
                       expert_intermediate_dim=F), **kwargs)
    with pytest.raises(ValueError, match=match):
        keras_attn.ParallelMixtureOfExperts(**kwargs)


def test_block_refuses_a_post_norm_block_without_its_feed_forward_norm():
    with pytest.raises(ValueError, match=r"Received: use_feed_forward_norm=False"):
        keras_attn.TransformerDecoderLayer(2, key_dim=4, intermediate_dim=8,
                                           use_feed_forward_norm=False)


def test_transformers_gemma4_router_and_experts():
    """transformers' `Gemma4TextRouter` on `x` and `Gemma4TextExperts` on `y`, with the
    same random weights: the routed output within 1e-5 of its scale on both paths."""
    torch = pytest.importorskip("torch")
    from transformers import Gemma4TextConfig
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextExperts, Gemma4TextRouter

    x, y, params = _problem()
    config = Gemma4TextConfig(hidden_size=D, num_experts=E, top_k_experts=K,
                              moe_intermediate_size=F, rms_norm_eps=EPS,
                              enable_moe_block=True, hidden_activation="gelu_pytorch_tanh")
    router, experts = Gemma4TextRouter(config).eval(), Gemma4TextExperts(config).eval()
    gate_up = np.concatenate([params["gate"], params["up"]], axis=-1).transpose(0, 2, 1)
    with torch.no_grad():
        for target, value in ((router.proj.weight, params["router"].T),
                              (router.scale, params["router_scale"]),
                              (router.per_expert_scale, params["per_expert_scale"]),
                              (experts.gate_up_proj, gate_up),
                              (experts.down_proj, params["down"].transpose(0, 2, 1))):
            target.copy_(torch.tensor(np.ascontiguousarray(value)))
        _, weights, index = router(torch.tensor(x.reshape(-1, D)))
        expected = experts(torch.tensor(y.reshape(-1, D)), index, weights).numpy()
    expected = expected.astype(np.float64).reshape(x.shape)
    scale = np.abs(expected).max()
    for implementation in ("dense", "sparse"):
        out = to_numpy(_moe(params, implementation=implementation)(y, router_inputs=x))
        assert np.abs(out - expected).max() <= 1e-5 * scale, implementation
    dropped = to_numpy(_moe(params, use_per_expert_scale=False)(y, router_inputs=x))
    assert np.abs(dropped - expected).max() > 1e-2 * scale
