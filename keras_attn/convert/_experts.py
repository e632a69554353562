"""The entries of a transformers mixture of experts onto `keras_attn.MixtureOfExperts`'
weights: the router and the routed experts (`experts_plan`: transformers 5's fused layout,
with gpt-oss's biases), and what lies beyond them (`shared_experts_plan`: the shared
expert and the router's correction bias of DeepSeek V3's `DeepseekV3MoE`), onto the
`shared_*` kernels and `router_correction_bias`.

Read only where the layer has them (a shared expert: `shared_intermediate_dim`; the bias:
`routing="sigmoid_group_topk"`); an entry the layer has no weight for is left unread, so the
converter's `check_all_used` refuses it by name. A torch `Linear` weight `(out, in)` is the
Keras kernel transposed.

| transformers entry (under `model.layers.{i}.`) | `MixtureOfExperts` weight    | shape    |
|------------------------------------------------|------------------------------|----------|
| `mlp.shared_experts.gate_proj.weight` `(S, D)` | `shared_gate_kernel`         | `(D, S)`  |
| `mlp.shared_experts.up_proj.weight` `(S, D)`   | `shared_intermediate_kernel` | `(D, S)`  |
| `mlp.shared_experts.down_proj.weight` `(D, S)` | `shared_output_kernel`       | `(S, D)`  |
| `mlp.shared_expert_gate.weight` `(1, D)`       | `shared_expert_gate_kernel`  | `(D, 1)`  |
| `mlp.gate.e_score_correction_bias` `(E,)`      | `router_correction_bias`     | `(E,)`    |

Gemma 4's (`enable_moe_block`, `parallel_experts_plan`) onto a `ParallelMixtureOfExperts`:

| entry (under `model.layers.{i}.`)          | its weight                                  | shape       |
|--------------------------------------------|---------------------------------------------|-------------|
| `router.proj.weight` `(E, D)`              | `experts.router_kernel`                     | `(D, E)`    |
| `router.scale` `(D,)`                      | `experts.router_scale`                      | `(D,)`      |
| `router.per_expert_scale` `(E,)`           | `experts.per_expert_scale`                  | `(E,)`      |
| `experts.gate_up_proj` `(E, 2F, D)`        | `experts.gate_kernel`, `intermediate_kernel` | `(E, D, F)` |
| `experts.down_proj` `(E, D, F)`            | `experts.output_kernel`                     | `(E, F, D)` |
| `pre_feedforward_layernorm.weight` `(D,)`  | `dense_norm`                                | `(D,)`      |
| `post_feedforward_layernorm_1.weight`      | `post_dense_norm`                           | `(D,)`      |
| `pre_feedforward_layernorm_2.weight`       | `experts_norm`                              | `(D,)`      |
| `post_feedforward_layernorm_2.weight`      | `post_experts_norm`                         | `(D,)`      |

(`mlp.*` onto its `dense` as a dense block's MLP.)
"""

import re

import numpy as np

from keras_attn.convert import _common

__all__ = ["ExpertModules", "MIXTRAL_MODULES", "QWEN2_MOE_MODULES", "experts_plan",
           "join_expert_modules", "parallel_experts_plan", "per_expert_checkpoint",
           "shared_experts_plan", "split_expert_modules"]

# DeepSeek V3's name for the shared expert's MLP (`DeepseekV3MoE.shared_experts`).
SHARED_PREFIX = "mlp.shared_experts."


