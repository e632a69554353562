"""Families whose attention keras_attn converts but not yet their blocks: gpt-oss.

`multi_head_attention_from_transformers(model.model.layers[i].self_attn, config, i)`
against transformers' `GptOssAttention` inside a tiny random `GptOssForCausalLM` (float32,
eager, weights std 0.35, sinks far from 0): live on torch, and on every backend from the
committed fixture tests/assets/attention/gpt_oss_<i>.keras and gpt_oss.npz
(`python tests/convert/test_attention_families.py` in the torch environment writes them).
Ablations: the sinks zeroed, the window dropped. The block and model converters refuse the
mixture-of-experts feed-forward by name.
"""

import os
import sys

import keras
import numpy as np
import pytest

from .. import family_cases as fc

HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets",
                    "attention")
TOLERANCE = 1e-4  # max |keras - hf| / max |hf|
B, T, SEED, STD = 2, 24, 33, 0.35
SINKS = np.array([1.5, -0.8, 3.0, 0.4], "float32")  # per query head, far from 0


def relative_error(actual, expected):
    actual = np.asarray(keras.ops.convert_to_numpy(actual), np.float64)
    expected = np.asarray(expected, np.float64)
    return float(np.abs(actual - expected).max() / np.abs(expected).max())


def config_kwargs():
    """A tiny gpt-oss: blocks 0 (sliding, W=4 < T) and 1 (full), yarn over a 16-token
    original context (factor 4, truncate False: GptOssConfig's layout, smaller)."""
    return dict(num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2,
                vocab_size=64, hidden_size=32, intermediate_size=16, head_dim=8,
                num_attention_heads=4, num_key_value_heads=2, sliding_window=4,
                max_position_embeddings=64, attention_bias=True,
                rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0,
                                 "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                                 "original_max_position_embeddings": 16})


def build_hf():
    """transformers' `GptOssForCausalLM` with random weights (torch only)."""
    import torch
    import transformers

    config = fc.skip_without("GptOssConfig")(**config_kwargs())
    config._attn_implementation = "eager"
    torch.manual_seed(SEED)
    model = transformers.GptOssForCausalLM(config).eval()
    generator = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for key, parameter in model.named_parameters():
            value = STD * torch.randn(parameter.shape, generator=generator)
            if key.endswith("sinks"):
                value = value + torch.from_numpy(SINKS)
            elif parameter.ndim == 1 and "norm" in key:
                value = value + 1.0
            parameter.copy_(value)
    return model.float()


def hf_attention_io(model):
    """`{i: (hidden states in, attention out)}` of each block's `self_attn` in a forward of
    random token ids (forward hooks: transformers' own RoPE, masks and sinks)."""
    import torch

    seen = {}
    hooks = [layer.self_attn.register_forward_hook(
        lambda module, args, kwargs, out, i=i: seen.__setitem__(
            i, (kwargs.get("hidden_states", args[0] if args else None).numpy(),
                out[0].numpy())), with_kwargs=True)
        for i, layer in enumerate(model.model.layers)]
    ids = np.random.default_rng(SEED).integers(0, 64, (B, T))
    with torch.no_grad():
        model(torch.from_numpy(ids).long())
    for hook in hooks:
        hook.remove()
    return seen


def _ablations(layer, x, expected):
    """The relative errors of the layer with its sinks zeroed and without its window."""
    from keras_attn import MultiHeadAttention

    weights = layer.get_weights()
    layer.sinks.assign(np.zeros_like(keras.ops.convert_to_numpy(layer.sinks)))
    no_sinks = relative_error(layer(x, use_causal_mask=True), expected)
    layer.set_weights(weights)
    config = {**layer.get_config(), "sliding_window": None}
    windowless = MultiHeadAttention.from_config(config)
    windowless.build((None, None, x.shape[-1]))
    windowless.set_weights(weights)
    return no_sinks, relative_error(windowless(x, use_causal_mask=True), expected)


def test_matches_transformers_gpt_oss_attention():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from keras_attn.convert import multi_head_attention_from_transformers

    model = build_hf()
    io = hf_attention_io(model)
    for i, layer_module in enumerate(model.model.layers):
        x, expected = io[i]
        layer = multi_head_attention_from_transformers(layer_module.self_attn, model.config, i)
        assert layer.use_sinks and layer.use_bias and layer.rope_type == "yarn"
        assert layer.sliding_window == (4 if i == 0 else None)
        np.testing.assert_allclose(keras.ops.convert_to_numpy(layer.sinks),
                                   layer_module.self_attn.sinks.detach().numpy())
        error = relative_error(layer(x, use_causal_mask=True), expected)
        assert error < TOLERANCE, f"layer {i}: {error:.3g}"
        no_sinks, windowless = _ablations(layer, x, expected)
        assert no_sinks > 100 * TOLERANCE
        if i == 0:  # the sliding block: the window matters over T = 24
            assert windowless > 100 * TOLERANCE


def test_blocks_convert_with_the_mixture_of_experts():
    """Issue 34: the block converter builds each block's mixture of experts as gpt-oss's
    (the whole model is checked against transformers in tests/convert/test_families.py)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from keras_attn import MixtureOfExperts
    from keras_attn.convert import transformer_decoder_layer_from_transformers

    model = build_hf()
    block = transformer_decoder_layer_from_transformers(model.model.layers[0], model.config, 0)
    moe = block.feed_forward
    assert isinstance(moe, MixtureOfExperts)
    assert (moe.num_experts, moe.num_experts_per_tok, moe.intermediate_dim, moe.routing,
            moe.use_router_bias, moe.use_expert_bias, moe.expert_activation, moe.swiglu_alpha,
            moe.swiglu_limit) == (4, 2, 16, "topk_softmax", True, True, "gpt_oss_swiglu",
                                  1.702, 7.0)
    experts = model.model.layers[0].mlp.experts
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(moe.gate_kernel),
                                  experts.gate_up_proj.detach().numpy()[..., ::2])
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(moe.intermediate_bias),
                                  experts.gate_up_proj_bias.detach().numpy()[..., 1::2])


def test_sinks_mapping_is_cross_checked():
    from keras_attn.convert import multi_head_attention_from_transformers

    rng = np.random.default_rng(0)
    H, H_kv, d, D = 4, 2, 8, 32
    state = {"q_proj.weight": rng.normal(size=(H * d, D)), "q_proj.bias": rng.normal(size=H * d),
             "k_proj.weight": rng.normal(size=(H_kv * d, D)),
             "k_proj.bias": rng.normal(size=H_kv * d),
             "v_proj.weight": rng.normal(size=(H_kv * d, D)),
             "v_proj.bias": rng.normal(size=H_kv * d),
             "o_proj.weight": rng.normal(size=(D, H * d)), "o_proj.bias": rng.normal(size=D),
             "sinks": rng.normal(size=H)}
    config = {"model_type": "gpt_oss", **config_kwargs()}
    layer = multi_head_attention_from_transformers(state, config, 1)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layer.sinks), state["sinks"],
                               rtol=1e-6)
    with pytest.raises(ValueError, match=r"num_attention_heads=4 give \(H,\) = \(4,\) for "
                                         r"state_dict entry 'sinks', which has shape \(3,\)"):
        multi_head_attention_from_transformers({**state, "sinks": np.zeros(3)}, config, 1)
    with pytest.raises(ValueError, match=r"sinks"):
        without = {k: v for k, v in state.items() if k != "sinks"}
        multi_head_attention_from_transformers(without, config, 1)
    # A config without RoPE parameters: GptOssConfig's default yarn (factor 32, theta 1.5e5).
    bare = {k: v for k, v in config.items() if k != "rope_parameters"}
    rope = multi_head_attention_from_transformers(state, bare, 1).options.rope
    assert (rope.rope_type, rope.scaling_factor, rope.max_wavelength, rope.truncate,
            rope.original_max_position_embeddings) == ("yarn", 32.0, 150000.0, False, 4096)
    llama = {"model_type": "llama", "vocab_size": 64, "hidden_size": D, "intermediate_size": 16,
             "num_hidden_layers": 1, "num_attention_heads": H, "num_key_value_heads": H_kv,
             "head_dim": d, "attention_bias": True, "mlp_bias": False}
    with pytest.raises(ValueError, match=r"no attention sinks, but state_dict has 'sinks'"):
        multi_head_attention_from_transformers(state, llama, 0)


def _load(i):
    from keras_attn import MultiHeadAttention

    model = keras.saving.load_model(os.path.join(HERE, f"gpt_oss_{i}.keras"))
    layer = model.layers[-1]  # the file holds the layer in a Sequential (a layer has no save)
    assert isinstance(layer, MultiHeadAttention)
    with np.load(os.path.join(HERE, "gpt_oss.npz"), allow_pickle=False) as stored:
        return layer, stored[f"inputs_{i}"], stored[f"outputs_{i}"]


@pytest.mark.parametrize("i", [0, 1])
def test_fixture_reproduces_transformers_on_every_backend(i):
    layer, x, expected = _load(i)
    assert relative_error(layer(x, use_causal_mask=True), expected) < TOLERANCE
    no_sinks, windowless = _ablations(layer, x, expected)
    assert no_sinks > 100 * TOLERANCE
    if i == 0:
        assert windowless > 100 * TOLERANCE


def write_fixtures():
    """Write tests/assets/attention/gpt_oss_{0,1}.keras and gpt_oss.npz (torch env)."""
    from keras_attn.convert import multi_head_attention_from_transformers

    os.makedirs(HERE, exist_ok=True)
    model = build_hf()
    io = hf_attention_io(model)
    arrays = {}
    for i, layer_module in enumerate(model.model.layers):
        layer = multi_head_attention_from_transformers(layer_module.self_attn, model.config, i)
        x, expected = io[i]
        error = relative_error(layer(x, use_causal_mask=True), expected)
        if error > TOLERANCE:
            raise SystemExit(f"layer {i}: off by {error:.3g}; not written")
        model_of = keras.Sequential([keras.Input((None, x.shape[-1])), layer])
        model_of.save(os.path.join(HERE, f"gpt_oss_{i}.keras"))
        arrays.update({f"inputs_{i}": x.astype("float32"),
                       f"outputs_{i}": expected.astype("float32")})
        print(f"gpt_oss layer {i}: relative error {error:.2e}, ablations (sinks 0, no window) "
              + ", ".join(f"{e:.2e}" for e in _ablations(layer, x, expected)))
    np.savez(os.path.join(HERE, "gpt_oss.npz"), **arrays)


if __name__ == "__main__":
    os.environ.setdefault("KERAS_BACKEND", "torch")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    write_fixtures()
