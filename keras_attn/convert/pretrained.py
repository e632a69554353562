"""A Hugging Face checkpoint folder (`config.json` + safetensors) to a `keras_attn.CausalLM`, without torch.

`causal_lm_from_pretrained(path)` reads the folder `save_pretrained` writes:
`config.json`, then one `model.safetensors` or the shards a
`model.safetensors.index.json` lists (its `weight_map`). Neither torch nor
transformers is imported: the files are read with the `safetensors` package
(`pip install keras-attn[safetensors]`), which checks each file's header, and
each tensor is a read-only `numpy.memmap` of its bytes at the header's offsets,
read when the converter reaches it (one tensor at a time; the converter's
plan holds views of the mapped files, not copies). The config and the tensors
then go through `keras_attn.convert.causal_lm_from_transformers`, with every
check it makes.

bfloat16 tensors: numpy has no bfloat16 (safetensors' numpy API cannot return
them), so their raw 16-bit words are widened to float32 (`bits << 16`, exact)
when read; the model's variables are then cast to its dtype (bfloat16 by
default for a bfloat16 checkpoint, so exactly the stored values). No
`ml_dtypes` is needed.

Pickled checkpoints (`pytorch_model.bin`, `*.bin`, `*.pt`, `*.pth`) are refused,
never unpickled: unpickling runs arbitrary code.
"""

import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["causal_lm_from_pretrained"]

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
_PICKLED = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
# safetensors dtype codes numpy reads as they are.
_NUMPY_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4",
                 "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}
# config.json's `torch_dtype` / `dtype` -> the Keras dtype.
_CHECKPOINT_DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16",
                      "torch.float32": "float32", "torch.float16": "float16",
                      "torch.bfloat16": "bfloat16", "float": "float32", "half": "float16"}


def is_checkpoint_path(value):
    """Whether `value` names a folder (a `str` or `os.PathLike`): the converters' cue."""
    return isinstance(value, (str, os.PathLike))


def _safetensors():
    try:
        import safetensors
    except ImportError:  # pragma: no cover - the extra is missing
        raise ImportError(
            "Reading a safetensors checkpoint needs the `safetensors` package: "
            "pip install keras-attn[safetensors]") from None
    return safetensors


class _Tensor:
    """One tensor of a safetensors file, read (memory-mapped) when numpy asks for it."""

    def __init__(self, file, name, info, data_start):
        self.file, self.name = file, name
        self.dtype, self.shape = info["dtype"], tuple(info["shape"])
        self.begin, self.end = (data_start + int(offset) for offset in info["data_offsets"])

    def read(self):
        count = int(np.prod(self.shape, dtype=np.int64))
        if self.dtype == "BF16":
            words = self._map("<u2", count)
            return (words.astype(np.uint32) << 16).view(np.float32).reshape(self.shape)
        if self.dtype not in _NUMPY_DTYPES:
            raise ValueError(
                f"Tensor {self.name!r} of {self.file} has dtype {self.dtype}, which keras_attn "
                f"does not read. Received: dtype={self.dtype!r}")
        return self._map(_NUMPY_DTYPES[self.dtype], count).reshape(self.shape)

    def _map(self, dtype, count):
        size = np.dtype(dtype).itemsize * count
        if self.end - self.begin != size:
            raise ValueError(
                f"Tensor {self.name!r} of {self.file} spans {self.end - self.begin} bytes, not "
                f"the {size} of its shape {self.shape} and dtype {self.dtype}.")
        if count == 0:
            return np.zeros((0,), dtype)
        return np.memmap(self.file, dtype=dtype, mode="r", offset=self.begin, shape=(count,))

    def __array__(self, dtype=None, copy=None):
        array = self.read()
        return array if dtype is None else array.astype(dtype)


def _header(file):
    """The JSON header of a safetensors file and where its data begins."""
    with open(file, "rb") as handle:
        length = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(length))
    header.pop("__metadata__", None)
    return header, 8 + length


def _tensors(file, names=None):
    """`{name: _Tensor}` of safetensors `file` (only `names` when given: a shard's share of
    the index), each checked to be in the file."""
    if not os.path.isfile(file):
        raise ValueError(f"The checkpoint's weights file {file} does not exist. "
                         f"Received: {os.path.basename(file)!r} missing")
    safetensors = _safetensors()
    with safetensors.safe_open(file, framework="numpy") as handle:  # checks the header
        keys = set(handle.keys())
    header, data_start = _header(file)
    wanted = sorted(keys) if names is None else names
    missing = [name for name in wanted if name not in keys]
    if missing:
        raise ValueError(
            f"{os.path.basename(file)} lacks tensor {missing[0]!r}, which {INDEX_NAME} "
            f"maps to it ({len(missing)} missing in all). Received: file={file}")
    return {name: _Tensor(file, name, header[name], data_start) for name in wanted}


