"""`keras_attn.convert.causal_lm_from_pretrained`: Hugging Face checkpoint folders in, without torch.

tests/assets/pretrained/<case>/ are folders written by transformers' `save_pretrained`
(tools/make_pretrained_fixtures.py, torch env), one for every model type the converters
read (27; `test_the_fixtures_are_small_and_complete` checks the set against
`families.model_types()`): some in bfloat16, some sharded with
`model.safetensors.index.json`, the MoE families with one module per expert as
transformers writes them (and the Hub holds them); each with `reference.npz`,
transformers' float32 logits and greedy tokens. They are read here on every backend with
no torch or transformers; a subprocess proves neither is imported. On JAX and TensorFlow
the greedy tokens are checked teacher-forced (the argmax at each stored position, one
forward pass) instead of by `generate`, which would compile a decoding loop per family.
The torch environment also writes a folder live.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_attn import CausalLM, convert
from keras_attn.convert import families, pretrained
from keras_attn.convert._transformers_config import read_config

from .. import family_cases as fc

# The `safetensors` extra (every backend environment of tox.ini installs it; min-deps not).
pytest.importorskip("safetensors")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.join(ROOT, "tests", "assets", "pretrained")
# folder -> the family case (tests/family_cases.py) whose ablation shows the test can fail
CASES = {"llama": "llama", "phi3": "phi3", "starcoder2": "starcoder2",
         "gemma3_text_sharded": "gemma3_text", "qwen2_bfloat16": "qwen2",
         # experts one module each, as the Hub holds them (Mixtral's block_sparse_moe names)
         "mixtral_sharded": "mixtral", "qwen3_moe": "qwen3_moe",
         # Issue 36: every other model type the converters read (bfloat16 / sharded some)
         "mistral": "mistral", "qwen3": "qwen3", "gemma2_bfloat16": "gemma2",
         "gemma": "gemma", "granite": "granite", "ministral": "ministral",
         "smollm3": "smollm3", "glm4": "glm4", "ministral3": "ministral3",
         "gpt_oss_sharded": "gpt_oss", "gemma4_text_moe": "gemma4_text_moe",
         "deepseek_v3_sharded": "deepseek_v3", "olmo2": "olmo2",
         "olmo3_bfloat16": "olmo3", "exaone4": "exaone4", "cohere2_sharded": "cohere2",
         "gpt2": "gpt2", "qwen3_5_text": "qwen3_5_text",
         "qwen3_next_bfloat16": "qwen3_next", "llama4_text_bfloat16": "llama4_text"}


def _reference(folder):
    with np.load(os.path.join(HERE, folder, "reference.npz"), allow_pickle=False) as stored:
        return {key: stored[key] for key in stored.files}


def test_the_fixtures_are_small_and_complete():
    assert sorted(os.listdir(HERE)) == sorted(CASES)
    # Every model type the converters read has a folder.
    types = {json.load(open(os.path.join(HERE, folder, "config.json")))["model_type"]
             for folder in CASES}
    assert types == set(families.model_types()), types
    # 27 folders of a few tens of KB each (the MoE ones up to 90): the repository's
    # checkout stays small.
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(HERE)
                for f in files)
    assert total < 1_500_000, total
    shards = sorted(os.listdir(os.path.join(HERE, "gemma3_text_sharded")))
    assert "model.safetensors.index.json" in shards and "model.safetensors" not in shards


@pytest.mark.parametrize("folder", sorted(CASES))
def test_checkpoint_reproduces_transformers(folder):
    stored = _reference(folder)
    # float32 for the bfloat16 checkpoints too: their reference ran in float32 on the
    # bfloat16-rounded weights.
    lm = convert.causal_lm_from_pretrained(os.path.join(HERE, folder), dtype="float32")
    ids = stored["token_ids"]
    error = fc.relative_error(keras.ops.convert_to_numpy(lm(ids)), stored["logits"])
    assert error <= fc.TOLERANCE, f"{folder}: relative error {error:.3g}"
    # The family's ablation moves the logits far past the tolerance: the test can fail.
    ablated = keras.ops.convert_to_numpy(fc.ablate(lm, CASES[folder])(ids))
    assert fc.relative_error(ablated, stored["logits"]) > 100 * fc.TOLERANCE
    P, expected = int(stored["prompt_length"]), stored["tokens"]
    if keras.backend.backend() in ("jax", "tensorflow"):
        # Teacher-forced greedy: one forward over transformers' P + 16 tokens, each next
        # token its argmax (the same statement as identical greedy tokens, without
        # compiling a generation loop per family: CI's time budget).
        logits = keras.ops.convert_to_numpy(lm(expected))
        np.testing.assert_array_equal(logits[:, P - 1:-1].argmax(-1), expected[:, P:])
        return
    tokens = keras.ops.convert_to_numpy(lm.generate(ids[:, :P], max_length=expected.shape[1]))
    np.testing.assert_array_equal(tokens, expected)


def test_bfloat16_checkpoint_keeps_its_dtype_and_exact_values():
    """Without `dtype=`, config.json's dtype (bfloat16); the words widened exactly."""
    folder = os.path.join(HERE, "qwen2_bfloat16")
    assert json.load(open(os.path.join(folder, "config.json")))["dtype"] == "bfloat16"
    lm = convert.causal_lm_from_transformers(pathlib.Path(folder))  # a PathLike, as well
    assert lm.dtype_policy.name == "bfloat16"
    assert keras.backend.standardize_dtype(lm.token_embedding.embeddings.dtype) == "bfloat16"
    tensor = pretrained.read_state_dict(folder)["model.embed_tokens.weight"]
    assert tensor.dtype == "BF16"
    widened = np.asarray(tensor)
    # Independent of the reader: the raw words at the header's offsets, as float32 bits.
    header, start = pretrained._header(tensor.file)
    begin, end = header["model.embed_tokens.weight"]["data_offsets"]
    raw = np.fromfile(tensor.file, "<u2", (end - begin) // 2, offset=start + begin)
    expected = (raw.astype("<u4") << 16).view("<f4").reshape(widened.shape)
    np.testing.assert_array_equal(widened, expected)
    assert np.abs(expected).max() > 0.5  # std-0.35 weights, not a zero tensor
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(keras.ops.cast(lm.token_embedding.embeddings, "float32")),
        expected)


