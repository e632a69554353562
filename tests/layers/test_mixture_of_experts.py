"""`MixtureOfExperts`: both paths against the float64 reference (outputs, gradients and
the load-balancing loss), with routers whose top-k margins are asserted far from ties;
transformers' `MixtralSparseMoeBlock` and `Qwen3MoeSparseMoeBlock` with the same random
weights; configs, a `.keras` round trip inside a decoder block, and bad arguments."""

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn import _device
from keras_attn.layers.mixture_of_experts import load_balancing_loss
from keras_attn.testing import moe_reference
from keras_attn.testing.reference import numerical_gradient

from .. import shapes
from ..helpers import assert_close, randn, rng, to_numpy
from . import moe_forms

B, T, D = shapes.B, shapes.T, shapes.D
E, K, F = 4, 2, 8
MARGIN = 1e-2


def _problem(seed=33, k=K, router_scale=3.0):
    """Inputs and weights far from identity (std 0.35 experts); a router scaled so the
    k-th and (k+1)-th probabilities of every token are more than MARGIN apart (the seeds
    33, 34 and 6 are ones where that holds: asserted, not assumed)."""
    g = rng(seed)
    x = randn(g, B, T, D)
    params = {"router": router_scale * 0.35 * randn(g, D, E),
              "gate": 0.35 * randn(g, E, D, F), "up": 0.35 * randn(g, E, D, F),
              "down": 0.35 * randn(g, E, F, D)}
    for kk in (1, k):
        assert moe_reference.top_k_margin(x, params["router"], kk) > MARGIN
    return x, params


def _layer(params, **kwargs):
    kwargs = {"num_experts": E, "num_experts_per_tok": K, "intermediate_dim": F, **kwargs}
    layer = keras_attn.MixtureOfExperts(**kwargs)
    layer.build((None, None, D))
    layer.router_kernel.assign(params["router"])
    layer.gate_kernel.assign(params["gate"])
    layer.intermediate_kernel.assign(params["up"])
    layer.output_kernel.assign(params["down"])
    return layer


@pytest.mark.parametrize("implementation", moe_forms.IMPLEMENTATIONS)
@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_each_path_matches_reference(implementation, norm_topk_prob):
    x, params = _problem()
    expected = moe_reference.mixture_of_experts(x, params, K, norm_topk_prob)
    flipped = moe_reference.mixture_of_experts(x, params, K, not norm_topk_prob)
    top1 = moe_reference.mixture_of_experts(x, params, 1, norm_topk_prob)
    # The ablations move the numbers far past the float32 tolerance.
    assert np.abs(expected - flipped).max() > 0.05 and np.abs(expected - top1).max() > 0.05
    layer = _layer(params, norm_topk_prob=norm_topk_prob,
                   implementation=moe_forms.layer_arg(implementation))
    with keras_attn.observe_paths() as taken, moe_forms.form(implementation):
        out = layer(x)
    assert taken == moe_forms.paths(implementation), dict(taken)
    assert_close(out, expected, what=implementation)


@pytest.mark.parametrize("k, tokens", [(2, 1), (1, 3)])
@pytest.mark.parametrize("implementation", moe_forms.IMPLEMENTATIONS[1:])
def test_fewer_copies_than_experts_gather_their_experts(k, tokens, implementation):
    """A decode step's few token copies (N k < E) each read only their own expert
    ("moe_gathered", inside the sparse path), = the float64 reference, outputs and the
    gradient of the expert kernels."""
    x, params = _problem(k=k)
    x = x[:1, :tokens]
    expected = moe_reference.mixture_of_experts(x, params, k, True)
    layer = _layer(params, num_experts_per_tok=k, norm_topk_prob=True, implementation="sparse")
    with keras_attn.observe_paths() as taken, moe_forms.form(implementation):
        out = layer(x)
    assert taken == moe_forms.paths(implementation, gathered=True), dict(taken)
    assert_close(out, expected, what=f"gathered k={k}")
    if keras.backend.backend() == "numpy":
        return
    dense = _layer(params, num_experts_per_tok=k, norm_topk_prob=True, implementation="dense")

    def loss(moe):
        return lambda inputs, *kernels: keras.ops.sum(keras.ops.square(moe(inputs)))

    kernels = ("gate_kernel", "intermediate_kernel", "output_kernel")
    with moe_forms.form(implementation):
        _, got = _device.value_and_grad(loss(layer), [x] + [getattr(layer, n) for n in kernels])
    _, want = _device.value_and_grad(loss(dense), [x] + [getattr(dense, n) for n in kernels])
    for name, a, b in zip(("x",) + kernels, got, want):
        assert np.abs(to_numpy(b)).max() > 1e-3, name
        assert_close(to_numpy(a), to_numpy(b), what=f"d loss / d {name}", quantity="gradient")


