"""`model_type="gemma3_text"`: its fields and spec, read by the reader today's first six families
share (`keras_attn.convert._transformers_config.read_llama_like`)."""

from keras_attn.convert import _transformers_config as _config

MODEL_TYPE = "gemma3_text"
FIELDS = _config.FAMILIES[MODEL_TYPE]


def spec(config):
    return _config.read_llama_like(config, MODEL_TYPE)