NO_TORCH = r"""
import importlib.abc, os, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers"):
            raise ImportError(f"blocked: {name}")
        return None

sys.meta_path.insert(0, Block())
import keras, numpy as np
from keras_attn import convert
folder = os.path.join(sys.argv[1], "qwen2_bfloat16")  # two shards, bfloat16
lm = convert.causal_lm_from_pretrained(folder, dtype="float32")
stored = np.load(os.path.join(folder, "reference.npz"))
ids, expected, P = stored["token_ids"], stored["tokens"], int(stored["prompt_length"])
logits = keras.ops.convert_to_numpy(lm(ids))
error = float(np.abs(logits - stored["logits"]).max() / np.abs(stored["logits"]).max())
tokens = keras.ops.convert_to_numpy(lm.generate(ids[:, :P], max_length=expected.shape[1]))
same = bool((tokens == expected).all())
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers"))
print("ERROR", error, "TOKENS", same, "LOADED", loaded)
"""


def test_no_torch_is_imported():
    """A subprocess that cannot import torch or transformers reads the sharded bfloat16
    folder: transformers' logits within the tolerance, its greedy tokens, no torch module
    loaded. (The ablations of the test above show the stored logits tell a wrong model.)"""
    if keras.backend.backend() == "torch":
        pytest.skip("the torch backend imports torch; the jax, tensorflow and numpy "
                    "environments run this (tox's jax environment has no torch)")
    result = subprocess.run([sys.executable, "-c", NO_TORCH, HERE], capture_output=True,
                            text=True, env={**os.environ, "PYTHONPATH": ROOT}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    line = [line for line in result.stdout.splitlines() if line.startswith("ERROR")][-1]
    _, error, _, same, _, loaded = line.split(" ", 5)
    assert float(error) <= fc.TOLERANCE and same == "True" and loaded == "[]", line


def _copy(tmp_path, folder="gemma3_text_sharded"):
    target = tmp_path / folder
    shutil.copytree(os.path.join(HERE, folder), target)
    return target


def test_refusals_name_the_file(tmp_path):
    folder = _copy(tmp_path)
    with pytest.raises(ValueError, match=r"model-00002-of-00002.safetensors does not exist"):
        os.rename(folder / "model-00002-of-00002.safetensors", folder / "moved")
        convert.causal_lm_from_pretrained(folder)
    os.rename(folder / "moved", folder / "model-00002-of-00002.safetensors")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.layers.0.extra.weight"] = "model-00001-of-00002.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"model-00001-of-00002.safetensors lacks tensor "
                                         r"'model.layers.0.extra.weight'"):
        convert.causal_lm_from_pretrained(folder)
    os.remove(folder / "config.json")
    with pytest.raises(ValueError, match=r"config.json does not exist"):
        convert.causal_lm_from_pretrained(folder)
    with pytest.raises(ValueError, match=r"`path` must be a checkpoint folder.*Received: path="):
        convert.causal_lm_from_pretrained(str(tmp_path / "nowhere"))


