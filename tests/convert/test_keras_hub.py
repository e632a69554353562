"""`keras_attn.convert.causal_lm_from_keras_hub` against keras-hub's own models, per family.

Tiny random keras-hub Llama 3, Mistral, Qwen 2 and Gemma 3 models built from their
constructors (nothing is downloaded), weights redrawn far from identity (std 0.35): the
converted model gives keras-hub's logits (1e-5 relative, float32) and its 16 greedy
tokens, on jax, tensorflow and torch (keras-hub runs on those; the module is skipped where
keras-hub is not installed, and on numpy). Each family's ablation (a wrong RoPE base)
moves the logits far past the tolerance, and what is not reproduced is refused by name.
"""

import keras
import numpy as np
import pytest

from keras_attn import convert
from keras_attn.convert import keras_hub as hub_convert

keras_hub = pytest.importorskip("keras_hub")
if keras.backend.backend() == "numpy":
    pytest.skip("keras-hub does not run on the numpy backend", allow_module_level=True)

TOLERANCE = 1e-5  # max |keras_attn - keras-hub| / max |keras-hub|
MIN_MARGIN = 1e-3  # every greedy step's top-1 leads its top-2 by far more than the error
P, NEW = 4, 16  # prompt length, greedy tokens
SIZES = dict(vocabulary_size=64, num_query_heads=4, num_key_value_heads=2, hidden_dim=32,
             intermediate_dim=48, dtype="float32")


def _llama3():
    return keras_hub.models.Llama3Backbone(num_layers=2, rope_max_wavelength=500,
                                           layer_norm_epsilon=1e-5, **SIZES)


def _mistral():
    return keras_hub.models.MistralBackbone(num_layers=2, rope_max_wavelength=500,
                                            sliding_window=5, layer_norm_epsilon=1e-5, **SIZES)


def _qwen(**options):
    return keras_hub.models.QwenBackbone(num_layers=2, rope_max_wavelength=500,
                                         layer_norm_epsilon=1e-5, **options, **SIZES)


def _gemma3(**options):
    options = {"num_layers": 6, "use_post_ffw_norm": True, "use_post_attention_norm": True,
               **options}
    return keras_hub.models.Gemma3Backbone(
        image_size=16, head_dim=8, vision_encoder=None, use_sliding_window_attention=True,
        sliding_window_size=5, final_logit_soft_cap=5.0, **options, **SIZES)


def _wrong_theta(config):  # the RoPE base of every block, 500 (1e4, 1e6) -> 10 (Gemma 3)
    for rope in (config["rope_parameters"].values() if config["model_type"] == "gemma3_text"
                 else [config["rope_parameters"]]):
        rope["rope_theta"] = 10.0
    return config


# name -> (backbone factory, keras-hub CausalLM class)
CASES = {"llama3": (_llama3, "Llama3CausalLM"), "mistral": (_mistral, "MistralCausalLM"),
         "qwen": (_qwen, "QwenCausalLM"), "gemma3": (_gemma3, "Gemma3CausalLM")}


def _far_from_identity(backbone, seed=0):
    """Every weight redrawn with std 0.35 (keras-hub's RMSNorm scales about 1, Gemma's
    `1 + w` about 0)."""
    rng = np.random.default_rng(seed)
    offset = 0.0 if type(backbone).__name__ == "Gemma3Backbone" else 1.0
    for variable in backbone.weights:
        value = rng.normal(0.0, 0.35, tuple(variable.shape))
        if variable.path.endswith("scale"):
            value += offset
        variable.assign(value.astype("float32"))


def _hub_logits(lm, ids):
    return keras.ops.convert_to_numpy(lm({"token_ids": ids, "padding_mask": np.ones_like(ids)}))


def _hub_greedy(lm, prompt):
    """keras-hub's greedy tokens, each step from its full forward on one (B, P + NEW)
    buffer (causal: the positions after the step do not change its logits), and the
    smallest top-1 / top-2 margin."""
    tokens = np.zeros((prompt.shape[0], P + NEW), "int32")
    tokens[:, :P] = prompt
    margin = np.inf
    for t in range(P, P + NEW):
        step = _hub_logits(lm, tokens)[:, t - 1]
        top = np.sort(step, axis=-1)
        margin = min(margin, float((top[:, -1] - top[:, -2]).min()))
        tokens[:, t] = step.argmax(-1)
    return tokens, margin