def shared_experts_plan(entries, spec, moe, sub, check, shared_prefix=SHARED_PREFIX):
    """`[(variable, array, what)]` for `moe`'s shared expert and correction bias, each entry
    under `sub` read by `check(entries, name, shape, letters, fields)` (its shape checked
    against the config's fields)."""
    D, E = spec.hidden_dim, moe.num_experts
    plan = []
    S = moe.shared_intermediate_dim
    if S:
        sizes = (f"the shared expert's S={S} (DeepSeek V3's n_shared_experts * "
                 f"moe_intermediate_size, Qwen3-Next's shared_expert_intermediate_size), "
                 f"hidden_size={D}")
        for part, kernel, shape, letters in (
                ("gate_proj", moe.shared_gate_kernel, (S, D), "(S, D)"),
                ("up_proj", moe.shared_intermediate_kernel, (S, D), "(S, D)"),
                ("down_proj", moe.shared_output_kernel, (D, S), "(D, S)")):
            name = f"{sub}{shared_prefix}{part}.weight"
            plan.append((kernel, check(entries, name, shape, letters, sizes).T,
                         f"{shared_prefix}{part} weight"))
        if moe.shared_expert_gate:
            w = check(entries, f"{sub}mlp.shared_expert_gate.weight", (1, D), "(1, D)",
                      f"hidden_size={D}")
            plan.append((moe.shared_expert_gate_kernel, w.T, "mlp.shared_expert_gate weight"))
    if getattr(moe, "router_correction_bias", None) is not None:
        bias = check(entries, f"{sub}mlp.gate.e_score_correction_bias", (E,), "(E,)",
                     f"n_routed_experts={E}")
        plan.append((moe.router_correction_bias, bias, "mlp.gate.e_score_correction_bias"))
    return plan


def experts_plan(entries, spec, moe, sub, check):
    """A mixture of experts' entries: transformers 5's `mlp.gate.weight` (E, D) and the
    fused `mlp.experts.gate_up_proj` (E, 2F, D, gate rows first) and `down_proj` (E, D, F),
    cross-checked against the config, onto `MixtureOfExperts`' kernels."""
    D, E, F = spec.hidden_dim, moe.num_experts, moe.intermediate_dim
    sizes = (f"num_experts={E}, the experts' F={F} (Mixtral's and gpt-oss's "
             f"intermediate_size, Qwen3-MoE's moe_intermediate_size), hidden_size={D}")
    router = check(entries, sub + "mlp.gate.weight", (E, D), "(E, D)", sizes)
    gate_up = check(entries, sub + "mlp.experts.gate_up_proj", (E, 2 * F, D), "(E, 2F, D)",
                    sizes)
    down = check(entries, sub + "mlp.experts.down_proj", (E, D, F), "(E, D, F)", sizes)
    return [(moe.router_kernel, router.T, "mlp.gate weight"),
            (moe.gate_kernel, gate_up[:, :F].transpose(0, 2, 1), "mlp.experts.gate_up_proj"),
            (moe.intermediate_kernel, gate_up[:, F:].transpose(0, 2, 1),
             "mlp.experts.gate_up_proj"),
            (moe.output_kernel, down.transpose(0, 2, 1), "mlp.experts.down_proj")
            ] + _expert_biases_plan(entries, moe, sub, check, sizes)


def _expert_biases_plan(entries, moe, sub, check, sizes):
    """The router's bias `mlp.gate.bias` (E,) where `use_router_bias`, the experts'
    `gate_up_proj_bias` (E, 2F, `[gate; up]`) and `down_proj_bias` (E, D) where
    `use_expert_bias` (gpt-oss, in this layout after its `canonical_state_dict`); an
    entry the layer has no weight for is refused."""
    D, E, F = moe.output_kernel.shape[-1], moe.num_experts, moe.intermediate_dim
    plan = []
    parts = [(moe.use_router_bias, "mlp.gate.bias", "use_router_bias")]
    parts += [(moe.use_expert_bias, f"mlp.experts.{n}", "use_expert_bias")
              for n in ("gate_up_proj_bias", "down_proj_bias")]
    for used, name, flag in parts:
        if not used:
            if entries.has(sub + name):
                raise ValueError(f"The config and the weights disagree: the family's experts "
                                 f"have no such bias ({flag}=False), but state_dict has "
                                 f"{entries.key(sub + name)}.")
            continue
        if name == "mlp.gate.bias":
            plan.append((moe.router_bias, check(entries, sub + name, (E,), "(E,)", sizes),
                         "mlp.gate bias"))
        elif name.endswith("gate_up_proj_bias"):
            b = check(entries, sub + name, (E, 2 * F), "(E, 2F)", sizes)
            plan += [(moe.gate_bias, b[:, :F], name), (moe.intermediate_bias, b[:, F:], name)]
        else:
            plan.append((moe.output_bias, check(entries, sub + name, (E, D), "(E, D)", sizes),
                         name))
    return plan


