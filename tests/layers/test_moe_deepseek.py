"""`MixtureOfExperts`' shared expert (plain: DeepSeek V3; sigmoid-gated: Qwen3-Next) and
DeepSeek V3's "sigmoid_group_topk" routing: both paths against the float64 reference
(outputs and gradients), with routers whose group and expert margins are asserted far from
ties; transformers' `DeepseekV3MoE` and `Qwen3NextSparseMoeBlock` with the same random
weights; configs (old ones load), a compiled call, and bad arguments."""

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
# F = 6: rows of 24 bytes, which the grouped matmul of PyTorch declines (the blocks run).
E, K, F, S = 8, 2, 6, 10
N_GROUP, TOPK_GROUP, SCALING = 4, 2, 2.5
MARGIN = 2e-2


def _problem(seed=34, gated=False):
    """Inputs and weights far from identity (std 0.35), a router scaled by 2 and a
    correction bias of std 0.35, where (seeds 34, 13, 5) every token's `topk_group`-th and
    next group scores, and its k-th and (k+1)-th biased expert scores inside the kept
    groups, are more than MARGIN apart: asserted, not assumed."""
    g = rng(seed)
    x = randn(g, B, T, D)
    params = {"router": 2.0 * 0.35 * randn(g, D, E),
              "gate": 0.35 * randn(g, E, D, F), "up": 0.35 * randn(g, E, D, F),
              "down": 0.35 * randn(g, E, F, D), "shared_gate": 0.35 * randn(g, D, S),
              "shared_up": 0.35 * randn(g, D, S), "shared_down": 0.35 * randn(g, S, D)}
    gate = 0.35 * randn(g, D, 1)
    if gated:
        params["shared_expert_gate"] = gate
    bias = 0.35 * randn(g, E)
    margins = moe_reference.group_route_margins(x, params["router"], K, bias, N_GROUP,
                                                TOPK_GROUP)
    assert min(margins) > MARGIN, margins
    return x, params, bias


def _grouping(bias):
    return {"bias": bias, "n_group": N_GROUP, "topk_group": TOPK_GROUP, "scaling": SCALING}


def _layer(params, bias=None, **kwargs):
    grouped = bias is not None
    kwargs = {"num_experts": E, "num_experts_per_tok": K, "intermediate_dim": F,
              "shared_intermediate_dim": S if "shared_gate" in params else None,
              "shared_expert_gate": "shared_expert_gate" in params, **kwargs}
    if grouped:
        kwargs = {"routing": "sigmoid_group_topk", "n_group": N_GROUP,
                  "topk_group": TOPK_GROUP, "routed_scaling_factor": SCALING, **kwargs}
    layer = keras_attn.MixtureOfExperts(**kwargs)
    layer.build((None, None, D))
    layer.router_kernel.assign(params["router"])
    layer.gate_kernel.assign(params["gate"])
    layer.intermediate_kernel.assign(params["up"])
    layer.output_kernel.assign(params["down"])
    if grouped:
        layer.router_correction_bias.assign(bias)
    if kwargs["shared_intermediate_dim"]:
        layer.shared_gate_kernel.assign(params["shared_gate"])
        layer.shared_intermediate_kernel.assign(params["shared_up"])
        layer.shared_output_kernel.assign(params["shared_down"])
    if kwargs["shared_expert_gate"]:
        layer.shared_expert_gate_kernel.assign(params["shared_expert_gate"])
    return layer


def _far(a, b):
    return np.abs(np.asarray(a) - np.asarray(b)).max() > 0.05