@pytest.fixture(scope="module")
def converted():
    """name -> (keras-hub CausalLM, ids, its logits, its tokens, margin, our CausalLM)."""
    cache = {}

    def get(name):
        if name not in cache:
            make, cls = CASES[name]
            backbone = make()
            _far_from_identity(backbone)
            lm = getattr(keras_hub.models, cls)(backbone=backbone, preprocessor=None)
            ids = np.random.default_rng(1).integers(0, 64, (2, P + NEW)).astype("int32")
            tokens, margin = _hub_greedy(lm, ids[:, :P])
            cache[name] = (lm, ids, _hub_logits(lm, ids), tokens, margin,
                           convert.causal_lm_from_keras_hub(lm))
        return cache[name]

    return get


def _error(actual, expected):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float(np.abs(actual - expected).max() / np.abs(expected).max())


@pytest.mark.parametrize("name", sorted(CASES))
def test_logits_and_greedy_tokens_match_keras_hub(converted, name):
    _, ids, logits, tokens, margin, lm = converted(name)
    error = _error(keras.ops.convert_to_numpy(lm(ids)), logits)
    assert error <= TOLERANCE, f"{name}: relative error {error:.3g}"
    assert margin > MIN_MARGIN, f"{name}: greedy margin {margin:.3g} (pick another seed)"
    ours = keras.ops.convert_to_numpy(lm.generate(ids[:, :P], max_length=P + NEW))
    np.testing.assert_array_equal(ours, tokens)


@pytest.mark.parametrize("name", sorted(CASES))
def test_ablation_a_wrong_rope_base_moves_the_logits(converted, name):
    """The same weights with a wrong RoPE base are far past the tolerance: the comparison
    can fail."""
    hub, ids, logits, _, _, _ = converted(name)
    config = _wrong_theta(hub_convert.keras_hub_config(hub))
    wrong = convert.causal_lm_from_transformers(config, hub_convert.keras_hub_state_dict(hub))
    error = _error(keras.ops.convert_to_numpy(wrong(ids)), logits)
    assert error > 100 * TOLERANCE, f"{name}: ablation {error:.3g}"


def test_the_backbone_is_read_from_the_causal_lm_or_given_itself(converted):
    hub = converted("qwen")[0]
    assert hub_convert.keras_hub_config(hub.backbone) == hub_convert.keras_hub_config(hub)
    assert hub_convert.keras_hub_config(hub)["tie_word_embeddings"] is True  # Qwen's default
    assert converted("llama3")[-1].lm_head is not None  # Llama 3's own head


def test_unknown_models_are_refused():
    with pytest.raises(ValueError, match=r"causal_lm_or_backbone.*Received: .*object"):
        convert.causal_lm_from_keras_hub(object())


@pytest.mark.parametrize("make, field", [
    (lambda: _gemma3(num_layers=1, use_post_ffw_norm=False), "use_post_ffw_norm"),
    (lambda: _qwen(use_sliding_window_attention=True), "use_sliding_window_attention"),
])
def test_options_it_does_not_reproduce_are_refused_by_name(make, field):
    with pytest.raises(ValueError, match=rf"option `{field}` is not supported.*Received: "
                                         rf"{field}="):
        convert.causal_lm_from_keras_hub(make())


def test_a_lora_enabled_keras_hub_model_is_refused(converted):
    backbone = _qwen()
    backbone.enable_lora(2)
    with pytest.raises(ValueError, match=r"does not map.*lora_kernel_a"):
        convert.causal_lm_from_keras_hub(backbone)


@pytest.mark.parametrize("name", ["gemma3", "llama3"])
def test_keras_hubs_own_exported_config_reads_as_ours(converted, name):
    """keras-hub's exporter's config (Gemma 3's has `rope_theta` beside `rope_parameters`)
    reads to the same spec as the one written here."""
    from keras_hub.src.utils.transformers.export import gemma3, llama3

    from keras_attn.convert._transformers_config import read_config

    backbone = converted(name)[0].backbone
    exported = (gemma3.get_gemma3_config if name == "gemma3" else llama3.get_llama3_config)(
        backbone)
    if name == "gemma3":  # keras-hub 0.32's exporter leaves the final soft-cap out (its
        # exported model's logits are uncapped); ours keeps it, as keras-hub's model has it
        assert "final_logit_softcapping" not in exported
        exported["final_logit_softcapping"] = backbone.final_logit_soft_cap
    assert read_config(exported) == read_config(hub_convert.keras_hub_config(backbone))
