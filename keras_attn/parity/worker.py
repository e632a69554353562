"""Run the parity cases in one backend: `python -m keras_attn.parity.worker REQUEST`.

`python -m keras_attn.parity.worker --check-gpu` only checks that the backend
chosen by KERAS_BACKEND sees a GPU (exit status 2 and a message if not).

Started by `keras-attn parity` in a subprocess with `KERAS_BACKEND` set, one
per backend. REQUEST is a JSON file naming the arrays file written by the
parent (inputs, masks and weights of every case), the requested cases, dtypes
and device, and where to write the results: an .npz of float32 arrays
("<dtype>/<case>/output", "<dtype>/<case>/grad/<name>") and a JSON file
(backend, versions, device, determinism, errors, timings).

This module imports keras and keras_attn only; anything backend-specific
(devices, TF32, gradients) goes through `keras_attn._device`.

Exit status: 0 when it ran (per-case errors are recorded in the results),
2 when the requested device is not available (the message says why).
"""

import json
import os
import sys
import time

import keras
import numpy as np

import keras_attn
from keras_attn import _device
from keras_attn.parity.arrays import cotangent
from keras_attn.parity.cases import get_cases, has_gradients
from keras_attn.testing.weights import named_variables

NO_GPU_EXIT = 2
# Each case's progress line on stdout starts with this, then JSON: {"key":
# "<dtype>/<case>", "seconds": ..., "error": "<exception type>" or null}.
# `keras-attn parity` prints them with a running count; other output is ignored.
PROGRESS = "keras-attn-parity-progress "


def _policy(dtype):
    return "float32" if dtype == "float32" else f"mixed_{dtype}"


def _build(case, dtype):
    """The case's layer (None for the functional core), built, weights unset."""
    s, policy = case.shapes, _policy(dtype)
    if case.kind == "sdpa":
        return None
    if case.kind == "mha":
        layer = keras_attn.MultiHeadAttention(**case.config, dtype=policy)
        layer.build(s["query"], value_shape=s.get("value", s.get("key")), key_shape=s.get("key"))
    elif case.kind == "mla":
        layer = keras_attn.MultiHeadLatentAttention(**case.config, dtype=policy)
        layer.build(s["query"])
    elif case.kind == "ffn":
        layer = keras_attn.PositionwiseFeedForward(**case.config, dtype=policy)
        layer.build(s["inputs"])
    elif case.kind == "gdn":
        layer = keras_attn.GatedDeltaNet(**case.config, dtype=policy)
        layer.build(s["inputs"])
    elif case.kind == "encoder":
        layer = keras_attn.TransformerEncoderLayer(**case.config, dtype=policy)
        layer.build(s["inputs"])
    else:
        layer = keras_attn.TransformerDecoderLayer(**case.config, dtype=policy)
        layer.build(s["inputs"], s.get("memory"))
    return layer


def _load_weights(layer, weights):
    """Assign the NumPy weights by name; every variable must be covered."""
    if layer is None:
        return []

    variables = named_variables(layer)
    if set(variables) != set(weights):
        raise RuntimeError(f"weight names differ: layer has {sorted(variables)}, "
                           f"case has {sorted(weights)}")
    covered = {id(v) for v in variables.values()}
    missed = [v.path for v in layer.weights if id(v) not in covered]
    if missed:
        raise RuntimeError(f"weights not covered by the case: {missed}")
    for name, variable in variables.items():
        if tuple(variable.shape) != weights[name].shape:
            raise RuntimeError(f"{name}: shape {tuple(variable.shape)} != "
                               f"{weights[name].shape}")
        variable.assign(weights[name])
    return [variables[name] for name in weights]


def _forward(case, layer, dtype, inputs, masks):
    """The case's output tensor for `inputs` (a dict of tensors or arrays)."""


    call = case.call
    if "cached_prefill" in call:
        return _cached_forward(case, layer, inputs, masks)
    if case.kind == "sdpa":
        cast = {n: keras.ops.cast(v, dtype) for n, v in inputs.items()}
        return keras_attn.scaled_dot_product_attention(
            cast["query"], cast["key"], cast["value"], mask=masks.get("mask"),
            bias=cast.get("bias"), **case.config)
    if case.kind == "mha":
        return layer(query=inputs["query"], value=inputs.get("value", inputs.get("key")),
                     key=inputs.get("key"), attention_mask=masks.get("attention_mask"),
                     use_causal_mask=call.get("use_causal_mask", False))
    if case.kind in ("ffn", "gdn"):
        return layer(inputs["inputs"])
    if case.kind == "mla":
        return layer(inputs["query"], attention_mask=masks.get("attention_mask"),
                     use_causal_mask=call.get("use_causal_mask", False))
    kwargs = {n: masks[n] for n in masks}
    if case.kind == "encoder":
        return layer(inputs["inputs"], use_causal_mask=call.get("use_causal_mask", False),
                     **kwargs)
    return layer(inputs["inputs"], memory=inputs.get("memory"),
                 use_causal_mask=call.get("use_causal_mask", True), **kwargs)


