"""`model_type="phi3"` (Phi-3, Phi-4-mini) with the default RoPE: the fused `qkv_proj`
(rows: H*d queries, then H_kv*d keys, then H_kv*d values) and `gate_up_proj` (F gate
rows, then F up rows) are split on load and cross-checked against the config.
`partial_rotary_factor` (Phi-4-mini's 0.75) rotates the leading slice of each head.
`longrope` (Phi-3.5's and Phi-4-mini's long-context RoPE: per-frequency `short_factor` /
`long_factor` lists, switched past `original_max_position_embeddings`) is read with
transformers' Phi-3 rules: the top-level `original_max_position_embeddings` wins over the
RoPE parameters' own (`Phi3Config`'s default 4096 when absent), the old types "su" and
"yarn" mean longrope, and `factor` defaults to `max_position_embeddings /
original_max_position_embeddings` (it sets the default attention factor)."""

from collections.abc import Mapping

import numpy as np

from keras_attn.convert import _common
from keras_attn.convert._transformers_config import ModelSpec, _positive_int
from keras_attn.convert.families import _shared

MODEL_TYPE = "phi3"
ARCHITECTURES = ("Phi3ForCausalLM", "Phi3Model")  # transformers' classes (`architectures`)
_ORIGINAL_DEFAULT = 4096  # Phi3Config's original_max_position_embeddings
FIELDS = {
    "read": _shared.CORE_FIELDS + ("hidden_act", "rms_norm_eps", "sliding_window",
                                   "original_max_position_embeddings", "partial_rotary_factor"),
    "neutral": {},
    "ignored": {"resid_pdrop": "dropout while training only (inference: identity)",
                "embd_pdrop": "dropout while training only (inference: identity)"},
}


# transformers 5.24's defaults for fields a config.json may leave out, where they differ
# from what `_shared.core` assumes (tests/convert/test_config_defaults.py compares).
_DEFAULTS = {"rms_norm_eps": 1e-5}


def spec(config):
    config = {**_DEFAULTS, **config}
    core = _shared.core(config, tie_default=False)
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if not isinstance(params, Mapping):
        _shared.refuse("rope_parameters" if config.get("rope_parameters") else "rope_scaling",
                       params, "a dict of RoPE parameters is expected")
    where = "rope_parameters" if config.get("rope_parameters") else "rope_scaling"
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", "longrope", "su", "yarn"):
        _shared.refuse(f"{where}['rope_type']", rope_type,
                       "Phi-3's modeling takes the default RoPE or longrope")
    original = _ORIGINAL_DEFAULT
    if config.get("original_max_position_embeddings") is not None:
        original = _positive_int(config, "original_max_position_embeddings")
    if rope_type != "default":  # Phi3Config's rules: one type, the top-level context length
        params = {key: value for key, value in params.items() if key != "type"}
        params.update(rope_type="longrope", original_max_position_embeddings=original)
        config = {**config, where: params}
    window = _shared.window_of(config)
    return ModelSpec(
        **core, qkv_bias=False, output_bias=False, mlp_bias=False, qk_norm=False,
        final_logit_soft_cap=None,
        layers=_shared.layer_specs(core["num_layers"], _shared.check_rotary_width(
                                       _shared.rope_of(config, partial_rotary=True,
                                                       longrope=True),
                                       core["head_dim"], where),
                                   windows=[window] * core["num_layers"]))


def canonical_state_dict(entries, spec):
    """`qkv_proj` into `q_proj`, `k_proj`, `v_proj`; `gate_up_proj` into `gate_proj`,
    `up_proj` (as transformers' `qkv[..., :H*d]`, ... and `chunk(2)` split them)."""
    H, H_kv, d, F = spec.num_heads, spec.num_key_value_heads, spec.head_dim, spec.intermediate_dim
    for key in [k for k in entries if isinstance(k, str)]:
        if key.endswith("self_attn.qkv_proj.weight"):
            prefix = key[:-len("qkv_proj.weight")]
            part = _common.to_numpy(entries.pop(key), f"state_dict entry {key!r}")
            sizes = (H * d, H_kv * d, H_kv * d)
            _check_rows(key, part, sizes, f"num_attention_heads={H}, num_key_value_heads={H_kv}, "
                        f"head_dim={d} (H * d + 2 * H_kv * d = {sum(sizes)})")
            q, k, v = np.split(part, np.cumsum(sizes)[:-1], axis=0)
            entries.update({prefix + "q_proj.weight": q, prefix + "k_proj.weight": k,
                            prefix + "v_proj.weight": v})
    return _shared.split_gate_up(entries, F)


def _check_rows(key, array, sizes, fields):
    if array.ndim != 2 or array.shape[0] != sum(sizes):
        raise ValueError(
            f"The config and the weights disagree: {fields} give {sum(sizes)} rows for "
            f"state_dict entry {key!r}, which has shape {_common.shape_text(array.shape)}.")


def checkpoint_state_dict(entries, spec):
    """The inverse of `canonical_state_dict` (for writing a checkpoint): `q_proj`, `k_proj`,
    `v_proj` fused back into `qkv_proj` and `gate_proj`, `up_proj` into `gate_up_proj`, rows
    in the order transformers splits them."""
    fused = {}
    for key, value in entries.items():
        for parts, into in ((("q_proj", "k_proj", "v_proj"), "qkv_proj"),
                            (("gate_proj", "up_proj"), "gate_up_proj")):
            if key.endswith(f".{parts[0]}.weight"):
                prefix = key[:-len(f"{parts[0]}.weight")]
                fused[prefix + into + ".weight"] = np.concatenate(
                    [entries[f"{prefix}{part}.weight"] for part in parts], axis=0)
                break
            if any(key.endswith(f".{part}.weight") for part in parts[1:]):
                break
        else:
            fused[key] = value
    return fused