def test_pickled_checkpoints_are_refused_unread(tmp_path):
    folder = _copy(tmp_path, "llama")
    os.remove(folder / "model.safetensors")
    # Not a pickle at all: were it unpickled, the error would be pickle's, not ours.
    (folder / "pytorch_model.bin").write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match=r"only pickled weights \(pytorch_model.bin\).*"
                                         r"unpickling runs arbitrary code"):
        convert.causal_lm_from_pretrained(folder)


@pytest.mark.parametrize("dtype", ["int32", "float33", 3])
def test_bad_dtype_is_refused(dtype):
    with pytest.raises(ValueError, match=rf"`dtype` must be .*Received: dtype={dtype!r}"):
        convert.causal_lm_from_pretrained(os.path.join(HERE, "llama"), dtype=dtype)


def test_a_string_without_a_folder_is_still_refused_by_the_module_converter():
    with pytest.raises(ValueError, match="must be a checkpoint folder"):
        convert.causal_lm_from_transformers("llama-tiny")


def test_save_pretrained_live_matches_the_reader(tmp_path):
    """Torch env: a folder transformers writes now (sharded, bfloat16) reads back exactly:
    what the fixtures hold is still what `save_pretrained` writes."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model = fc.build_hf("llama", small=True)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(parameter.bfloat16().float())
    ids = fc.token_ids("llama", small=True)
    logits, _, _ = fc.hf_reference(model, ids, generate=False)
    model.to(torch.bfloat16).save_pretrained(tmp_path, max_shard_size="10KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    lm = convert.causal_lm_from_pretrained(tmp_path, dtype="float32")
    assert isinstance(lm, CausalLM)
    error = fc.relative_error(keras.ops.convert_to_numpy(lm(ids)), logits)
    assert error <= fc.TOLERANCE, error


# --- Writing: CausalLM.save_pretrained / convert.causal_lm_to_pretrained ---------------

def _read_back(folder):
    """`{name: (safetensors dtype, raw bytes)}` of a folder, read independently of the
    reader's widening (the header's offsets, the file's bytes)."""
    out = {}
    for name, tensor in pretrained.read_state_dict(str(folder)).items():
        with open(tensor.file, "rb") as handle:
            handle.seek(tensor.begin)
            out[name] = (tensor.dtype, tensor.shape, handle.read(tensor.end - tensor.begin))
    return out


@pytest.mark.parametrize("folder", ["llama", "qwen2_bfloat16", "phi3", "starcoder2",
                                    "mixtral_sharded", "qwen3_moe"])
def test_folder_keras_folder_round_trip_is_bitwise(tmp_path, folder):
    """In the checkpoint's own dtype (float32; bfloat16 and sharded), every tensor written
    back has the bytes it was read with."""
    if keras.backend.backend() in ("jax", "tensorflow"):
        pytest.skip("numpy in, numpy out: torch and numpy run it (CI's time budget)")
    source = os.path.join(HERE, folder)
    lm = convert.causal_lm_from_pretrained(source)
    lm.save_pretrained(tmp_path / "out", max_shard_size="8KB")
    original, written = _read_back(source), _read_back(tmp_path / "out")
    assert sorted(written) == sorted(original)
    for name in original:
        assert written[name] == original[name], name
    config = json.load(open(tmp_path / "out" / "config.json"))
    assert config["model_type"] == json.load(open(os.path.join(source, "config.json")))[
        "model_type"]
    # Can fail: one weight changed in Keras changes one tensor's bytes.
    scale = lm.final_norm.weights[0]  # RMSNorm's scale, LayerNorm's gamma
    scale.assign(scale + 1.0)
    lm.save_pretrained(tmp_path / "changed")
    changed = _read_back(tmp_path / "changed")
    assert [n for n in original if changed[n] != original[n]] == ["model.norm.weight"]


