"""LoRA on a `CausalLM`'s projections: `CausalLM.enable_lora` (keras-hub's
`Backbone.enable_lora`, by name and meaning).

Every weight of the model is frozen, then Keras's own `enable_lora(rank)` runs on each
`Dense` / `EinsumDense` sublayer whose name is in `target_names` (its kernel stays frozen,
its low-rank `lora_kernel_a @ lora_kernel_b` trains). Keras's `kernel` property then
returns the merged kernel `kernel + (alpha / rank) * A @ B`: what the model computes,
what `CausalLM.save_pretrained` writes (keras_attn.convert.pretrained reads `kernel`) and
what a `.keras` file stores (Keras saves the merged kernel). The model's config keeps
`lora` (`{"rank": r, "target_names": [...]}`, only when enabled), so a reloaded model has
its LoRA again: the merged kernels as its frozen kernels and zero factors (Keras's
`Dense.load_own_variables`), predicting the same and ready to go on fine-tuning.
"""

from keras_attn._validation import check_positive_int

# keras-hub's default (its `default_lora_layer_names`): the query and value projections.
DEFAULT_TARGETS = ("query_dense", "value_dense")
# The projections of keras_attn's blocks: the attention's q/k/v/o, the feed-forward's.
PROJECTIONS = ("query_dense", "key_dense", "value_dense", "output_dense", "gate_dense",
               "intermediate_dense")


def enable_lora(model, rank, target_names=None):
    """Freeze `model`, then enable LoRA of `rank` on its sublayers named in `target_names`."""
    rank = check_positive_int("rank", rank)
    if target_names is None:
        target_names = DEFAULT_TARGETS
    if isinstance(target_names, str) or not all(
            isinstance(name, str) for name in target_names) or not target_names:
        raise ValueError("`target_names` must be None or a non-empty list of layer names "
                         f"(of {', '.join(PROJECTIONS)}). Received: target_names="
                         f"{target_names!r}")
    targets = [layer for layer in model._flatten_layers(include_self=False)
               if layer.name in target_names and callable(getattr(layer, "enable_lora", None))
               and layer.weights]
    found = {layer.name for layer in targets}
    missing = [name for name in target_names if name not in found]
    if missing:
        raise ValueError(
            f"`target_names` names no Dense or EinsumDense sublayer of the model: "
            f"{missing[0]!r} (the blocks' projections are {', '.join(PROJECTIONS)}). "
            f"Received: target_names={list(target_names)!r}")
    enabled = [layer.name for layer in targets if getattr(layer, "lora_enabled", False)]
    if enabled:
        raise ValueError(f"LoRA is enabled on {enabled[0]!r} already (once per model). "
                         f"Received: target_names={list(target_names)!r}")
    model.trainable = True
    for layer in model._flatten_layers(include_self=False):
        layer.trainable = False
    for layer in targets:
        layer.trainable = True
        layer.enable_lora(rank)
    model.lora = {"rank": rank, "target_names": list(target_names)}
    return targets


def enable_from_config(model, lora):
    """`enable_lora` from a saved config's `lora` entry."""
    if not isinstance(lora, dict) or set(lora) != {"rank", "target_names"}:
        raise ValueError('`lora` must be None or {"rank": int, "target_names": [names]} '
                         f"(CausalLM.enable_lora). Received: lora={lora!r}")
    enable_lora(model, lora["rank"], lora["target_names"])
