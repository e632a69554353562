"""Write tests/assets/pretrained/<case>/: tiny checkpoint folders written by transformers' `save_pretrained`.

Run in the torch environment (it needs torch and transformers), from the repository root:

    KERAS_BACKEND=torch python tools/make_pretrained_fixtures.py

Per case (`CASES` below: a family of tests/family_cases.py in its small shape, how it is
saved): the folder `save_pretrained` writes (`config.json`, `model.safetensors` or the
shards and `model.safetensors.index.json`; `generation_config.json` dropped) and
`reference.npz` (arrays only) with the token ids, transformers' float32 logits over them
and the 16 tokens of its greedy `generate`. The bfloat16 case rounds the float32 model's
parameters to bfloat16 first, takes the reference from that float32 model (its RoPE
buffers stay float32), then saves a bfloat16 copy: the file holds exactly the weights the
reference ran with. tests/convert/test_pretrained.py reads them on every backend, without
torch. All the folders together (27, one per model type) stay under 1.5 MB.
"""

import copy
import os
import shutil
import sys

os.environ.setdefault("KERAS_BACKEND", "torch")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from tests import family_cases as fc  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                   "tests", "assets", "pretrained")
# folder name: (family case, torch dtype saved, max_shard_size)
CASES = {
    "llama": ("llama", torch.float32, "5GB"),
    "phi3": ("phi3", torch.float32, "5GB"),  # fused qkv_proj / gate_up_proj
    "starcoder2": ("starcoder2", torch.float32, "5GB"),  # LayerNorm, biases, c_fc / c_proj
    "gemma3_text_sharded": ("gemma3_text", torch.float32, "20KB"),  # two shards and the index
    "qwen2_bfloat16": ("qwen2", torch.bfloat16, "8KB"),  # bfloat16, sharded too
    # Experts written one module each (block_sparse_moe.experts.{e}.w1/w2/w3), as the Hub
    # holds them; and Qwen3-MoE's layout (mlp.experts.{e}.gate_proj/...), DeepSeek V3's too.
    "mixtral_sharded": ("mixtral", torch.float32, "20KB"),
    "qwen3_moe": ("qwen3_moe", torch.float32, "5GB"),
    # Issue 36: every other model type the converters read, in its small case.
    "mistral": ("mistral", torch.float32, "5GB"),
    "qwen3": ("qwen3", torch.float32, "5GB"),
    "gemma2_bfloat16": ("gemma2", torch.bfloat16, "5GB"),
    "gemma": ("gemma", torch.float32, "5GB"),
    "granite": ("granite", torch.float32, "5GB"),
    "ministral": ("ministral", torch.float32, "5GB"),
    "smollm3": ("smollm3", torch.float32, "5GB"),
    "glm4": ("glm4", torch.float32, "5GB"),  # fused gate_up_proj
    "ministral3": ("ministral3", torch.float32, "5GB"),
    "gpt_oss_sharded": ("gpt_oss", torch.float32, "20KB"),
    # Gemma 4's 26B-A4B-style variant: its attention (k = v, proportional RoPE, v_norm,
    # the layer scalars) and the dense MLP beside the routed experts.
    "gemma4_text_moe": ("gemma4_text_moe", torch.float32, "5GB"),
    "deepseek_v3_sharded": ("deepseek_v3", torch.float32, "20KB"),
    "olmo2": ("olmo2", torch.float32, "5GB"),
    "olmo3_bfloat16": ("olmo3", torch.bfloat16, "5GB"),
    "exaone4": ("exaone4", torch.float32, "5GB"),
    "cohere2_sharded": ("cohere2", torch.float32, "10KB"),
    "gpt2": ("gpt2", torch.float32, "5GB"),  # Conv1D weights, fused c_attn
    "qwen3_5_text": ("qwen3_5_text", torch.float32, "5GB"),
    "qwen3_next_bfloat16": ("qwen3_next", torch.bfloat16, "20KB"),  # sharded too
    "llama4_text_bfloat16": ("llama4_text", torch.bfloat16, "5GB"),
}


def write(folder, case, dtype, shard_size):
    model = fc.build_hf(case, small=True)
    if dtype == torch.bfloat16:
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.copy_(parameter.bfloat16().float())
    ids = fc.token_ids(case, small=True)
    logits, tokens, margin = fc.hf_reference(model, ids)
    path = os.path.join(OUT, folder)
    shutil.rmtree(path, ignore_errors=True)
    copy.deepcopy(model).to(dtype).save_pretrained(path, max_shard_size=shard_size)
    os.remove(os.path.join(path, "generation_config.json"))
    np.savez(os.path.join(path, "reference.npz"), token_ids=ids, logits=logits.astype("float32"),
             tokens=tokens, margin=np.float32(margin), prompt_length=np.int32(fc.P))
    size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    print(f"{folder}: {sorted(os.listdir(path))}, {size // 1024} KB, margin {margin:.3g}")


def main():
    for folder in sys.argv[1:] or CASES:
        write(folder, *CASES[folder])


if __name__ == "__main__":
    main()