@pytest.mark.parametrize("implementation", moe_forms.IMPLEMENTATIONS)
@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_group_routing_and_shared_expert_match_reference(implementation, norm_topk_prob):
    x, params, bias = _problem()
    expected = moe_reference.mixture_of_experts(x, params, K, norm_topk_prob,
                                                grouping=_grouping(bias))
    # Each option moves the numbers far past the float32 tolerance: the correction bias
    # ignored in the choice, no groups (one group), no scaling, the shared expert dropped.
    routed = {n: p for n, p in params.items() if not n.startswith("shared")}
    for ablated in (
            moe_reference.mixture_of_experts(x, params, K, norm_topk_prob,
                                             grouping=_grouping(0 * bias)),
            moe_reference.mixture_of_experts(x, params, K, norm_topk_prob, grouping=dict(
                _grouping(bias), n_group=1, topk_group=1)),
            moe_reference.mixture_of_experts(x, params, K, norm_topk_prob, grouping=dict(
                _grouping(bias), scaling=1.0)),
            moe_reference.mixture_of_experts(x, routed, K, norm_topk_prob,
                                             grouping=_grouping(bias))):
        assert _far(expected, ablated)
    layer = _layer(params, bias, norm_topk_prob=norm_topk_prob,
                   implementation=moe_forms.layer_arg(implementation))
    with keras_attn.observe_paths() as taken, moe_forms.form(implementation):
        out = layer(x)
    assert taken == moe_forms.paths(implementation, width=F), dict(taken)
    assert_close(out, expected, what=implementation)


@pytest.mark.parametrize("implementation", moe_forms.IMPLEMENTATIONS)
def test_sigmoid_gated_shared_expert_matches_reference(implementation):
    """Qwen3-Next's shared expert, `sigmoid(x W_sg) * shared(x)`, behind a softmax router."""
    x, params, _ = _problem(13, gated=True)
    router = params["router"] / 2.0 * 3.0  # the softmax router of the other tests' scale
    params = dict(params, router=router)
    assert moe_reference.top_k_margin(x, router, K) > 1e-2
    expected = moe_reference.mixture_of_experts(x, params, K, True)
    ungated = {n: p for n, p in params.items() if n != "shared_expert_gate"}
    assert _far(expected, moe_reference.mixture_of_experts(x, ungated, K, True))
    layer = _layer(params, norm_topk_prob=True, implementation=moe_forms.layer_arg(implementation))
    with keras_attn.observe_paths() as taken, moe_forms.form(implementation):
        out = layer(x)
    assert taken == moe_forms.paths(implementation, width=F), dict(taken)
    assert_close(out, expected, what=implementation)


@pytest.mark.parametrize("implementation", moe_forms.IMPLEMENTATIONS)
def test_gradients_match_reference(implementation):
    """Every trainable kernel (the shared expert's and its gate's included) and the input;
    the correction bias is a non-trainable weight read by the choice only."""
    if keras.backend.backend() == "numpy":
        pytest.skip("the NumPy backend cannot differentiate")
    x, params, bias = _problem(13, gated=True)
    probe = randn(rng(2), B, T, D)
    layer = _layer(params, bias, norm_topk_prob=True, implementation=moe_forms.layer_arg(implementation))
    assert not layer.router_correction_bias.trainable
    names = ["router", "gate", "up", "down", "shared_gate", "shared_up", "shared_down",
             "shared_expert_gate"]
    weights = [layer.router_kernel, layer.gate_kernel, layer.intermediate_kernel,
               layer.output_kernel, layer.shared_gate_kernel, layer.shared_intermediate_kernel,
               layer.shared_output_kernel, layer.shared_expert_gate_kernel]
    assert {id(w) for w in layer.trainable_weights} == {id(w) for w in weights}

    def loss(x, *_):
        return keras.ops.sum(layer(x) * keras.ops.convert_to_tensor(probe))

    with keras_attn.observe_paths() as taken, moe_forms.form(implementation):
        value, grads = _device.value_and_grad(loss, [x, *weights])
    assert all(taken[p] for p in moe_forms.paths(implementation, width=F)), dict(taken)
    args = {"x": x.astype(np.float64), **{n: p.astype(np.float64) for n, p in params.items()}}

    def f(**a):
        p = {n: a[n] for n in names}
        out = moe_reference.mixture_of_experts(a["x"], p, K, True, grouping=_grouping(bias))
        return float((out * probe).sum())

    assert_close(value, f(**args), what="loss")
    for name, grad in zip(["x", *names], grads, strict=True):
        def g(v, name=name):
            return f(**dict(args, **{name: v}))
        assert_close(grad, numerical_gradient(g, args[name]), what=f"d/d{name}",
                     quantity="gradient")