def _cached_forward(case, layer, inputs, masks):
    """Prefill `cached_prefill` tokens, then one token per call over a key/value cache.

    Returns the outputs of every call concatenated along the sequence axis:
    for a causal layer they equal the uncached forward over all T tokens.
    """
    ops = keras.ops
    x = inputs["query" if case.kind in ("mha", "mla") else "inputs"]
    B, T = x.shape[0], x.shape[1]
    prefill = case.call["cached_prefill"]
    bounds = [(0, prefill)] + [(t, t + 1) for t in range(prefill, T)]
    outputs = []
    if case.kind == "mla":  # a LatentCache: self-attention only
        cache = layer.empty_cache(B, T)
        for start, end in bounds:
            out, cache = layer(x[:, start:end], cache=cache, cache_update_index=start,
                               use_causal_mask=case.call.get("use_causal_mask", False))
            outputs.append(out)
        return ops.concatenate(outputs, axis=1)
    if case.kind == "gdn":  # a RecurrentCache: the state after the tokens so far
        cache = layer.empty_cache(B)
        for start, end in bounds:
            out, cache = layer(x[:, start:end], cache=cache)
            outputs.append(out)
        return ops.concatenate(outputs, axis=1)
    if case.kind == "mha":
        cache = layer.empty_cache(B, T)
        for start, end in bounds:
            part = x[:, start:end]
            out, cache = layer(query=part, value=part, cache=cache, cache_update_index=start,
                               use_causal_mask=case.call.get("use_causal_mask", False))
            outputs.append(out)
        return ops.concatenate(outputs, axis=1)
    memory = inputs.get("memory")
    caches = {"self_attention_cache": keras_attn.empty_cache(layer, B, T)}
    if memory is not None:
        caches["cross_attention_cache"] = layer.cross_attention.empty_cache(B, memory.shape[1])
    for start, end in bounds:
        first = start == 0 and memory is not None  # the prefill fills the cross cache
        out, *new = layer(x[:, start:end], memory=memory if first else None,
                          self_attention_cache_update_index=start,
                          cross_attention_cache_update_index=0 if first else None,
                          **masks, **caches)
        caches = dict(zip(caches, new, strict=True))
        outputs.append(out)
    return ops.concatenate(outputs, axis=1)


def run_case(case, dtype, inputs, masks, weights, gradients):
    """{"output": ..., "grad/<name>": ...} as float32 NumPy arrays."""


    layer = _build(case, dtype)
    variables = _load_weights(layer, weights)
    out = keras.ops.convert_to_numpy(
        keras.ops.cast(_forward(case, layer, dtype, inputs, masks), "float32"))
    result = {"output": np.asarray(out, np.float32)}
    if not gradients or not has_gradients(case):
        return result
    cot = keras.ops.convert_to_tensor(cotangent(case, out.shape))
    names = list(inputs)

    def loss(*args):
        tensors = dict(zip(names, args[: len(names)], strict=True))
        y = keras.ops.cast(_forward(case, layer, dtype, tensors, masks), "float32")
        return keras.ops.sum(y * cot)

    _, grads = _device.value_and_grad(loss, [inputs[n] for n in names] + variables)
    for name, grad in zip(names + list(weights), grads, strict=True):
        result["grad/" + name] = np.asarray(grad, np.float32)
    return result


def _same_bits(a, b):
    return set(a) == set(b) and all(
        a[k].shape == b[k].shape and a[k].tobytes() == b[k].tobytes() for k in a)


def _no_gpu_message(backend):
    return (f"keras-attn parity: --device gpu was requested, but the {backend} backend "
            f"sees no GPU (is the CUDA build of {backend} installed, and a GPU visible?)")


def check_gpu():
    """`--check-gpu`: print the device, or fail (exit status 2) without a GPU."""


    backend = keras.backend.backend()
    if not _device.gpu_available():
        print(_no_gpu_message(backend), file=sys.stderr)
        return NO_GPU_EXIT
    info = _device.describe()
    print(f"{backend} {info['backend_version']} sees {info['device']}")
    return 0


def _report_progress(key, seconds, error=None):
    print(PROGRESS + json.dumps({"key": key, "seconds": round(seconds, 3), "error": error}),
          flush=True)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if argv == ["--check-gpu"]:
        return check_gpu()
    with open(argv[0]) as f:
        request = json.load(f)



    backend = keras.backend.backend()
    if request["device"] == "gpu" and not _device.gpu_available():
        print(_no_gpu_message(backend), file=sys.stderr)
        return NO_GPU_EXIT
    _device.disable_tf32()
    gradients = request["gradients"] and backend != "numpy"
    arrays = np.load(request["arrays"])
    results, meta = {}, {"info": _device.describe(), "gradients": gradients,
                         "deterministic": {}, "errors": {}, "seconds": {}}
    for dtype in request["dtypes"]:
        start = time.perf_counter()
        for case in get_cases(request["cases"]):
            key = f"{dtype}/{case.name}"
            group = {g: {k.split("/", 2)[2]: arrays[k] for k in arrays.files
                         if k.startswith(f"{case.name}/{g}/")}
                     for g in ("inputs", "masks", "weights")}
            # Keep the inputs in the case's declared order.
            group["inputs"] = {n: group["inputs"][n] for n in case.shapes}
            case_start = time.perf_counter()
            try:
                runs = [run_case(case, dtype, **group, gradients=gradients)
                        for _ in range(max(1, request.get("repeat", 2)))]
            except Exception as error:  # recorded; the comparison reports it as FAIL
                meta["errors"][key] = f"{type(error).__name__}: {error}"
                _report_progress(key, time.perf_counter() - case_start, type(error).__name__)
                continue
            _report_progress(key, time.perf_counter() - case_start)
            meta["deterministic"][key] = all(_same_bits(runs[0], r) for r in runs[1:])
            for name, value in runs[0].items():
                results[f"{key}/{name}"] = value
        meta["seconds"][dtype] = round(time.perf_counter() - start, 3)
    np.savez(request["results"], **results)
    with open(request["meta"], "w") as f:
        json.dump(meta, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
