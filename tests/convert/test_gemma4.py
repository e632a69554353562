"""Gemma 4 (`gemma4_text`) against transformers, feature by feature: each feature of the
cases of tests/family_cases.py ("gemma4_text", 31B-style; "gemma4_text_e2b", E2B-style;
"gemma4_text_moe", 26B-A4B-style: its routers' margins asserted far from ties)
switched off in the converted model moves the logits far past the tolerance (so the
comparison in tests/convert/test_families.py can fail on each), the KV-shared layers are
observed reading their source's cache and owning no key/value weights, and what keras_attn
does not reproduce is refused by name.

Needs torch and transformers (skipped elsewhere, as tests/convert/test_families.py).
"""

import keras
import numpy as np
import pytest

from keras_attn import CausalLM, convert
from keras_attn import cache as kv_cache

from .. import family_cases as fc

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def converted():
    cache = {}

    def get(name):
        if name not in cache:
            model = fc.build_hf(name)
            ids = fc.token_ids(name)
            logits, _, _ = fc.hf_reference(model, ids, generate=False)
            cache[name] = (model, ids, logits, convert.causal_lm_from_transformers(model))
        return cache[name]

    return get


def _rebuilt(lm, block_changes=None, **model_changes):
    """`lm` from its config with `block_changes(i, block_config)` applied and the model's
    config updated; the weights of the same paths copied (new ones keep their init)."""
    config = lm.get_config()
    for i, block in enumerate(config["blocks"]):
        if block_changes is not None:
            block_changes(i, block["config"])
    config.update(model_changes)
    new = CausalLM.from_config(config)

    def relative(model, variable):  # the path inside the model (a fresh one has no prefix)
        path = variable.path
        return path[len(model.name) + 1:] if path.startswith(model.name + "/") else path

    old = {relative(lm, v): v for v in lm.variables}
    copied = 0
    for variable in new.variables:
        path = relative(new, variable)
        if path in old and tuple(old[path].shape) == tuple(variable.shape):
            variable.assign(keras.ops.convert_to_numpy(old[path]))
            copied += 1
    assert copied >= len(lm.variables) - 12, (copied, len(lm.variables))  # few new ones
    return new


def _error(lm, ids, logits):
    return fc.relative_error(keras.ops.convert_to_numpy(lm(ids)), logits)


def _full(block):
    return block["sliding_window"] is None


ABLATIONS = {
    "gemma4_text": {
        "K = V off (values from a projection of their own)":
            lambda i, b: b.update(attention_k_eq_v=False) if _full(b) else None,
        "value norm off": lambda i, b: b.update(use_value_norm=False),
        "proportional RoPE -> default":
            lambda i, b: b.update(rope_type="default", rope_partial_rotary_factor=1.0)
            if _full(b) else None,
        "layer scalars dropped": lambda i, b: b.pop("use_layer_scalar"),
    },
    # (Proportional -> default moves this case's logits by 6e-3 only, 60x the tolerance
    # but under the 100x asked here: the 31B-style case carries that ablation, 2e-2.)
    "gemma4_text_e2b": {
        "value norm off": lambda i, b: b.update(use_value_norm=False),
    },
}


@pytest.mark.parametrize("name", sorted(ABLATIONS))
def test_a_rebuild_without_changes_is_the_converted_model(converted, name):
    """The ablations' helper copies every weight: unchanged, it is within the tolerance."""
    _, ids, logits, lm = converted(name)
    assert _error(_rebuilt(lm), ids, logits) <= fc.TOLERANCE


@pytest.mark.parametrize("name, what", [(n, w) for n in ABLATIONS for w in ABLATIONS[n]])
def test_each_feature_off_moves_the_logits(converted, name, what):
    _, ids, logits, lm = converted(name)
    assert _error(lm, ids, logits) <= fc.TOLERANCE
    error = _error(_rebuilt(lm, ABLATIONS[name][what]), ids, logits)
    assert error > 100 * fc.TOLERANCE, f"{name}: {what}: {error:.3g}"


def test_kv_sharing_off_moves_the_logits(converted):
    """The E2B case's last two layers with keys and values of their own (fresh weights)."""
    _, ids, logits, lm = converted("gemma4_text_e2b")
    assert lm.kv_sharing == [None, None, None, 2, 1]

    def own(i, block):
        block["is_kv_shared_layer"] = False

    error = _error(_rebuilt(lm, own, kv_sharing=None), ids, logits)
    assert error > 100 * fc.TOLERANCE, error


def test_kv_sharing_from_the_wrong_layer_moves_the_logits(converted):
    """Layer 4 (full) reading layer 0's keys and values (also full, also 32 wide) instead of
    layer 1's: the source is the last earlier layer of the type, not any."""
    _, ids, logits, lm = converted("gemma4_text_e2b")
    wrong = _rebuilt(lm, kv_sharing=[None, None, None, 2, 0])
    assert _error(wrong, ids, logits) > 100 * fc.TOLERANCE


