"""A config.json that leaves a field out reads as transformers reads it (issue 38).

transformers fills a missing field with its config class's default, which is not always
what a generic reading assumes: MistralConfig's `sliding_window` is 4096 (read as no
window before: 0.5 off at T=4200), Gemma 2/3's `head_dim` 256 (not D / H), Mixtral's and
SmolLM3's `rope_theta` 1e6 and 2e6, Granite's untied and SmolLM3's tied head... For every
registered family: the class's default config with one field left out, read by
`read_config` directly and through transformers (`cls(**rest).to_dict()`), gives the same
spec, or is refused (by name). Needs transformers (the torch env).
"""

import dataclasses
import warnings

import pytest

from keras_attn.convert import _transformers_config
from keras_attn.convert.families import model_types

transformers = pytest.importorskip("transformers")


def _spec(config):
    try:
        return dataclasses.asdict(_transformers_config.read_config(config))
    except ValueError:
        return None  # refused: the converter's answer is "no", never a wrong spec


def _as_transformers_reads_it(cls, model_type, config):
    fields = {k: v for k, v in config.items() if k != "model_type"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {**cls(**fields).to_dict(), "model_type": model_type}


def _variants(full):
    """`full` with one field left out, each field in turn; and Gemma 3's and Cohere 2's
    private `_sliding_window_pattern` without `layer_types` (transformers ignores it)."""
    for field in full:
        if field != "model_type":
            yield f"without {field}", {k: v for k, v in full.items() if k != field}
    if "layer_types" in full:
        rest = {k: v for k, v in full.items() if k != "layer_types"}
        yield "_sliding_window_pattern=2", {**rest, "_sliding_window_pattern": 2}


@pytest.mark.parametrize("model_type", model_types())
def test_a_field_left_out_reads_as_transformers_default(model_type):
    transformers.logging.set_verbosity_error()
    if model_type not in transformers.models.auto.configuration_auto.CONFIG_MAPPING_NAMES:
        pytest.skip(f"transformers {transformers.__version__} has no {model_type!r} config "
                    "(the family came later)")
    cls = type(transformers.AutoConfig.for_model(model_type))
    full = {**cls().to_dict(), "model_type": model_type}
    compared, wrong = 0, []
    for what, config in _variants(full):
        ours = _spec(config)
        if ours is None:
            continue
        theirs = _spec(_as_transformers_reads_it(cls, model_type, config))
        compared += 1
        if ours != theirs:
            fields = [k for k in ours if theirs is None or ours[k] != theirs[k]]
            wrong.append(f"{what}: {fields}")
    assert not wrong, f"{model_type} reads a config differently from transformers: {wrong}"
    # The default config itself converts (or the family refuses it by name; a
    # mixture-of-experts family before its converter lands).
    assert compared > 0 or _spec(full) is None
