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

__all__ = ["causal_lm_from_pretrained", "causal_lm_to_pretrained"]

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


# Families not written yet (none today; the hook stays for a family added before its
# writer). A family whose reader renames or splits its weights (`canonical_state_dict`) is
# written where its module has the inverse, `checkpoint_state_dict(tensors, spec)`;
# refused otherwise.
_NOT_WRITTEN: tuple[str, ...] = ()
_UNITS = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
_OFFSET_STEP = 4  # probe codes step by 4: the remainder is the norm offset (0 or 1)


def _writable(families, model_type):
    """Whether `save_pretrained` writes `model_type`: not a family it cannot write yet, and
    one whose reader renames or splits weights only with the inverse beside it."""
    module = families.family(model_type)
    return model_type not in _NOT_WRITTEN and (
        not hasattr(module, "canonical_state_dict") or hasattr(module, "checkpoint_state_dict"))


def _shard_bytes(max_shard_size):
    if isinstance(max_shard_size, int) and not isinstance(max_shard_size, bool) and (
            max_shard_size > 0):
        return max_shard_size
    if isinstance(max_shard_size, str):
        text = max_shard_size.strip().upper()
        for unit in sorted(_UNITS, key=len, reverse=True):
            if text.endswith(unit) and text[:-len(unit)].strip().replace(".", "", 1).isdigit():
                return int(float(text[:-len(unit)]) * _UNITS[unit])
        if text.isdigit() and int(text) > 0:
            return int(text)
    raise ValueError("`max_shard_size` must be a positive number of bytes, an int or a string "
                     f"such as '5GB' or '200MB'. Received: max_shard_size={max_shard_size!r}")


class _Probe:
    """A state dict the forward plan reads from: each entry it asks for (with its shape) is
    made of codes `base + 4 * flat_index`, so what the plan does to it (transposes, `+ 1`)
    says, per variable element, which checkpoint element it came from."""

    def __init__(self):
        self.shapes: dict[str, tuple] = {}
        self.bases: list[int] = []
        self.names: list[str] = []
        self.next = 0

    def has(self, name):
        return False  # optional entries (biases, sinks) come only through `check`

    def key(self, name):
        return repr(name)

    def check(self, entries, name, shape, letters, fields):
        count = int(np.prod(shape, dtype=np.int64))
        codes = self.next + _OFFSET_STEP * np.arange(count, dtype=np.float64)
        self.shapes[name], self.names = tuple(shape), self.names + [name]
        self.bases.append(self.next)
        self.next += _OFFSET_STEP * max(count, 1)
        if self.next >= 2**52:
            raise ValueError("The model is too large to write with keras_attn's probe. "
                             f"Received: {self.next} codes")
        return codes.reshape(shape)


def _spec_of(lm, model_type):
    from keras_attn.convert._transformers_config import read_config

    config = getattr(lm, "source_config", None)
    if config is None:
        raise ValueError(
            "The model has no `source_config` (the Hugging Face config it was converted from, "
            "which keras_attn.convert sets): keras_attn cannot tell which family and fields "
            "to write. Received: source_config=None")
    family = config.get("model_type")
    if model_type is not None and model_type != family:
        raise ValueError(f"`model_type` must be the source config's ({family!r}). "
                         f"Received: model_type={model_type!r}")
    from keras_attn.convert import families

    families.family(family)  # a ValueError naming an unknown or refused model_type
    if not _writable(families, family):
        written = [name for name in families.model_types() if _writable(families, name)]
        raise ValueError(
            f"`model_type` {family!r} is not written yet: keras_attn writes "
            f"{', '.join(written)}. Received: model_type={family!r}")
    return config, read_config(config)


def _checkpoint_tensors(lm, spec):
    """`{hf name: numpy array}`: the forward plan, probed, run backwards on `lm`'s values."""
    from keras import ops

    from keras_attn.convert._weight_plan import model_plan

    probe = _Probe()
    V, D = spec.vocabulary_size, spec.hidden_dim
    embedding = probe.check(None, "model.embed_tokens.weight", (V, D), "", "")
    head = None if spec.tie_word_embeddings else probe.check(None, "lm_head.weight", (V, D),
                                                             "", "")
    plan = model_plan(probe, spec, lm, embedding, head, check=probe.check)
    tensors = {name: None for name in probe.names}
    bases = np.asarray(probe.bases, np.float64)
    for variable, codes, what in plan:
        if tuple(variable.shape) != tuple(codes.shape):
            raise ValueError(f"{what}: the model's variable '{variable.path}' has shape "
                             f"{tuple(variable.shape)}, its source config gives "
                             f"{tuple(codes.shape)}.")
        value = ops.convert_to_numpy(ops.cast(variable, "float32")).reshape(-1)
        codes = np.rint(codes).reshape(-1)
        offset = np.mod(codes, _OFFSET_STEP)
        owner = np.searchsorted(bases, codes - offset, side="right") - 1
        for index in np.unique(owner):
            name = probe.names[index]
            if tensors[name] is None:
                tensors[name] = np.zeros(probe.shapes[name], np.float32)
            chosen = owner == index
            flat = ((codes[chosen] - offset[chosen] - bases[index]) / _OFFSET_STEP).astype(
                np.int64)
            tensors[name].reshape(-1)[flat] = value[chosen] - offset[chosen].astype(np.float32)
    missing = [name for name, array in tensors.items() if array is None]
    if missing:  # every entry the reader asks for is some variable's
        raise ValueError(f"No variable of the model holds {missing[0]!r}.")
    from keras_attn.convert import families

    inverse = getattr(families.family(spec.family), "checkpoint_state_dict", None)
    return tensors if inverse is None else inverse(tensors, spec)