def _refuse_pickles(folder):
    pickled = sorted(f for f in os.listdir(folder) if f.endswith(_PICKLED))
    if pickled:
        raise ValueError(
            f"{folder} holds only pickled weights ({', '.join(pickled)}), which keras_attn "
            "does not read: unpickling runs arbitrary code. Convert them to safetensors "
            "first (transformers: `model.save_pretrained(path, safe_serialization=True)`). "
            f"Received: {pickled[0]!r}")
    raise ValueError(f"{folder} has neither {WEIGHTS_NAME} nor {INDEX_NAME}. "
                     f"Received: files {sorted(os.listdir(folder))}")


def read_state_dict(folder: str) -> dict[str, Any]:
    """`{name: tensor}` of the checkpoint in `folder`, each read lazily (`numpy.asarray`)."""
    index = os.path.join(folder, INDEX_NAME)
    if os.path.isfile(index):
        with open(index) as handle:
            weight_map = json.load(handle).get("weight_map")
        if not isinstance(weight_map, Mapping) or not weight_map:
            raise ValueError(f"{index} must hold a non-empty `weight_map`. "
                             f"Received: weight_map={weight_map!r}")
        by_file: dict[str, list[str]] = {}
        for name, shard in weight_map.items():
            by_file.setdefault(shard, []).append(name)
        tensors: dict[str, Any] = {}
        for shard, names in by_file.items():
            tensors.update(_tensors(os.path.join(folder, shard), names))
        return tensors
    single = os.path.join(folder, WEIGHTS_NAME)
    if os.path.isfile(single):
        return _tensors(single)
    _refuse_pickles(folder)
    return {}  # unreachable: _refuse_pickles raises


def _checked_dtype(dtype):
    import keras

    try:
        policy = keras.dtype_policies.get(dtype) if isinstance(dtype, str) else None
    except (ValueError, TypeError):
        policy = None
    if policy is None or "float" not in str(policy.variable_dtype) + str(policy.compute_dtype):
        raise ValueError(
            "`dtype` must be None (the checkpoint's) or a floating Keras dtype or dtype policy "
            f"name ('float32', 'bfloat16', 'mixed_bfloat16', ...). Received: dtype={dtype!r}")
    return dtype


def read_config_file(folder):
    """`config.json` of `folder` as a dict; a `ValueError` naming the file if absent."""
    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        raise ValueError(f"`path` must be a checkpoint folder (config.json and safetensors "
                         f"weights). Received: path={folder!r}")
    file = os.path.join(folder, CONFIG_NAME)
    if not os.path.isfile(file):
        raise ValueError(f"{file} does not exist: a checkpoint folder needs its {CONFIG_NAME}. "
                         f"Received: path={folder!r}")
    with open(file) as handle:
        return json.load(handle)


def causal_lm_from_pretrained(path: str | os.PathLike, dtype: str | None = None, **kwargs):
    """A `keras_attn.CausalLM` from a Hugging Face checkpoint folder, without torch or transformers.

    Reads `config.json`, then `model.safetensors` or the shards that
    `model.safetensors.index.json` maps (`weight_map`), one tensor at a time
    from memory-mapped files, and converts them as
    `keras_attn.convert.causal_lm_from_transformers` does (every family it
    reads, every check it makes). bfloat16 tensors are widened to float32
    exactly (`bits << 16`) when read; numpy has no bfloat16, and no
    `ml_dtypes` is needed. Needs the `safetensors` package
    (`pip install keras-attn[safetensors]`).

    Args:
        path: the folder (`str` or `os.PathLike`), as written by transformers'
            `save_pretrained`.
        dtype: the model's Keras dtype or dtype policy (`"float32"`,
            `"bfloat16"`, `"mixed_bfloat16"`, ...), or None for the
            checkpoint's (`torch_dtype` / `dtype` in `config.json`; float32
            when it names none).
        **kwargs: `name` of the `CausalLM`.

    Returns:
        The built `keras_attn.CausalLM` with the checkpoint's weights: token
        ids `(B, T)` to logits `(B, T, V)`.

    Raises:
        ValueError: `path` is no folder; `config.json`, the weights or a
            shard is missing, or a shard lacks a tensor its index maps to it
            (the file named); only pickled weights (`*.bin`, `*.pt`) are
            there (refused, never unpickled); a bad `dtype`; or whatever
            `causal_lm_from_transformers` refuses in the config or weights.

    docs/guides/converting.md ("Checkpoint folders") has an example that runs.
    """
    from keras_attn.convert.transformers import causal_lm_from_transformers

    config = read_config_file(path)
    if dtype is None:
        stored = config.get("torch_dtype", config.get("dtype")) or "float32"
        dtype = _CHECKPOINT_DTYPES.get(str(stored))
        if dtype is None:
            raise ValueError(f"config.json's `torch_dtype` / `dtype` is not a floating dtype "
                             f"keras_attn reads; pass `dtype=`. Received: dtype={stored!r}")
    dtype = _checked_dtype(dtype)
    state_dict = read_state_dict(os.fspath(path))
    return causal_lm_from_transformers(config, state_dict, dtype=dtype, **kwargs)