def test_per_layer_inputs_off_moves_the_logits(converted):
    _, ids, logits, lm = converted("gemma4_text_e2b")
    assert _error(fc.ablate(lm, "gemma4_text_e2b"), ids, logits) > 100 * fc.TOLERANCE


def test_shared_layers_own_no_key_value_weights_and_read_their_source(converted, monkeypatch):
    """The consumers have no key_dense / value_dense / key_norm, the full layers of the 31B
    case no value_dense; in the forward and in each generate step every shared block reads
    a cache (keys None) instead of writing one."""
    model, ids, _, lm = converted("gemma4_text_e2b")
    for i, block in enumerate(lm.blocks):
        names = {v.path.split("/")[-2] for v in block.self_attention.variables}
        shared = lm.kv_sharing[i] is not None
        assert ("key_dense" in names) != shared and ("key_norm" in names) != shared, names
        assert block.feed_forward.intermediate_dim == (2 * fc.F if shared else fc.F)
    state = model.state_dict()
    assert "model.layers.3.self_attn.k_proj.weight" not in state
    assert "model.layers.2.self_attn.k_proj.weight" in state
    _, _, _, dense = converted("gemma4_text")
    assert [hasattr(b.self_attention, "value_dense") for b in dense.blocks] == [
        True, False, True, False]
    assert [b.self_attention.key_dim for b in dense.blocks] == [16, 32, 16, 32]
    assert [b.self_attention.num_key_value_heads for b in dense.blocks] == [2, 1, 2, 1]

    reads = []
    update = kv_cache.KVCache.update

    def spy(self, keys, values, cache_update_index=None, **kwargs):
        if keys is None and cache_update_index is not None:
            reads.append(kwargs["query_length"])
        return update(self, keys, values, cache_update_index, **kwargs)

    monkeypatch.setattr(kv_cache.KVCache, "update", spy)
    lm(ids)
    assert reads == [fc.T, fc.T]  # the two shared blocks, over the T tokens
    reads.clear()
    lm.generate(ids[:, :fc.P], max_length=fc.P + 3, jit_compile=False)
    # The prefill, then the decoding step: run twice eagerly (torch), traced once or more
    # inside the compiled loop (jax, tensorflow), each time over one token.
    assert reads[:2] == [fc.P, fc.P] and set(reads[2:]) == {1} and len(reads[2:]) % 2 == 0


def test_the_per_layer_config_is_cross_checked_against_the_weights(converted):
    """Without `per_layer_config`, `global_head_dim` 24 makes the full layers 24 wide: their
    32-wide weights are refused, naming the layer's own width."""
    model, _, _, _ = converted("gemma4_text")
    config = model.config.to_dict()
    config.pop("per_layer_config")
    config.update(global_head_dim=24, num_global_key_value_heads=1)
    with pytest.raises(ValueError, match=r"head_dim=24 \(this layer's own, per_layer_config"):
        convert.causal_lm_from_transformers(config, model.state_dict())


@pytest.mark.parametrize("field, value, match", [
    ("enable_moe_block", True, "num_experts=None"),  # a mixture needs its sizes
    ("enable_moe_block", 1, "enable_moe_block=1"),
    ("use_bidirectional_attention", "all", "use_bidirectional_attention='all'"),
    ("num_kv_shared_layers", 4, "num_kv_shared_layers=4"),
    ("per_layer_config", {"1": {"head_dim": 32, "sliding_window": 3}},
     r"per_layer_config\['1'\]\['sliding_window'\]"),
    ("rope_theta", 1e4, "rope_theta=10000.0"),
])
def test_what_is_not_reproduced_is_refused_by_name(converted, field, value, match):
    model, _, _, _ = converted("gemma4_text")
    config = {**model.config.to_dict(), field: value}
    with pytest.raises(ValueError, match=match):
        convert.causal_lm_from_transformers(config, model.state_dict())


def test_a_value_projection_on_a_k_eq_v_layer_is_refused(converted):
    model, _, _, _ = converted("gemma4_text")
    state = dict(model.state_dict())
    state["model.layers.1.self_attn.v_proj.weight"] = state[
        "model.layers.1.self_attn.k_proj.weight"]
    with pytest.raises(ValueError, match="attention_k_eq_v=True.*v_proj"):
        convert.causal_lm_from_transformers(model.config, state)


def test_stored_kv_weights_of_shared_layers_are_dropped_as_transformers_does(converted):
    model, ids, logits, _ = converted("gemma4_text_e2b")
    state = dict(model.state_dict())
    state["model.layers.3.self_attn.k_proj.weight"] = state[
        "model.layers.2.self_attn.k_proj.weight"]
    lm = convert.causal_lm_from_transformers(model.config, state)
    assert _error(lm, ids, logits) <= fc.TOLERANCE


def test_the_models_round_trip_through_keras_files(converted, tmp_path):
    for name in ("gemma4_text", "gemma4_text_e2b", "gemma4_text_moe"):
        _, ids, logits, lm = converted(name)
        path = str(tmp_path / f"{name}.keras")
        lm.save(path)
        again = keras.saving.load_model(path)
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(again(ids)),
                                      keras.ops.convert_to_numpy(lm(ids)))


