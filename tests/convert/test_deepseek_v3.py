"""DeepSeek V3 in one call (issue 34): what tests/convert/test_families.py does not check.

The case `deepseek_v3` of tests/family_cases.py (torch and transformers only): the routers'
group and expert margins inside transformers' own model, asserted far from ties; the paths
the converted model runs; a second ablation (the shared expert dropped); and the layer
converter, which builds the whole model's blocks.
"""

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn import convert
from keras_attn.testing import moe_reference

from .. import family_cases as fc

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

NAME = "deepseek_v3"


@pytest.fixture(scope="module")
def converted():
    model = fc.build_hf(NAME)
    ids = fc.token_ids(NAME)
    logits, _, _ = fc.hf_reference(model, ids, generate=False)
    return model, ids, logits, convert.causal_lm_from_transformers(model)


def test_routers_are_far_from_ties(converted):
    """The k-th / (k+1)-th biased expert scores and the kept / next group scores of every
    token at every mixture block, from the hidden states transformers' routers see."""
    model, ids, _, _ = converted
    config = model.config
    seen = {}

    def keep(i):
        def hook(module, args, out):  # returns None: the output is left alone
            seen[i] = args[0].detach().numpy()
        return hook

    hooks = [layer.mlp.gate.register_forward_hook(keep(i))
             for i, layer in enumerate(model.model.layers) if i >= config.first_k_dense_replace]
    with torch.no_grad():
        model(torch.from_numpy(ids).long())
    for hook in hooks:
        hook.remove()
    assert sorted(seen) == [1, 2]
    for i, x in seen.items():
        gate = model.model.layers[i].mlp.gate
        margins = moe_reference.group_route_margins(
            x, gate.weight.detach().numpy().T, config.num_experts_per_tok,
            gate.e_score_correction_bias.numpy(), config.n_group, config.topk_group)
        assert min(margins) > 2e-3, (i, margins)


def test_the_paths_and_the_shared_expert_ablation(converted):
    _, ids, logits, lm = converted
    blocks = lm.blocks
    assert isinstance(blocks[0].self_attention, keras_attn.MultiHeadLatentAttention)
    assert not isinstance(blocks[0].feed_forward, keras_attn.MixtureOfExperts)  # dense: k = 1
    assert all(isinstance(b.feed_forward, keras_attn.MixtureOfExperts) for b in blocks[1:])
    with keras_attn.observe_paths() as taken:
        out = keras.ops.convert_to_numpy(lm(ids))
    # Once per mixture, on the path `auto` takes for 8 experts, top-2, over these tokens.
    from keras_attn.layers import _moe_experts

    path = _moe_experts.chosen_path("auto", 8, 2, int(np.prod(ids.shape)))
    assert taken.get("moe_" + path) == 2, dict(taken)
    assert fc.relative_error(out, logits) <= fc.TOLERANCE
    dropped = type(lm).from_config(lm.get_config())
    dropped.set_weights(lm.get_weights())
    for variable in dropped.weights:
        if variable.name == "shared_output_kernel":
            variable.assign(np.zeros(tuple(variable.shape), "float32"))
    error = fc.relative_error(keras.ops.convert_to_numpy(dropped(ids)), logits)
    assert error > 100 * fc.TOLERANCE, error


def test_the_layer_converter_builds_the_model_blocks(converted):
    model, _, _, lm = converted
    x = np.random.default_rng(0).standard_normal((fc.B, 5, fc.D)).astype("float32")
    for i, hf_layer in enumerate(model.model.layers):
        block = convert.transformer_decoder_layer_from_transformers(hf_layer, model.config, i)
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(block(x)),
                                      keras.ops.convert_to_numpy(lm.blocks[i](x)))
