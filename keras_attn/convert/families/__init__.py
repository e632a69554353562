"""The Hugging Face model families keras_attn converts: one module per `model_type`.

Each module (`llama.py`, `starcoder2.py`, ...) holds what keras_attn knows of its
family:

- `MODEL_TYPE`: the config's `model_type`;
- `ARCHITECTURES`: transformers' `*ForCausalLM` and `*Model` classes of the family
  (what a config's `architectures` lists), from which `check_architectures` takes the
  family's prefix by transformers' naming rule (`LlamaForCausalLM`, `LlamaModel`:
  `Llama`);
- `FIELDS`: its config fields, `{"read": (...), "neutral": {field: values},
  "ignored": {field: why}}` (the fields every config has are added by
  `keras_attn.convert._transformers_config.table_of`); a field in none of them is
  refused, so a field added by a newer transformers cannot be dropped silently;
- `spec(config) -> ModelSpec`: the config (a dict) in keras_attn's terms, every
  field it cannot reproduce refused with a `ValueError` naming it;
- optionally `canonical_state_dict(entries, spec) -> dict`: its weights renamed (and
  fused ones split) into the Llama layout the converter maps (`q_proj`, `gate_proj`,
  `input_layernorm`, ...), each split cross-checked against the config;
- optionally `checkpoint_state_dict(tensors, spec) -> dict`: its inverse, the Llama
  layout's arrays back under the family's names (`CausalLM.save_pretrained`); a family
  with `canonical_state_dict` and without it is not written.

Each module owns its family's logic: what differs between families (which fields,
their defaults, which blocks slide, biases, norms, soft-caps, RoPE per layer type) is
written in the family's module, as arguments to family-neutral helpers; no helper
branches on a family's name. A family module imports those shared private helpers
(`keras_attn.convert._transformers_config`: `ModelSpec`, the field checks, `_rope`;
`families/_shared.py`: `core`, `rope_of`, `window_of`, the layer types, `layer_specs`),
never another family's module. This registry imports a module when its `model_type`
is first asked for.
"""

import importlib
import re

__all__ = ["REFUSED", "check_architectures", "family", "model_types"]

# model_type -> module (in keras_attn.convert.families).
_MODULES = {name: name for name in (
    "llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text",
    "starcoder2", "gemma", "phi3", "granite", "ministral", "smollm3", "glm4",
    "ministral3", "gpt_oss", "gemma4_text", "deepseek_v3", "olmo2", "olmo3", "exaone4",
    "cohere2", "gpt2", "mixtral", "qwen3_moe", "qwen3_5_text", "qwen3_next", "llama4_text")}


# model_type -> why it is refused (known to keras_attn, deliberately not converted).
REFUSED = {
    "llama4": (
        "the multimodal Llama 4 (Llama4ForConditionalGeneration: a vision tower and "
        "projector, the text weights under `language_model.`) is not converted; its text "
        "model is model_type 'llama4_text' (the config's text_config with its "
        "Llama4ForCausalLM weights)"),
    "deepseek_v32": (
        "DeepSeek V3.2's sparse attention keeps the index_topk keys of its indexer's ReLU'd "
        "scores, which tie at exactly 0; torch.topk breaks the ties in an order that depends "
        "on the sequence length, so transformers 5.24's own model is not prefix-consistent "
        "(appending tokens changed earlier logits by up to 0.88 relative with index_topk=4, "
        "7e-7 without the ties: tools/deepseek_v32_prefix_consistency.py); keras_attn does "
        "not reproduce an unspecified tie order. Its attention without the indexer is "
        "deepseek_v3's"),
    "deepseek_v4": (
        "DeepSeek V4's compressed sparse and heavily compressed attention (compress_rates, "
        "an indexer over compressed blocks, hyper-connections) are not multi-head latent "
        "attention and are not reproduced"),
}


def model_types():
    """The supported `model_type`s, in the order they were added."""
    return tuple(_MODULES)


def family(model_type):
    """The family module of `model_type`; a `ValueError` naming it when unsupported."""
    if isinstance(model_type, str) and model_type in REFUSED:
        raise ValueError(f"config field `model_type` is not supported ({REFUSED[model_type]}). "
                         f"Received: model_type={model_type!r}")
    if not isinstance(model_type, str) or model_type not in _MODULES:
        raise ValueError(
            f"config field `model_type` is not supported (keras_attn converts "
            f"{', '.join(map(repr, _MODULES))}). Received: model_type={model_type!r}")
    return importlib.import_module(f"{__name__}.{_MODULES[model_type]}")


# transformers' naming rule: a model class is its family's prefix then a head
# (`ForCausalLM`, `ForSequenceClassification`, ..., `LMHeadModel`, `TextModel`, `Model`).
_HEAD = re.compile(r"(TextModel|LMHeadModel|Model|For[A-Z][A-Za-z]*)$")


def class_prefix(name):
    """The family prefix of transformers class `name` (`Gemma3ForCausalLM`: `Gemma3`), or
    None when it does not follow the naming rule."""
    match = _HEAD.search(name)
    return (name[:match.start()] or None) if match else None


def _owners():
    """{prefix: model_type} of every registered family (imports every family module)."""
    return {class_prefix(name): model_type for model_type in _MODULES
            for name in family(model_type).ARCHITECTURES}


def check_architectures(config, module):
    """A `ValueError` naming `architectures` and `model_type` when the config's
    `architectures` lists a class of another registered family than `module`'s (by
    transformers' naming rule: `Gemma3ForCausalLM` with `model_type="llama"`). Classes of
    the family itself (any head), and names of no registered family (a custom class, an
    older spelling such as `LLaMAForCausalLM`), are metadata."""
    names = config.get("architectures")
    if names is None:
        return
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise ValueError("config field `architectures` must be a list of class names. "
                         f"Received: architectures={names!r}")
    own = {class_prefix(name) for name in module.ARCHITECTURES}
    for name in names:
        prefix = class_prefix(name)
        if prefix is None or prefix in own:
            continue
        owner = _owners().get(prefix)
        if owner is not None:
            raise ValueError(
                f"config fields `architectures` and `model_type` disagree: {name!r} is "
                f"transformers' class of model_type {owner!r}, not of {module.MODEL_TYPE!r}; "
                "keras_attn converts neither from a config that names both. Received: "
                f"architectures={list(names)!r}, model_type={module.MODEL_TYPE!r}")
