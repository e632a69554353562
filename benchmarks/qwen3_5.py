"""Benchmark: a converted Qwen 3.5-style hybrid (Gated DeltaNet + gated softmax attention)
against transformers' torch implementation, on PyTorch, and the memory of its state.

    python -m benchmarks.qwen3_5                  # D=512, 4 layers, 15 interleaved rounds (~6 min)
    python -m benchmarks.qwen3_5 --quick          # smoke sizes, 2 rounds
    python -m benchmarks.qwen3_5 --rounds 9 --json qwen3_5.json

Model: transformers' `Qwen3_5ForCausalLM` (`qwen3_5_text`) scaled down from Qwen 3.5's
ratios: vocabulary 32000, D=512, 4 layers with `layer_types` 3 `linear_attention` + 1
`full_attention`; the full layer 8 query heads over 2 key/value heads of 64 with its
output gate, partial RoPE 0.25; the linear layers (Gated DeltaNet) 4 key heads and 8 value
heads of 64, convolution kernel 4; SwiGLU 1536; float32. Random weights (seeded, nothing
downloaded): transformers' init, then every matrix redrawn N(0, 0.05) and every vector
shifted by N(0, 0.1), so no weight sits at its neutral value. The driver saves it as a
safetensors checkpoint in a temporary folder; the worker (KERAS_BACKEND=torch) loads it:

- **keras_attn**: `keras_attn.convert.causal_lm_from_transformers(folder)` (the folder
  read without torch); `predict_on_batch` for the prefill, `generate` (greedy, the
  `RecurrentCache` of each linear block and the `KVCache` of the full one);
- **hf_eager** / **hf_sdpa**: `AutoModelForCausalLM.from_pretrained(folder)` with eager
  or SDPA attention (the full layer's; the linear layers run transformers' torch delta
  rule, chunked over the prompt and recurrent per step, as on any machine without
  flash-linear-attention), a `torch.no_grad()` forward for the prefill and `generate`
  with its default (dynamic, hybrid) cache.

Equivalence first: each contender's prompt logits against the driver's transformers
logits (max |diff| / max |HF|, within 1e-4) and its 128 greedy tokens against the
driver's; a contender whose logits disagree is not timed.

Figures (B=1, prompt P=512, N=128 new greedy tokens): prefill = one forward over the
prompt; generate = the whole `generate`; decode per token = (generate - prefill) / N,
per round. The contenders are warmed up, then timed in turn (prefill and generate of
each, A B C A B C ...) for the rounds; medians, with each figure's spread (min-max over
rounds), the ratios keras_attn / transformers of the medians, and the ratios per round
(both timed in the same round, so a slow stretch of a shared machine hits both).

State memory per sequence, from the caches' tensors (`keras_attn.empty_cache` of each
block at 1 and 2 slots: a `RecurrentCache`'s bytes do not grow, a `KVCache` grows by its
per-slot bytes; nothing is allocated at 32k): the hybrid against an all-softmax model of
the same sizes (the same config with every layer `full_attention`), float32, at 1k and
32k tokens.
"""

import argparse
import os
import statistics
import sys
import tempfile

from benchmarks import _common as common

DEFAULTS = {"vocab": 32000, "dim": 512, "layers": 4, "heads": 8, "kv_heads": 2,
            "head_dim": 64, "linear_key_heads": 4, "linear_value_heads": 8,
            "linear_head_dim": 64, "ffn": 1536, "prompt": 512, "new": 128, "rounds": 15,
            "lengths": [1024, 32768]}
QUICK = {"vocab": 512, "dim": 64, "layers": 4, "heads": 4, "kv_heads": 2, "head_dim": 16,
         "linear_key_heads": 2, "linear_value_heads": 4, "linear_head_dim": 16, "ffn": 128,
         "prompt": 32, "new": 8, "rounds": 2, "lengths": [1024, 32768]}
LOGITS_TOLERANCE = 1e-4  # max |diff| / max |HF logits| in float32
CONTENDERS = ("keras_attn", "hf_eager", "hf_sdpa")