def _to_bytes(array, dtype):
    """`array` (float32) as safetensors `dtype`'s little-endian bytes."""
    if dtype == "BF16":  # the model's bfloat16 values are exact in float32: keep the top half
        return (np.ascontiguousarray(array, "<f4").view("<u4") >> 16).astype("<u2").tobytes()
    return np.ascontiguousarray(array, _NUMPY_DTYPES[dtype]).tobytes()


def _write_safetensors(file, tensors, dtype):
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset, blobs = 0, []
    for name, array in tensors.items():
        blob = _to_bytes(array, dtype)
        header[name] = {"dtype": dtype, "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    with open(file, "wb") as handle:
        handle.write(len(text).to_bytes(8, "little"))
        handle.write(text)
        for blob in blobs:
            handle.write(blob)


def causal_lm_to_pretrained(lm, path: str | os.PathLike, model_type: str | None = None,
                            max_shard_size: int | str = "5GB") -> None:
    """Write `lm` as a Hugging Face checkpoint folder transformers' `from_pretrained` loads.

    The inverse of `causal_lm_from_pretrained`: the converter's own plan (the
    map from checkpoint entries to Keras variables, with its transposes and
    Gemma's `1 + w`) is run backwards, so the written weights are the ones it
    reads. Writes `config.json` (`lm.source_config`, the Hugging Face config
    the model was converted from, with the model's dtype) and
    `model.safetensors`, or `model-0000i-of-0000N.safetensors` shards with
    `model.safetensors.index.json` past `max_shard_size`. Float32 models are
    written in float32, bfloat16 ones in bfloat16; torch is not needed.

    Args:
        lm: a `keras_attn.CausalLM` converted by `keras_attn.convert` (it keeps
            its `source_config`), trained or not.
        path: the folder (made if absent).
        model_type: None, or the family to write, which must be the source
            config's `model_type`.
        max_shard_size: bytes per shard, an int or a string ("5GB", "200MB").

    Raises:
        ValueError: a quantized model, the model has no `source_config`, its family is not
            written (every model type the converters read is written today), a
            `model_type` other than the source's, or a bad `max_shard_size`.
    """
    from keras_attn.layers._common import check_not_quantized

    check_not_quantized(lm)  # its kernels are int8 codes: refused, named, before any file
    limit = _shard_bytes(max_shard_size)
    config, spec = _spec_of(lm, model_type)
    import keras

    variable_dtype = keras.backend.standardize_dtype(lm.dtype_policy.variable_dtype)
    dtype = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}.get(variable_dtype)
    if dtype is None:
        raise ValueError(f"The model's variables are {variable_dtype}: keras_attn writes "
                         f"float32, bfloat16 or float16. Received: dtype={variable_dtype!r}")
    tensors = _checkpoint_tensors(lm, spec)
    folder = os.fspath(path)
    os.makedirs(folder, exist_ok=True)
    itemsize = 4 if dtype == "F32" else 2
    shards: list[dict[str, Any]] = [{}]
    size = 0
    for name, array in tensors.items():
        nbytes = array.size * itemsize
        if shards[-1] and size + nbytes > limit:
            shards.append({})
            size = 0
        shards[-1][name] = array
        size += nbytes
    written = {**config, "dtype": variable_dtype}
    written.pop("torch_dtype", None)
    with open(os.path.join(folder, CONFIG_NAME), "w") as handle:
        json.dump(written, handle, indent=2, sort_keys=True)
    for stale in (WEIGHTS_NAME, INDEX_NAME):
        if os.path.exists(os.path.join(folder, stale)):
            os.remove(os.path.join(folder, stale))
    if len(shards) == 1:
        _write_safetensors(os.path.join(folder, WEIGHTS_NAME), shards[0], dtype)
        return
    weight_map = {}
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        _write_safetensors(os.path.join(folder, file), shard, dtype)
        weight_map.update({name: file for name in shard})
    total = sum(array.size * itemsize for array in tensors.values())
    with open(os.path.join(folder, INDEX_NAME), "w") as handle:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, handle,
                  indent=2)
