"""Building tests' transformers models on the installed transformers, 4.45 to 5.x.

tests/family_cases.py (and the converter tests that build a family's class directly)
go through these: transformers 4 takes RoPE as `rope_theta` / `rope_scaling` where 5
takes `rope_parameters` (`as_transformers_4`), and what the installed version lacks or
computes otherwise is a `pytest.skip` naming it (`installed_transformers_lacks`,
`skip_without`), never a blanket skip. Imports transformers inside its functions only.
"""


def skip_without(class_name):
    """`pytest.skip`, naming the installed transformers, when it has no `class_name` (a
    family added later); the class otherwise."""
    import transformers

    cls = getattr(transformers, class_name, None)
    if cls is None:
        import pytest

        pytest.skip(f"transformers {transformers.__version__} has no {class_name} (the "
                    "family came later)")
    return cls


def transformers_4():
    """Whether the installed transformers is a 4.x (4.45 or later; imported only here, by
    the tests that build transformers models)."""
    import transformers

    return int(transformers.__version__.split(".")[0]) < 5


def installed_transformers_lacks(config_class, kwargs, common=()):
    """Why the installed transformers cannot build `config_class(**kwargs)` as transformers 5
    would (the class or a field the kwargs set is missing: a family or an option added
    after that version; or 4.x computes it otherwise), or None. `common`: kwargs every case
    passes, which a class may store unread."""
    import inspect

    import transformers

    where = f"transformers {transformers.__version__}"
    cls = getattr(transformers, config_class, None)
    if cls is None:
        return f"{where} has no {config_class} (the family came later)"
    if transformers_4():
        # A field the class neither takes nor maps would be stored and not read (silently),
        # unless it holds what the class derives anyway (Phi-3's head_dim = D / H in 4.45).
        accepted = (set(inspect.signature(cls.__init__).parameters)
                    | set(getattr(cls, "attribute_map", {}))
                    | set(transformers.PretrainedConfig().to_dict()))
        derived = {"head_dim": kwargs["hidden_size"] // kwargs["num_attention_heads"]}
        missing = sorted(k for k in set(kwargs) - accepted - set(common)
                         if k not in derived or kwargs[k] != derived[k])
        if missing:
            return f"{where}'s {config_class} has no {', '.join(missing)}"
        if kwargs.get("sliding_window") is not None and not _eager_attention_slides(config_class):
            return (f"{where}'s eager {config_class[:-6]} attention ignores sliding_window "
                    "(only its flash-attention path slides)")
        rope = kwargs.get("rope_scaling") or {}
        source = inspect.getsource(transformers.modeling_rope_utils._compute_yarn_parameters)
        if rope.get("rope_type") == "yarn" and "original_max_position_embeddings" in rope and (
                "original_max_position_embeddings" not in source):
            return (f"{where}'s yarn takes max_position_embeddings as the original length "
                    "and ignores rope_scaling['original_max_position_embeddings'], which "
                    "transformers 5 (and keras_attn) read")
    return None


def _eager_attention_slides(config_class):
    """Whether the installed transformers 4.x applies the window of `config_class`'s family in
    eager attention: its causal mask (`<Family>Model._update_causal_mask`) or its attention
    (`<Family>Attention.forward`) reads `sliding_window` (4.45: Mistral's mask and Gemma 2's
    attention do; Qwen 2's, Phi-3's, Starcoder 2's and Mixtral's slide under flash
    attention only)."""
    import importlib
    import inspect

    import transformers

    prefix = config_class[:-len("Config")]
    model_type = getattr(transformers, config_class).model_type
    module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    parts = [getattr(getattr(module, prefix + "Model", None), "_update_causal_mask", None),
             getattr(getattr(module, prefix + "Attention", None), "forward", None)]
    return any(part is not None and "sliding_window" in inspect.getsource(part)
               for part in parts)


def as_transformers_4(kwargs):
    """Case kwargs as transformers 4 takes them: RoPE's as `rope_theta` and `rope_scaling`
    (5 took one `rope_parameters`; Phi-3's longrope under `type`, as 4.45 reads it)."""
    kwargs = dict(kwargs)
    params = kwargs.pop("rope_parameters", None)
    if params is not None:
        params = dict(params)
        if "rope_theta" not in params:  # per layer type (Gemma 3, OLMo 3): no 4.x form
            return None
        kwargs["rope_theta"] = params.pop("rope_theta")
        kind = params.pop("rope_type", "default")
        if kind != "default" or params:
            kwargs["rope_scaling"] = {"type" if kind == "longrope" else "rope_type": kind,
                                      **params}
    return kwargs