# --- The checkpoint layout: one module per expert ------------------------------------
#
# transformers 5 holds a mixture's experts fused (`mlp.experts.gate_up_proj` (E, 2F, D),
# `down_proj` (E, D, F)), but its `save_pretrained` writes, and the Hub's checkpoints hold,
# one module per expert (transformers' `conversion_mapping.py`: "mixtral", and "qwen2_moe"
# for Qwen3-MoE, Qwen3-Next and DeepSeek V3), which is what serving engines read. Before
# issue 36's fix the readers took only the fused names: a real Mixtral folder was refused
# ("state_dict is missing 'model.layers.0.mlp.gate.weight'").


class ExpertModules:
    """How a family's checkpoint names its experts' modules: `block` (the mixture's module
    under `model.layers.{i}.`: Mixtral's `block_sparse_moe.`, `mlp.` elsewhere) and the
    expert's `gate`, `up` and `down` projections' names."""

    def __init__(self, block, gate, up, down):
        self.block, self.gate, self.up, self.down = block, gate, up, down
        parts = "|".join(map(re.escape, (gate, up, down)))
        self.pattern = re.compile(rf"^(?P<layer>.*?){re.escape(block)}experts\."
                                  rf"(?P<expert>\d+)\.(?P<part>{parts})\.weight$")


MIXTRAL_MODULES = ExpertModules("block_sparse_moe.", "w1", "w3", "w2")
QWEN2_MOE_MODULES = ExpertModules("mlp.", "gate_proj", "up_proj", "down_proj")


def join_expert_modules(entries, modules):
    """`entries` with each layer's per-expert modules (`modules`) stacked into the fused
    entries the readers map: `mlp.experts.gate_up_proj` (E, 2F, D: every expert's gate rows,
    then its up rows) and `mlp.experts.down_proj` (E, D, F); Mixtral's
    `block_sparse_moe.gate` renamed `mlp.gate`. A layer's experts must be numbered 0 .. E-1
    with all three projections, of one shape, and not also given fused (a `ValueError`
    naming the entry otherwise). Entries in the fused layout pass unchanged."""
    found = {}
    for key in [k for k in entries if isinstance(k, str)]:
        match = modules.pattern.match(key)
        if match:
            layer = match["layer"]
            found.setdefault(layer, {})[(int(match["expert"]), match["part"])] = key
        elif modules.block != "mlp." and f".{modules.block}gate." in f".{key}":
            entries[key.replace(modules.block + "gate.", "mlp.gate.")] = entries.pop(key)
    for layer, keys in found.items():
        count = 1 + max(expert for expert, _ in keys)
        for expert in range(count):
            for part in (modules.gate, modules.up, modules.down):
                if (expert, part) not in keys:
                    raise ValueError(
                        f"The checkpoint's experts of '{layer}' are incomplete: state_dict "
                        f"has expert modules up to {count - 1} but no "
                        f"'{layer}{modules.block}experts.{expert}.{part}.weight'.")
        for fused in ("gate_up_proj", "down_proj"):
            if f"{layer}mlp.experts.{fused}" in entries:
                raise ValueError(
                    f"state_dict holds the experts of '{layer}' twice: per expert "
                    f"('{keys[(0, modules.gate)]}') and fused ('{layer}mlp.experts.{fused}').")

        gate, up, down = (_stacked(entries, keys, count, part, f"{layer}{modules.block}")
                          for part in (modules.gate, modules.up, modules.down))
        if gate.shape != up.shape:
            raise ValueError(f"The experts of '{layer}': {modules.gate} {gate.shape[1:]} and "
                             f"{modules.up} {up.shape[1:]} differ in shape.")
        entries[f"{layer}mlp.experts.gate_up_proj"] = np.concatenate([gate, up], axis=1)
        entries[f"{layer}mlp.experts.down_proj"] = down
    return entries


def _stacked(entries, keys, count, part, block):
    """The `count` experts' `part` weights popped from `entries`, stacked (E, ., .)."""
    arrays = [_common.to_numpy(entries.pop(keys[(e, part)]), keys[(e, part)])
              for e in range(count)]
    if len({a.shape for a in arrays}) != 1:
        raise ValueError(f"The experts differ in shape: '{block}experts.*.{part}.weight' has "
                         f"shapes {sorted({a.shape for a in arrays})}.")
    return np.stack(arrays)