def test_moe_routers_are_far_from_ties(converted):
    """Every token's second and third router logits (log-probabilities) differ by more
    than 1e-2 in both layers of the MoE case: the top-2 choice cannot flip by rounding."""
    model, ids, _, _ = converted("gemma4_text_moe")
    margins = []

    def record(module, inputs, output):
        top = torch.sort(output[0].float().log(), dim=-1, descending=True).values
        margins.append(float((top[:, 1] - top[:, 2]).min()))

    hooks = [layer.router.register_forward_hook(record) for layer in model.model.layers]
    with torch.no_grad():
        model(torch.from_numpy(ids).long())
    for hook in hooks:
        hook.remove()
    assert len(margins) == 2 and min(margins) > 1e-2, margins


def _set(lm, suffixes, value):
    """A copy of `lm` with every variable whose path ends with one of `suffixes` set to
    `value` (zeroed where `value` is None)."""
    new = CausalLM.from_config(lm.get_config())
    new.set_weights(lm.get_weights())
    chosen = [v for v in new.weights if v.path.endswith(tuple(suffixes))]
    assert len(chosen) == 2, [v.path for v in chosen]  # one per layer
    for variable in chosen:
        variable.assign(np.full(tuple(variable.shape), value or 0.0, "float32"))
    return new


@pytest.mark.parametrize("what, names, value", [
    ("router.scale ignored", ["/experts/router_scale"], 1.0),
    ("per_expert_scale ignored", ["/experts/per_expert_scale"], 1.0),
    ("post_feedforward_layernorm_2 ignored", ["/post_experts_norm/scale"], 1.0),
    ("pre_feedforward_layernorm_2 ignored", ["/experts_norm/scale"], 1.0),
    ("post_feedforward_layernorm_1 ignored", ["/post_dense_norm/scale"], 1.0),
    ("the dense MLP dropped", ["feed_forward/dense/output_dense/kernel"], None),
])
def test_each_moe_part_off_moves_the_logits(converted, what, names, value):
    _, ids, logits, lm = converted("gemma4_text_moe")
    assert _error(lm, ids, logits) <= fc.TOLERANCE
    error = _error(_set(lm, names, value), ids, logits)
    assert error > 100 * fc.TOLERANCE, (what, error)


def test_moe_router_on_the_normed_input_moves_the_logits(converted, monkeypatch):
    """The router reads the residual stream, not `pre_feedforward_layernorm_2`'s output:
    routing on the normed tokens instead moves the logits far past the tolerance."""
    from keras_attn.layers.parallel_mixture_of_experts import ParallelMixtureOfExperts

    _, ids, logits, lm = converted("gemma4_text_moe")

    def routed_on_normed(self, inputs, training=None):
        normed = self.experts_norm(inputs)
        dense = self.post_dense_norm(self.dense(self.dense_norm(inputs)))
        return dense + self.post_experts_norm(self.experts(normed, router_inputs=normed))

    monkeypatch.setattr(ParallelMixtureOfExperts, "call", routed_on_normed)
    error = _error(lm, ids, logits)
    assert error > 100 * fc.TOLERANCE, error


def test_moe_weights_are_cross_checked_and_all_read(converted):
    model, _, _, _ = converted("gemma4_text_moe")
    state = dict(model.state_dict())
    missing = {k: v for k, v in state.items() if not k.endswith("router.per_expert_scale")}
    with pytest.raises(ValueError, match="router.per_expert_scale"):
        convert.causal_lm_from_transformers(model.config, missing)
    wrong = dict(state)
    wrong["model.layers.0.experts.down_proj"] = wrong["model.layers.0.experts.down_proj"][:3]
    with pytest.raises(ValueError, match="num_experts=4"):
        convert.causal_lm_from_transformers(model.config, wrong)
    dense = model.config.to_dict()
    dense["enable_moe_block"] = False  # the experts' entries are then unread: refused
    with pytest.raises(ValueError, match="router"):
        convert.causal_lm_from_transformers(dense, state)


def test_one_moe_layer_converts_as_the_models_block(converted):
    """`transformer_decoder_layer_from_transformers` reads every entry of a MoE layer (its
    `check_all_used`) into the block the whole-model converter builds."""
    from keras_attn import ParallelMixtureOfExperts

    model, _, _, lm = converted("gemma4_text_moe")
    block = convert.transformer_decoder_layer_from_transformers(
        model.model.layers[0], model.config, layer_index=0)
    assert isinstance(block.feed_forward, ParallelMixtureOfExperts)
    assert block.feed_forward_norm is None
    x = np.random.default_rng(0).standard_normal((1, 5, fc.D)).astype("float32")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(block(x)),
                               keras.ops.convert_to_numpy(lm.blocks[0](x)), rtol=1e-6,
                               atol=1e-6)