def test_auto_picks_dense_for_few_experts_and_sparse_for_many():
    x, params = _problem()
    with keras_attn.observe_paths() as taken:
        _layer(params)(x)
    assert taken == {"moe_dense": 1}
    g = rng(3)
    many = keras_attn.MixtureOfExperts(num_experts=16, num_experts_per_tok=2,
                                       intermediate_dim=F)
    with keras_attn.observe_paths() as taken:
        many(randn(g, B, T, D))
    # 8 experts per chosen one: sparse at any size
    assert taken == moe_forms.paths("sparse"), dict(taken)


def test_auto_picks_dense_for_few_tokens_where_it_measured_faster():
    """Mixtral's shape (E=8, k=2): dense over at most 256 tokens on PyTorch and JAX
    (benchmarks/moe_paths.py), sparse above and on TensorFlow and NumPy."""
    from keras_attn.layers import _moe_experts

    g = rng(4)
    mixtral = keras_attn.MixtureOfExperts(num_experts=8, num_experts_per_tok=2,
                                          intermediate_dim=F)
    few = "dense" if keras.backend.backend() in ("torch", "jax") else "sparse"
    for shape, expected in (((B, T, D), few), ((1, 257, D), "sparse")):
        with keras_attn.observe_paths() as taken:
            mixtral(randn(g, *shape))
        assert taken == moe_forms.paths(expected), (shape, dict(taken))
    assert _moe_experts.chosen_path("auto", 8, 2, None) == "sparse"  # N unknown when traced
    assert _moe_experts.chosen_path("sparse", 8, 2, 4) == "sparse"


def test_sparse_path_with_skewed_loads_and_many_blocks():
    """One token, every token on the same two experts, and more tokens than a block:
    the padding of each expert's rows to whole blocks holds in every case."""
    x, params = _problem()
    skewed = dict(params, router=params["router"].copy())
    skewed["router"][:, 2:] -= 50.0  # experts 2, 3 never chosen
    for form in moe_forms.IMPLEMENTATIONS[1:]:
        for inputs, p in ((x[:1, :1], params), (x, skewed),
                          (np.tile(x, (1, 8, 1)), params)):  # 80 tokens: 160 copies
            expected = moe_reference.mixture_of_experts(inputs, p, K, True)
            with moe_forms.form(form):
                out = _layer(p, norm_topk_prob=True, implementation="sparse")(inputs)
            assert_close(out, expected, what=f"{form} {inputs.shape}")


@pytest.mark.parametrize("implementation", moe_forms.IMPLEMENTATIONS)
def test_gradients_and_aux_loss_match_reference(implementation):
    if keras.backend.backend() == "numpy":
        pytest.skip("the NumPy backend cannot differentiate")
    x, params = _problem(34)
    probe = randn(rng(2), B, T, D)
    coef = 0.5
    layer = _layer(params, implementation=moe_forms.layer_arg(implementation),
                   norm_topk_prob=True, router_aux_loss_coef=coef)
    weights = [layer.router_kernel, layer.gate_kernel, layer.intermediate_kernel,
               layer.output_kernel]

    def loss(x, *_):
        out = layer(x)
        # The loss `add_loss` receives in training (that it is added is checked eagerly
        # below; JAX's stateless gradient scope collects it outside `layer.losses`).
        _, indices, probs = layer.route(keras.ops.reshape(x, (-1, D)))
        aux = coef * load_balancing_loss(probs, indices, E)
        return keras.ops.sum(out * keras.ops.convert_to_tensor(probe)) + aux

    with keras_attn.observe_paths() as taken, moe_forms.form(implementation):
        value, grads = _device.value_and_grad(loss, [x, *weights])
    assert all(taken[path] for path in moe_forms.paths(implementation)), dict(taken)
    names = ["x", "router", "gate", "up", "down"]
    args = {"x": x.astype(np.float64), **{n: p.astype(np.float64) for n, p in params.items()}}

    def f(**a):
        p = {n: a[n] for n in names[1:]}
        out = moe_reference.mixture_of_experts(a["x"], p, K, True)
        return float((out * probe).sum()) + coef * moe_reference.load_balancing_loss(
            a["x"], p["router"], K)

    assert_close(value, f(**args), what="loss")
    for name, grad in zip(names, grads, strict=True):
        def g(v, name=name):
            return f(**dict(args, **{name: v}))
        assert_close(grad, numerical_gradient(g, args[name]), what=f"d/d{name}",
                     quantity="gradient")


def test_aux_loss_only_in_training_and_only_with_a_coefficient():
    x, params = _problem()
    layer = _layer(params, router_aux_loss_coef=0.25)
    layer(x)
    assert not layer.losses
    layer(x, training=True)
    (aux,) = layer.losses
    expected = 0.25 * moe_reference.load_balancing_loss(x, params["router"], K)
    assert_close(aux, np.asarray(expected))
    # The check can fail: a uniform router's loss (k = 2) is not this one's.
    assert abs(expected - 0.25 * K) > 1e-3
    off = _layer(params)
    off(x, training=True)
    assert not off.losses