def test_source_config_survives_keras_save_and_load(tmp_path):
    lm = convert.causal_lm_from_pretrained(os.path.join(HERE, "llama"))
    stored = json.load(open(os.path.join(HERE, "llama", "config.json")))
    assert lm.source_config == stored and lm.get_config()["source_config"] == stored
    lm.save(str(tmp_path / "llama.keras"))
    again = keras.saving.load_model(str(tmp_path / "llama.keras"))
    assert again.source_config == stored


def test_writing_refuses_what_it_cannot_write(tmp_path, monkeypatch):
    lm = convert.causal_lm_from_pretrained(os.path.join(HERE, "llama"))
    with pytest.raises(ValueError, match=r"`model_type` must be the source config's "
                                         r"\('llama'\). Received: model_type='qwen2'"):
        convert.causal_lm_to_pretrained(lm, tmp_path, model_type="qwen2")
    with pytest.raises(ValueError, match=r"Received: max_shard_size='lots'"):
        lm.save_pretrained(tmp_path, max_shard_size="lots")
    bare = CausalLM.from_config({**lm.get_config(), "source_config": None})
    with pytest.raises(ValueError, match=r"Received: source_config=None"):
        bare.save_pretrained(tmp_path)
    glm4 = convert.causal_lm_from_transformers(*_glm4_dict())
    # A family whose reader renames or splits its weights, without the inverse: refused.
    from keras_attn.convert.families import glm4 as glm4_family
    monkeypatch.delattr(glm4_family, "checkpoint_state_dict")
    with pytest.raises(ValueError, match=r"not written yet.*Received: model_type='glm4'"):
        glm4.save_pretrained(tmp_path)
    monkeypatch.undo()
    # A family not written yet (`_NOT_WRITTEN`, empty today): refused by name.
    monkeypatch.setattr(pretrained, "_NOT_WRITTEN", ("glm4",))
    with pytest.raises(ValueError, match=r"not written yet.*Received: model_type='glm4'"):
        glm4.save_pretrained(tmp_path)
    monkeypatch.undo()  # (a quantized model: test_lora_round_trip.py)
    assert not os.listdir(tmp_path)  # refused before anything is written


def test_cohere2_refuses_a_trained_layernorm_bias(tmp_path):
    """Cohere's LayerNorm has no bias: the zero bias the reader gives keras_attn's
    LayerNormalization is dropped when written, and refused by name once it is not zero."""
    config = {"model_type": "cohere2", "vocab_size": 32, "hidden_size": 16,
              "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
              "num_key_value_heads": 1, "head_dim": 8, "sliding_window": 4,
              "layer_types": ["full_attention"]}
    shapes = {"model.embed_tokens.weight": (32, 16), "model.norm.weight": (16,)}
    shapes.update({f"model.layers.0.{k}": v for k, v in {
        "self_attn.q_proj.weight": (16, 16), "self_attn.k_proj.weight": (8, 16),
        "self_attn.v_proj.weight": (8, 16), "self_attn.o_proj.weight": (16, 16),
        "mlp.gate_proj.weight": (32, 16), "mlp.up_proj.weight": (32, 16),
        "mlp.down_proj.weight": (16, 32), "input_layernorm.weight": (16,)}.items()})
    lm = convert.causal_lm_from_transformers(
        config, {k: np.ones(v, "float32") for k, v in shapes.items()})
    lm.save_pretrained(tmp_path / "zero")  # the zero biases dropped
    assert not [n for n in _saved_names(tmp_path / "zero") if n.endswith("bias")]
    beta = lm.final_norm.weights[1]
    beta.assign(beta + 0.5)
    with pytest.raises(ValueError, match=r"'model.norm.bias' is not zero.*Received: "
                                         r"max \|bias\|=0.5"):
        lm.save_pretrained(tmp_path / "trained")
    assert not (tmp_path / "trained").exists()


