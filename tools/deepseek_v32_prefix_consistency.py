"""Is transformers' DeepSeek V3.2 (DSA: indexer + top-k sparse attention) prefix-consistent?

A causal LM's logits at the first P positions must not change when tokens are appended.
This builds a tiny `DeepseekV32ForCausalLM` (random weights, std 0.35, eager attention,
float32), and prints the largest relative change of the earlier logits over every prefix,
for a few `index_topk`, with transformers' ReLU and with a leaky ReLU in the indexer (no
exact ties at 0). Why `keras_attn.convert` refuses `model_type="deepseek_v32"`
(`keras_attn.convert.families.REFUSED`).

    /work/venv-dev/bin/python tools/deepseek_v32_prefix_consistency.py
"""

import torch
import torch.nn.functional as F
from transformers import DeepseekV32Config, DeepseekV32ForCausalLM
from transformers.models.deepseek_v32 import modeling_deepseek_v32

RELU = F.relu


def worst_change(index_topk, length=16, seed=0):
    torch.manual_seed(seed)
    config = DeepseekV32Config(
        vocab_size=64, hidden_size=32, intermediate_size=32, moe_intermediate_size=16,
        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4,
        n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
        first_k_dense_replace=2, kv_lora_rank=8, q_lora_rank=12, qk_rope_head_dim=4,
        qk_nope_head_dim=6, v_head_dim=5, head_dim=4, index_topk=index_topk, index_head_dim=8,
        index_n_heads=2, attn_implementation="eager")
    model = DeepseekV32ForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * 0.35 + (1.0 if "norm" in name else 0.0))
        ids = torch.randint(0, 64, (1, length))
        full = model(ids, use_cache=False).logits[0]
        worst = 0.0
        for P in range(1, length):
            prefix = model(ids[:, :P], use_cache=False).logits[0]
            worst = max(worst, float((prefix - full[:P]).abs().max() / full[:P].abs().max()))
    return worst


def main():
    for label, relu in (("relu (transformers)", RELU),
                        ("leaky relu 1e-3 (no exact ties)",
                         lambda x: torch.where(x > 0, x, 1e-3 * x))):
        modeling_deepseek_v32.F.relu = relu  # the indexer's `F.relu(scores)`
        try:
            for topk in (2, 4, 8, 64):
                print(f"{label:32s} index_topk={topk:3d} (T=16): earlier logits change by "
                      f"{worst_change(topk):.3g} relative")
        finally:
            modeling_deepseek_v32.F.relu = RELU


if __name__ == "__main__":
    main()