def _deepseek_block(params, bias, norm_topk_prob):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    config = DeepseekV3Config(hidden_size=D, moe_intermediate_size=F, n_routed_experts=E,
                              num_experts_per_tok=K, n_shared_experts=2,
                              n_group=N_GROUP, topk_group=TOPK_GROUP,
                              norm_topk_prob=norm_topk_prob, routed_scaling_factor=SCALING)
    block = DeepseekV3MoE(config)
    with torch.no_grad():
        block.gate.weight.copy_(torch.tensor(params["router"].T))
        block.gate.e_score_correction_bias.copy_(torch.tensor(bias))
        gate_up = np.concatenate([params["gate"], params["up"]], axis=-1)  # (E, D, 2F)
        block.experts.gate_up_proj.copy_(torch.tensor(gate_up.transpose(0, 2, 1)))
        block.experts.down_proj.copy_(torch.tensor(params["down"].transpose(0, 2, 1)))
        shared = block.shared_experts
        shared.gate_proj.weight.copy_(torch.tensor(params["shared_gate"].T))
        shared.up_proj.weight.copy_(torch.tensor(params["shared_up"].T))
        shared.down_proj.weight.copy_(torch.tensor(params["shared_down"].T))
    return block.eval()


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_transformers_deepseek_v3_moe(norm_topk_prob):
    """DeepSeek V3's block: its shared expert is `n_shared_experts * moe_intermediate_size`
    wide (2 * 6 here: the shared weights drawn 12 wide)."""
    torch = pytest.importorskip("torch")
    x, params, bias = _problem(5)
    g = rng(7)
    params = dict(params, shared_gate=0.35 * randn(g, D, 2 * F),
                  shared_up=0.35 * randn(g, D, 2 * F), shared_down=0.35 * randn(g, 2 * F, D))
    block = _deepseek_block(params, bias, norm_topk_prob)
    with torch.no_grad():
        expected = block(torch.tensor(x)).numpy().astype(np.float64)
    scale = np.abs(expected).max()
    for implementation in ("dense", "sparse"):
        out = to_numpy(_layer(params, bias, norm_topk_prob=norm_topk_prob,
                              shared_intermediate_dim=2 * F, implementation=implementation)(x))
        assert np.abs(out - expected).max() <= 1e-5 * scale, implementation
    # Ablations: the correction bias ignored in the choice; the shared expert dropped.
    unbiased = to_numpy(_layer(params, 0 * bias, norm_topk_prob=norm_topk_prob,
                               shared_intermediate_dim=2 * F)(x))
    routed = {n: p for n, p in params.items() if not n.startswith("shared")}
    no_shared = to_numpy(_layer(routed, bias, norm_topk_prob=norm_topk_prob)(x))
    assert np.abs(unbiased - expected).max() > 1e-2 * scale
    assert np.abs(no_shared - expected).max() > 1e-2 * scale


def test_transformers_qwen3_next_shared_expert_gate():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextSparseMoeBlock

    x, params, _ = _problem(13, gated=True)
    params = dict(params, router=params["router"] / 2.0 * 3.0)
    assert moe_reference.top_k_margin(x, params["router"], K) > 1e-2
    config = Qwen3NextConfig(hidden_size=D, moe_intermediate_size=F, num_experts=E,
                             num_experts_per_tok=K, shared_expert_intermediate_size=S,
                             norm_topk_prob=True)
    block = Qwen3NextSparseMoeBlock(config)
    with torch.no_grad():
        block.gate.weight.copy_(torch.tensor(params["router"].T))
        gate_up = np.concatenate([params["gate"], params["up"]], axis=-1)
        block.experts.gate_up_proj.copy_(torch.tensor(gate_up.transpose(0, 2, 1)))
        block.experts.down_proj.copy_(torch.tensor(params["down"].transpose(0, 2, 1)))
        shared = block.shared_expert
        shared.gate_proj.weight.copy_(torch.tensor(params["shared_gate"].T))
        shared.up_proj.weight.copy_(torch.tensor(params["shared_up"].T))
        shared.down_proj.weight.copy_(torch.tensor(params["shared_down"].T))
        block.shared_expert_gate.weight.copy_(torch.tensor(params["shared_expert_gate"].T))
        expected = block.eval()(torch.tensor(x))
    expected = (expected[0] if isinstance(expected, tuple) else expected).numpy()
    scale = np.abs(expected).max()
    out = to_numpy(_layer(params, norm_topk_prob=True)(x))
    assert np.abs(out - expected).max() <= 1e-5 * scale
    ungated = {n: p for n, p in params.items() if n != "shared_expert_gate"}
    assert np.abs(to_numpy(_layer(ungated, norm_topk_prob=True)(x)) - expected).max() > (
        1e-2 * scale)