def _glm4_dict():
    """A tiny GLM-4 config dict and numpy state dict (its reader splits `gate_up_proj`)."""
    config = {"model_type": "glm4", "vocab_size": 32, "hidden_size": 16,
              "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
              "num_key_value_heads": 1, "head_dim": 8, "tie_word_embeddings": True}
    shapes = {"model.embed_tokens.weight": (32, 16), "model.norm.weight": (16,)}
    shapes.update({f"model.layers.0.{k}": v for k, v in {
        "self_attn.q_proj.weight": (16, 16), "self_attn.q_proj.bias": (16,),
        "self_attn.k_proj.weight": (8, 16), "self_attn.k_proj.bias": (8,),
        "self_attn.v_proj.weight": (8, 16), "self_attn.v_proj.bias": (8,),
        "self_attn.o_proj.weight": (16, 16), "mlp.gate_up_proj.weight": (64, 16),
        "mlp.down_proj.weight": (16, 32), "input_layernorm.weight": (16,),
        "post_attention_layernorm.weight": (16,), "post_self_attn_layernorm.weight": (16,),
        "post_mlp_layernorm.weight": (16,)}.items()})
    return config, {k: np.ones(v, "float32") for k, v in shapes.items()}


WRITTEN = ["llama", "gemma3_text", "qwen3", "granite", "phi3", "starcoder2", "olmo2",
           "exaone4", "mixtral", "qwen3_moe", "gpt_oss", "deepseek_v3", "qwen3_5_text",
           "qwen3_next", "llama4_text",
           # issue 36: inverses of their readers' renames and splits; Gemma 4's extra parts
           "glm4", "cohere2", "gpt2", "gemma4_text", "gemma4_text_e2b", "gemma4_text_moe"]


def _saved_names(folder):
    index = folder / "model.safetensors.index.json"
    if index.exists():
        return set(json.loads(index.read_text())["weight_map"])
    from safetensors import safe_open
    with safe_open(str(folder / "model.safetensors"), "np") as handle:
        return set(handle.keys())