def _torch_block(kind, params, norm_topk_prob=True):
    torch = pytest.importorskip("torch")
    if kind == "mixtral":
        from transformers import MixtralConfig
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
        config = MixtralConfig(hidden_size=D, intermediate_size=F, num_local_experts=E,
                               num_experts_per_tok=K)
        block = MixtralSparseMoeBlock(config)
    else:
        from transformers import Qwen3MoeConfig
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
        config = Qwen3MoeConfig(hidden_size=D, moe_intermediate_size=F, num_experts=E,
                                num_experts_per_tok=K, norm_topk_prob=norm_topk_prob)
        block = Qwen3MoeSparseMoeBlock(config)
    with torch.no_grad():
        block.gate.weight.copy_(torch.tensor(params["router"].T))
        gate_up = np.concatenate([params["gate"], params["up"]], axis=-1)  # (E, D, 2F)
        block.experts.gate_up_proj.copy_(torch.tensor(gate_up.transpose(0, 2, 1)))
        block.experts.down_proj.copy_(torch.tensor(params["down"].transpose(0, 2, 1)))
    return block.eval()


@pytest.mark.parametrize("kind, norm_topk_prob", [("mixtral", True), ("qwen3_moe", False),
                                                  ("qwen3_moe", True)])
def test_transformers_sparse_moe_blocks(kind, norm_topk_prob):
    torch = pytest.importorskip("torch")
    x, params = _problem(6)
    block = _torch_block(kind, params, norm_topk_prob)
    with torch.no_grad():
        expected = block(torch.tensor(x)).numpy().astype(np.float64)
    scale = np.abs(expected).max()
    for implementation in ("dense", "sparse"):
        out = to_numpy(_layer(params, norm_topk_prob=norm_topk_prob,
                              implementation=implementation)(x))
        assert np.abs(out - expected).max() <= 1e-5 * scale, implementation
    # Ablations: the renormalisation flipped, and top-1 instead of top-2.
    flipped = to_numpy(_layer(params, norm_topk_prob=not norm_topk_prob)(x))
    top1 = to_numpy(_layer(params, norm_topk_prob=norm_topk_prob, num_experts_per_tok=1)(x))
    assert np.abs(flipped - expected).max() > 1e-2 * scale
    assert np.abs(top1 - expected).max() > 1e-2 * scale


def test_config_round_trip_and_keras_file_in_a_decoder_block(tmp_path):
    """As a block's `feed_forward=`: the `.keras` file reloads with the same outputs
    (the file-level check that also runs under JAX and TensorFlow)."""
    x, params = _problem()
    moe = _layer(params, norm_topk_prob=True, implementation="sparse",
                 router_aux_loss_coef=0.01, name="feed_forward")
    config = moe.get_config()
    again = keras_attn.MixtureOfExperts.from_config(config)
    assert again.get_config() == config
    block = keras_attn.TransformerDecoderLayer(
        num_heads=shapes.H, feed_forward=moe, normalize_first=True)
    inputs = keras.Input((T, D))
    model = keras.Model(inputs, block(inputs))
    expected = to_numpy(model(x))
    path = tmp_path / "moe.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(to_numpy(loaded(x)), expected, rtol=1e-6, atol=1e-6)
    # Compiled (jax.jit, a tf.function with an unknown batch size): the sparse dispatch
    # traces with symbolic shapes and gives the same numbers.
    np.testing.assert_allclose(loaded.predict(x, verbose=0), expected, rtol=1e-5, atol=1e-5)
    moe_loaded = loaded.layers[-1].feed_forward
    assert isinstance(moe_loaded, keras_attn.MixtureOfExperts)
    np.testing.assert_array_equal(to_numpy(moe_loaded.router_kernel), params["router"])


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_experts=0), r"Received: num_experts=0"),
    (dict(num_experts_per_tok=5), r"Received: num_experts_per_tok=5"),
    (dict(intermediate_dim=-1), r"Received: intermediate_dim=-1"),
    (dict(router_aux_loss_coef=-0.1), r"Received: router_aux_loss_coef=-0.1"),
    (dict(routing="sigmoid"), r"Received: routing='sigmoid'"),
    (dict(implementation="grouped"), r"Received: implementation='grouped'"),
])
def test_bad_arguments_are_refused_by_name(kwargs, match):
    kwargs = {"num_experts": E, "num_experts_per_tok": K, "intermediate_dim": F, **kwargs}
    with pytest.raises(ValueError, match=match):
        keras_attn.MixtureOfExperts(**kwargs)