def test_config_round_trip_old_configs_and_a_compiled_call(tmp_path):
    x, params, bias = _problem()
    layer = _layer(params, bias, norm_topk_prob=True, implementation="sparse",
                   name="feed_forward")
    config = layer.get_config()
    assert config["shared_intermediate_dim"] == S and config["n_group"] == N_GROUP
    again = keras_attn.MixtureOfExperts.from_config(config)
    assert again.get_config() == config
    # A config written before these arguments existed loads with today's behaviour.
    old = {k: v for k, v in config.items() if k not in (
        "shared_intermediate_dim", "shared_expert_gate", "n_group", "topk_group",
        "routed_scaling_factor", "routing")}
    plain = keras_attn.MixtureOfExperts.from_config(old)
    assert (plain.routing, plain.shared_intermediate_dim, plain.n_group, plain.topk_group,
            plain.routed_scaling_factor) == ("softmax_topk", None, 1, 1, 1.0)
    # In a `.keras` file (the bias, not trainable, saved with the kernels), then compiled
    # (jax.jit, a tf.function with an unknown batch size).
    inputs = keras.Input((T, D))
    model = keras.Model(inputs, layer(inputs))
    expected = moe_reference.mixture_of_experts(x, params, K, True, grouping=_grouping(bias))
    path = tmp_path / "deepseek_moe.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(to_numpy(loaded.layers[-1].router_correction_bias), bias)
    assert_close(loaded.predict(x, verbose=0), expected, what="compiled")


@pytest.mark.parametrize("kwargs, match", [
    (dict(shared_intermediate_dim=-2), r"Received: shared_intermediate_dim=-2"),
    (dict(shared_expert_gate=True), r"Received: shared_expert_gate=True"),
    (dict(shared_intermediate_dim=4, shared_expert_gate=1), r"Received: shared_expert_gate=1"),
    (dict(n_group=2), r"Received: n_group=2"),  # softmax_topk: neutral values only
    (dict(routed_scaling_factor=2.0), r"Received: routed_scaling_factor=2.0"),
    (dict(routing="sigmoid_group_topk", n_group=3), r"Received: n_group=3"),
    (dict(routing="sigmoid_group_topk", n_group=8), r"Received: n_group=8"),  # groups of 1
    (dict(routing="sigmoid_group_topk", n_group=4, topk_group=5), r"Received: topk_group=5"),
    (dict(routing="sigmoid_group_topk", n_group=4, topk_group=1, num_experts_per_tok=3),
     r"Received: num_experts_per_tok=3"),
    (dict(routing="sigmoid_group_topk", routed_scaling_factor=0),
     r"Received: routed_scaling_factor=0"),
    (dict(routing="sigmoid_group_topk", router_aux_loss_coef=0.1),
     r"Received: router_aux_loss_coef=0.1"),
])
def test_bad_arguments_are_refused_by_name(kwargs, match):
    kwargs = {"num_experts": E, "num_experts_per_tok": K, "intermediate_dim": F, **kwargs}
    with pytest.raises(ValueError, match=match):
        keras_attn.MixtureOfExperts(**kwargs)