def split_expert_modules(tensors, modules):
    """The inverse of `join_expert_modules` (`CausalLM.save_pretrained`): each fused
    `mlp.experts.gate_up_proj` / `down_proj` back into one module per expert, as
    transformers' `save_pretrained` writes them, and Mixtral's `mlp.gate` back to
    `block_sparse_moe.gate`."""
    out = {}
    for key, value in tensors.items():
        if key.endswith("mlp.experts.gate_up_proj"):
            layer = key[:-len("mlp.experts.gate_up_proj")]
            value = np.asarray(value)
            F = value.shape[1] // 2
            for e in range(value.shape[0]):
                base = f"{layer}{modules.block}experts.{e}."
                out[f"{base}{modules.gate}.weight"] = np.ascontiguousarray(value[e, :F])
                out[f"{base}{modules.up}.weight"] = np.ascontiguousarray(value[e, F:])
        elif key.endswith("mlp.experts.down_proj"):
            layer = key[:-len("mlp.experts.down_proj")]
            for e, array in enumerate(np.asarray(value)):
                out[f"{layer}{modules.block}experts.{e}.{modules.down}.weight"] = (
                    np.ascontiguousarray(array))
        elif modules.block != "mlp." and ".mlp.gate." in key:
            out[key.replace(".mlp.gate.", f".{modules.block}gate.")] = value
        else:
            out[key] = value
    return out
def parallel_experts_plan(entries, spec, ff, sub, check, norm_plan):
    """Gemma 4's router, experts and four norms (the table above) onto `ff`, a
    `ParallelMixtureOfExperts` (its dense MLP is planned as a dense block's);
    `norm_plan(norm, name)` plans one RMSNorm."""
    moe = ff.experts
    D, E, F = spec.hidden_dim, moe.num_experts, moe.intermediate_dim
    sizes = f"num_experts={E}, moe_intermediate_size={F}, hidden_size={D}"
    router = check(entries, sub + "router.proj.weight", (E, D), "(E, D)", sizes)
    scale = check(entries, sub + "router.scale", (D,), "(D,)", f"hidden_size={D}")
    per_expert = check(entries, sub + "router.per_expert_scale", (E,), "(E,)",
                       f"num_experts={E}")
    gate_up = check(entries, sub + "experts.gate_up_proj", (E, 2 * F, D), "(E, 2F, D)", sizes)
    down = check(entries, sub + "experts.down_proj", (E, D, F), "(E, D, F)", sizes)
    plan = [(moe.router_kernel, router.T, "router.proj weight"),
            (moe.router_scale, scale, "router.scale"),
            (moe.per_expert_scale, per_expert, "router.per_expert_scale"),
            (moe.gate_kernel, gate_up[:, :F].transpose(0, 2, 1), "experts.gate_up_proj"),
            (moe.intermediate_kernel, gate_up[:, F:].transpose(0, 2, 1),
             "experts.gate_up_proj"),
            (moe.output_kernel, down.transpose(0, 2, 1), "experts.down_proj")]
    for name, norm in (("pre_feedforward_layernorm", ff.dense_norm),
                       ("post_feedforward_layernorm_1", ff.post_dense_norm),
                       ("pre_feedforward_layernorm_2", ff.experts_norm),
                       ("post_feedforward_layernorm_2", ff.post_experts_norm)):
        plan += norm_plan(norm, sub + name)
    return plan


def per_expert_checkpoint(modules):
    """A family's `(canonical_state_dict, checkpoint_state_dict)` (the registry's hooks) for
    a checkpoint that names its experts as `modules` does: the one module per expert that
    transformers' `save_pretrained` writes and the Hub holds, stacked into the fused entries
    the reader maps (fused entries pass unchanged), and split back when writing."""
    def canonical_state_dict(entries, spec):
        return join_expert_modules(entries, modules)

    def checkpoint_state_dict(tensors, spec):
        return split_expert_modules(tensors, modules)

    return canonical_state_dict, checkpoint_state_dict