def hf_config(spec, all_softmax=False):
    """The transformers `Qwen3_5TextConfig` of `spec` (every layer full if `all_softmax`)."""
    from transformers import Qwen3_5TextConfig

    full_every = 4  # Qwen 3.5's full_attention_interval
    layer_types = ["full_attention" if all_softmax or (i + 1) % full_every == 0
                   else "linear_attention" for i in range(spec["layers"])]
    return Qwen3_5TextConfig(
        vocab_size=spec["vocab"], hidden_size=spec["dim"], intermediate_size=spec["ffn"],
        num_hidden_layers=spec["layers"], num_attention_heads=spec["heads"],
        num_key_value_heads=spec["kv_heads"], head_dim=spec["head_dim"],
        linear_num_key_heads=spec["linear_key_heads"],
        linear_num_value_heads=spec["linear_value_heads"],
        linear_key_head_dim=spec["linear_head_dim"],
        linear_value_head_dim=spec["linear_head_dim"], linear_conv_kernel_dim=4,
        layer_types=layer_types, tie_word_embeddings=False,
        max_position_embeddings=max(spec["lengths"]),
        rope_parameters={"rope_type": "default", "rope_theta": 1e7,
                         "partial_rotary_factor": 0.25})


def random_model(spec, all_softmax=False):
    """A seeded random `Qwen3_5ForCausalLM` of `spec`, float32, eval mode (torch)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config(spec, all_softmax),
                                             attn_implementation="eager")
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # far from identity: no weight at its init's neutral value
        for parameter in model.parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if parameter.ndim == 2:
                parameter.copy_(0.05 * noise)
            elif parameter.ndim == 1:
                parameter.add_(0.1 * noise)
    return model.float().eval()


def make_checkpoint(spec, folder):
    """Save the random hybrid to `folder`, with its prompt, logits and greedy tokens."""

    model = random_model(spec)
    common.save_with_reference(model, spec, folder)


# ----------------------------------------------------------------------------
# Contenders (worker side): logits(prompt) -> numpy (1, P, V), generate(prompt) -> numpy
# tokens (1, P + N).


def _ours(folder, spec):
    import numpy as np

    from keras_attn.convert import causal_lm_from_transformers

    lm = causal_lm_from_transformers(folder)
    length = spec["prompt"] + spec["new"]
    return lm, {
        "logits": lambda p: np.asarray(lm.predict_on_batch(p.astype("int32")), "float32"),
        "generate": lambda p: np.asarray(lm.generate(p.astype("int32"), max_length=length))}


def _hf(folder, spec, attention):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation=attention).eval()

    def logits(prompt):
        with torch.no_grad():
            return model(torch.as_tensor(prompt)).logits.numpy()

    def generate(prompt):
        with torch.no_grad():
            return model.generate(torch.as_tensor(prompt), max_new_tokens=spec["new"],
                                  min_new_tokens=spec["new"], do_sample=False,
                                  pad_token_id=0).numpy()

    return {"logits": logits, "generate": generate}


# ----------------------------------------------------------------------------
# State memory.


def _cache_bytes(cache):
    import keras
    import numpy as np

    return sum(int(np.prod(x.shape)) * np.dtype(keras.backend.standardize_dtype(x.dtype)).itemsize
               for x in cache)


def state_bytes(lm, lengths, dtype="float32"):
    """`{str(length): (linear blocks' bytes, softmax blocks' bytes)}` of one sequence's caches.

    Each block's cache is built at 1 and 2 slots (`keras_attn.empty_cache`); a cache of L
    slots holds its 1-slot bytes plus L - 1 times the difference (a `RecurrentCache`: no
    difference; a `KVCache`: one position's keys and values).
    """
    from keras_attn import empty_cache

    linear, softmax = 0, [0, 0]
    for block in lm.blocks:
        one, two = (_cache_bytes(empty_cache(block, 1, n, dtype, as_kv_cache=True))
                    for n in (1, 2))
        if getattr(block.self_attention, "has_recurrent_state", False):
            assert one == two, (one, two)
            linear += one
        else:
            softmax[0] += one
            softmax[1] += two - one
    return {str(n): (linear, softmax[0] + (n - 1) * softmax[1]) for n in lengths}


def _tensor_bytes(value):
    """Bytes of the torch tensors in `value` (nested in dicts, lists and tuples)."""
    import torch

    if torch.is_tensor(value):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def hf_cache_bytes(folder, prompt):
    """transformers' own cache after a forward over `prompt` (one sequence): `(linear
    layers' bytes, full layers' bytes)`, summed over its layers' tensors."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa").eval()
    with torch.no_grad():
        cache = model(torch.as_tensor(prompt), use_cache=True).past_key_values
    linear = full = 0
    for layer in cache.layers:
        size = _tensor_bytes(vars(layer))
        if "recurrent_states" in vars(layer):
            linear += size
        else:
            full += size
    return linear, full


def _memory(lm, spec, folder, prompt):
    from keras_attn.convert import causal_lm_from_transformers

    dense = causal_lm_from_transformers(random_model(spec, all_softmax=True))
    return {"hybrid": state_bytes(lm, [*spec["lengths"], spec["prompt"]]),
            "all_softmax": state_bytes(dense, spec["lengths"]),
            "hf_at_prompt": hf_cache_bytes(folder, prompt)}


# ----------------------------------------------------------------------------
# Worker.


def _spread(values, scale=1e3):
    values = [v * scale for v in values]
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def worker(spec):
    import numpy as np

    import keras_attn
    from keras_attn import _device
    from keras_attn.models import _generate_loop

    _device.single_cpu_thread_for_small_ops()
    folder = spec["folder"]
    reference = np.load(os.path.join(folder, "reference.npz"))
    prompt = reference["prompt"]
    scale = float(np.max(np.abs(reference["logits"])))
    contenders, checks, notes = {}, {}, {}
    lm = None
    for name in CONTENDERS:
        print(f"[qwen3_5] building and checking {name}", file=sys.stderr, flush=True)
        if name == "keras_attn":
            lm, contender = _ours(folder, spec)
        else:
            contender = _hf(folder, spec, name.split("_")[1])
        error = float(np.max(np.abs(contender["logits"](prompt) - reference["logits"]))) / scale
        with keras_attn.observe_paths() as paths:  # what keras_attn's generate ran
            tokens = contender["generate"](prompt)  # also the warm-up
        if name == "keras_attn":
            steps = getattr(_generate_loop.traced_step_of(lm), "graph_calls", None)
            notes["keras_attn_paths"] = f"{dict(paths)}, traced decoding steps {steps}"
        new, ref = tokens[0, spec["prompt"]:], reference["tokens"][0, spec["prompt"]:]
        differ = np.flatnonzero(new != ref) if new.shape == ref.shape else [0]
        checks[name] = {"logits_rel_error": error,
                        "same_tokens": int(differ[0]) if len(differ) else len(ref)}
        if error <= LOGITS_TOLERANCE:
            contenders[name] = contender
        else:
            notes[name] = f"not equivalent: logits {error:.1e}"
    print("[qwen3_5] state memory (the all-softmax twin)", file=sys.stderr, flush=True)
    memory = _memory(lm, spec, folder, prompt)
    runs = {}
    for name, c in contenders.items():
        runs[f"{name}/prefill"] = lambda c=c: c["logits"](prompt)
        runs[f"{name}/generate"] = lambda c=c: c["generate"](prompt)
    print(f"[qwen3_5] timing {len(contenders)} contenders, {spec['rounds']} rounds",
          file=sys.stderr, flush=True)
    times = common.interleaved(runs, spec["rounds"])

    def per_round(name, figure):
        prefill, generate = times[f"{name}/prefill"], times[f"{name}/generate"]
        return {"prefill": prefill, "generate": generate,
                "decode": [(g - p) / spec["new"] for p, g in zip(prefill, generate)]}[figure]

    ms = {name: {k: _spread(per_round(name, k)) for k in ("prefill", "decode", "generate")}
          for name in contenders}
    ratios = {}  # per round: both timed in the same round, so a slow stretch hits both
    if "keras_attn" in contenders:
        for name in contenders:
            if name != "keras_attn":
                ratios[name] = {k: _spread([a / b for a, b in zip(per_round("keras_attn", k),
                                                                  per_round(name, k))], 1.0)
                                for k in ("prefill", "decode")}
    return {"checks": checks, "notes": notes, "ms": ms, "ratios": ratios, "memory": memory,
            "info": _device.describe(), "peak_rss_gib": common.peak_rss_gib()}


# ----------------------------------------------------------------------------
# Driver.


def _cell(figure, digits):
    return (f"{figure['median']:.{digits}f} ({figure['min']:.{digits}f}-"
            f"{figure['max']:.{digits}f})")


def table(result, spec):
    lines = [f"Qwen 3.5-style hybrid: vocabulary {spec['vocab']}, D={spec['dim']}, "
             f"{spec['layers']} layers ({spec['layers'] - spec['layers'] // 4} linear + "
             f"{spec['layers'] // 4} full), full H={spec['heads']}/"
             f"{spec['kv_heads']}x{spec['head_dim']}, linear {spec['linear_key_heads']}/"
             f"{spec['linear_value_heads']}x{spec['linear_head_dim']}, FFN {spec['ffn']}, "
             f"float32; B=1, prompt {spec['prompt']}, {spec['new']} greedy tokens; ms, "
             f"medians (min-max) of {spec['rounds']} interleaved rounds", "",
             "| contender | logits rel. error | same tokens | prefill ms | decode ms / token "
             "| generate ms | keras_attn / it (prefill, decode) | per-round ratios, median "
             "(min-max): prefill; decode |",
             "|---|---:|---:|---:|---:|---:|---|---|"]
    if "error" in result:
        return "\n".join(lines + [f"| error: {result['error']} | | | | | | | |"])
    ours = result["ms"].get("keras_attn")
    for name, check in result["checks"].items():
        ms = result["ms"].get(name)
        cells = ([_cell(ms["prefill"], 1), _cell(ms["decode"], 2), _cell(ms["generate"], 0)]
                 if ms else [result["notes"].get(name, "not timed"), "", ""])
        ratio = ("" if not (ms and ours and name != "keras_attn") else ", ".join(
            f"{ours[k]['median'] / ms[k]['median']:.2f}" for k in ("prefill", "decode")))
        rounds = result.get("ratios", {}).get(name)
        rounds = "" if not rounds else "; ".join(_cell(rounds[k], 2) for k in ("prefill", "decode"))
        lines.append(f"| {name} | {check['logits_rel_error']:.1e} | "
                     f"{check['same_tokens']}/{spec['new']} | " + " | ".join(cells)
                     + f" | {ratio} | {rounds} |")
    lines += ["", f"(worker peak RSS {result['peak_rss_gib']:.2f} GiB; keras_attn's generate "
              f"ran {result['notes'].get('keras_attn_paths')})", "",
              "State per sequence (float32), MiB: linear blocks' RecurrentCache + full "
              "blocks' KVCache", "",
              "| tokens | hybrid: linear + full = total | all-softmax | all-softmax / hybrid |",
              "|---:|---|---:|---:|"]
    hybrid, dense = result["memory"]["hybrid"], result["memory"]["all_softmax"]
    for n in spec["lengths"]:
        linear, full = hybrid[str(n)]
        total, other = linear + full, sum(dense[str(n)])
        lines.append(f"| {n} | {linear / 2**20:.2f} + {full / 2**20:.2f} = "
                     f"{total / 2**20:.2f} | {other / 2**20:.2f} | {other / total:.1f} |")
    linear, full = hybrid[str(spec["prompt"])]
    hf_linear, hf_full = result["memory"]["hf_at_prompt"]
    lines += ["", f"Cross-check after the {spec['prompt']}-token prompt: keras_attn's caches "
              f"{linear / 2**20:.3f} + {full / 2**20:.3f} MiB, transformers' own cache "
              f"{hf_linear / 2**20:.3f} + {hf_full / 2**20:.3f} MiB (linear + full)"]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_options(parser, quick="small smoke sizes",
                       rounds=("--rounds", None, "timing rounds (default 15)"),
                       timeout=("--timeout", 1800, "seconds for the worker"),
                       json_help="write the results here")
    args = parser.parse_args(argv)
    if args.worker:
        return common.worker_main(worker, args.worker)
    spec = dict(QUICK if args.quick else DEFAULTS)
    if args.rounds:
        spec["rounds"] = args.rounds
    with tempfile.TemporaryDirectory() as folder:
        print("[qwen3_5] building the transformers checkpoint ...", file=sys.stderr, flush=True)
        make_checkpoint(spec, folder)
        print("[qwen3_5] torch worker ...", file=sys.stderr, flush=True)
        result = common.spawn("benchmarks.qwen3_5", {**spec, "folder": folder}, args.timeout,
                              backend="torch")
    print(f"{common.machine()}\n")
    print(table(result, spec))
    if args.json:
        common.write_json(args.json, {"spec": spec, "result": result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
