"""The entries of a transformers mixture of experts beyond its routed experts: the shared
expert and the router's correction bias (DeepSeek V3's `DeepseekV3MoE`), onto
`keras_attn.MixtureOfExperts`' `shared_*` kernels and `router_correction_bias`.

Read only where the layer has them (a shared expert: `shared_intermediate_dim`; the bias:
`routing="sigmoid_group_topk"`); an entry the layer has no weight for is left unread, so the
converter's `check_all_used` refuses it by name. A torch `Linear` weight `(out, in)` is the
Keras kernel transposed.

| transformers entry (under `model.layers.{i}.`) | `MixtureOfExperts` weight    | shape    |
|------------------------------------------------|------------------------------|----------|
| `mlp.shared_experts.gate_proj.weight` `(S, D)` | `shared_gate_kernel`         | `(D, S)` |
| `mlp.shared_experts.up_proj.weight` `(S, D)`   | `shared_intermediate_kernel` | `(D, S)` |
| `mlp.shared_experts.down_proj.weight` `(D, S)` | `shared_output_kernel`       | `(S, D)` |
| `mlp.shared_expert_gate.weight` `(1, D)`       | `shared_expert_gate_kernel`  | `(D, 1)` |
| `mlp.gate.e_score_correction_bias` `(E,)`      | `router_correction_bias`     | `(E,)`   |
"""

__all__ = ["shared_experts_plan"]

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
                 f"moe_intermediate_size), hidden_size={D}")
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