@pytest.mark.parametrize("name", WRITTEN)
def test_the_folder_transformers_writes_is_read(tmp_path, name):
    """Torch env: the folder transformers' own `save_pretrained` writes (the Hub's layout:
    a mixture's experts one module each, which transformers 5 fuses only in memory) is
    read with the model's logits. Before issue 36's fix Mixtral, Qwen3-MoE, DeepSeek V3
    and Qwen3-Next were refused ("state_dict is missing '...mlp.gate.weight'")."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    hf = fc.build_hf(name, small=True)
    hf.save_pretrained(tmp_path, max_shard_size="20KB")
    lm = convert.causal_lm_from_pretrained(tmp_path, dtype="float32")
    ids = fc.token_ids(name, small=True)
    with torch.no_grad():
        theirs = hf(torch.from_numpy(ids).long()).logits.numpy()
    assert fc.relative_error(keras.ops.convert_to_numpy(lm(ids)), theirs) <= fc.TOLERANCE
    # Written back, every tensor has the bytes transformers wrote (the round trip of
    # test_folder_keras_folder_round_trip_is_bitwise, for every family written), but the
    # `1 + w` norms' (Gemma 3, Qwen 3.5 / Next): w -> 1 + w -> w in float32 rounds.
    lm.save_pretrained(tmp_path / "back")
    original, written = _read_back(tmp_path), _read_back(tmp_path / "back")
    assert sorted(written) == sorted(original)
    offset = read_config(lm.source_config).norm_offset
    for name in [n for n in original if written[n] != original[n]]:
        assert offset and "norm" in name, name
        w, back = (np.frombuffer(written_[2], "<f4") for written_ in (original[name],
                                                                       written[name]))
        assert np.all(np.abs(back - w) <= 2.0**-23 * (1 + np.abs(w))), name


@pytest.mark.parametrize("name", WRITTEN)
def test_transformers_from_pretrained_reads_what_keras_writes(tmp_path, name):
    """Torch env: transformers' `from_pretrained` of the folder `save_pretrained` wrote
    gives the Keras model's logits within 1e-5 (Gemma 3: its `1 + w` norms undone)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    lm = convert.causal_lm_from_transformers(fc.build_hf(name, small=True))
    # Away from the source: the Keras model's own weights are what must come out.
    scale = lm.final_norm.weights[0]  # RMSNorm's scale, LayerNorm's gamma
    scale.assign(scale * 0.5)
    lm.save_pretrained(tmp_path, max_shard_size="10KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    # The names transformers writes (the Hub's layout, which serving engines read).
    fc.build_hf(name, small=True).save_pretrained(tmp_path / "theirs")
    assert _saved_names(tmp_path) == _saved_names(tmp_path / "theirs")
    if name == "deepseek_v3":  # its router's correction bias is written (transformers would
        # otherwise start it at zeros, a different choice of experts)
        index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
        assert "model.layers.1.mlp.gate.e_score_correction_bias" in index["weight_map"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, attn_implementation="eager").float().eval()
    ids = fc.token_ids(name, small=True)
    with torch.no_grad():
        theirs = hf(torch.from_numpy(ids).long()).logits.numpy()
    ours = keras.ops.convert_to_numpy(lm(ids))
    assert fc.relative_error(theirs, ours) <= 1e-5, fc.relative_error(theirs, ours)


def _expert_modules(E=3, F=4, D=5, block="block_sparse_moe.", names=("w1", "w3", "w2")):
    rng = np.random.default_rng(0)
    entries = {f"model.layers.0.{block}gate.weight": rng.normal(size=(E, D))}
    for e in range(E):
        for name, shape in zip(names, ((F, D), (F, D), (D, F))):
            entries[f"model.layers.0.{block}experts.{e}.{name}.weight"] = rng.normal(size=shape)
    return entries


def test_expert_modules_are_stacked_and_split_back_exactly():
    """One module per expert <-> transformers 5's fused experts, as its conversion_mapping
    does: gate rows then up rows in `gate_up_proj` (E, 2F, D), `down_proj` (E, D, F)."""
    from keras_attn.convert import _experts
    entries = _expert_modules()
    fused = _experts.join_expert_modules(dict(entries), _experts.MIXTRAL_MODULES)
    assert sorted(fused) == ["model.layers.0.mlp.experts.down_proj",
                             "model.layers.0.mlp.experts.gate_up_proj",
                             "model.layers.0.mlp.gate.weight"]
    gate_up = fused["model.layers.0.mlp.experts.gate_up_proj"]
    np.testing.assert_array_equal(gate_up[1, :4],
                                  entries["model.layers.0.block_sparse_moe.experts.1.w1.weight"])
    np.testing.assert_array_equal(gate_up[1, 4:],
                                  entries["model.layers.0.block_sparse_moe.experts.1.w3.weight"])
    back = _experts.split_expert_modules(fused, _experts.MIXTRAL_MODULES)
    assert sorted(back) == sorted(entries)
    for key, value in entries.items():
        np.testing.assert_array_equal(back[key], value)


def test_incomplete_or_doubled_experts_are_refused_by_name():
    from keras_attn.convert import _experts
    modules = _experts.QWEN2_MOE_MODULES
    names = ("gate_proj", "up_proj", "down_proj")
    entries = _expert_modules(block="mlp.", names=names)
    del entries["model.layers.0.mlp.experts.1.up_proj.weight"]
    with pytest.raises(ValueError, match=r"no 'model.layers.0.mlp.experts.1.up_proj.weight'"):
        _experts.join_expert_modules(entries, modules)
    entries = _expert_modules(block="mlp.", names=names)
    entries["model.layers.0.mlp.experts.down_proj"] = np.zeros((3, 5, 4))
    with pytest.raises(ValueError, match="twice"):
        _experts.join_expert_modules(entries, modules)
    entries = _expert_modules(block="mlp.", names=names)
    entries["model.layers.0.mlp.experts.2.down_proj.weight"] = np.zeros((5, 3))
    with pytest.raises(ValueError, match="differ in shape"):
        _experts.join_expert_modules(entries, modules)
