"""Write tests/assets/transformers4/configs_<version>.json: the same three models (Llama 3's
RoPE, Gemma 2, Phi-3's longrope) as the installed transformers serialises their configs
(`to_dict()`: 4.x writes RoPE as `rope_theta` / `rope_scaling` and its PretrainedConfig's
generation defaults and legacy flags; 5.x one `rope_parameters`), for
tests/convert/test_transformers4_configs.py. Run it under transformers 4.45.2 and 5.x:

    python tools/make_transformers4_configs.py
"""

import json
import pathlib
import warnings

import transformers

OUT = pathlib.Path(__file__).parent.parent / "tests" / "assets" / "transformers4"
COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
FACTORS = {"short_factor": [1.0] * 8, "long_factor": [2.0] * 8}


def configs(version_4):
    """{family: the installed transformers' to_dict()} of the three models."""
    if version_4:
        llama = dict(rope_theta=5e5, rope_scaling=LLAMA3)
        phi3 = dict(rope_scaling={"type": "longrope", **FACTORS})  # 4.45 reads `type`
    else:
        llama = dict(rope_parameters={"rope_theta": 5e5, **LLAMA3})
        phi3 = dict(rope_parameters={"rope_type": "longrope", "rope_theta": 1e4, **FACTORS})
    out = {
        "llama": transformers.LlamaConfig(**COMMON, **llama, architectures=["LlamaForCausalLM"]),
        "gemma2": transformers.Gemma2Config(**COMMON, head_dim=16, sliding_window=6,
                                            query_pre_attn_scalar=24,
                                            architectures=["Gemma2ForCausalLM"]),
        "phi3": transformers.Phi3Config(**COMMON, **phi3, original_max_position_embeddings=16,
                                        architectures=["Phi3ForCausalLM"]),
    }
    out = {name: config.to_dict() for name, config in out.items()}
    for config in out.values():
        config.pop("_name_or_path", None)
    return out


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    transformers.logging.set_verbosity_error()
    version = transformers.__version__
    path = OUT / f"configs_{version}.json"
    path.write_text(json.dumps(configs(int(version.split(".")[0]) < 5), indent=1,
                               sort_keys=True) + "\n")
    print(path)
