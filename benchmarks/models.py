"""Benchmark: a converted Llama against Hugging Face transformers and keras-hub.

    python -m benchmarks.models                         # every backend, default sizes
    python -m benchmarks.models --backend torch --quick
    python -m benchmarks.models --json models.json
    python -m benchmarks.models --model mixtral          # the mixture-of-experts point
    python -m benchmarks.models --backend jax --quick --padded  # also B=8, mixed lengths
    python -m benchmarks.models --batch 8                # prefill, generate, train at B=8

Model `--model mixtral` (issue 34): the same sizes as a Mixtral (8 experts of SwiGLU
1408, top-2, softmax over all experts then renormalised top-2, as transformers'
`MixtralSparseMoeBlock`) in place of each dense feed-forward: the driver builds a
`MixtralForCausalLM`; keras_attn converts it with its `mixtral` family
(`keras_attn.MixtureOfExperts`, whose sparse or dense path the execution policy
picks), keras-hub loads it with `MixtralBackbone.from_preset(folder)` in a
`MixtralCausalLM`, and HF runs it as above. The router's weights are drawn from
N(0, 0.1), twice the rest's spread: router logits of std ~2, whose smallest margin
between a token's second and third expert is 9e-4 to 1.5e-3 per layer over the
512-token prompt, far above float32 rounding, so that no contender routes a token
differently and the logits gate holds at 1e-4 (8e-6 measured on PyTorch). A wider
router (N(0, 0.5): logits of std ~11) failed it at 2.7e-4: the larger logits amplify
the rounding of the softmax over them.

Model: a Llama (vocabulary 4096, D=512, 4 layers, 8 query over 2 key/value heads,
SwiGLU 1408, float32) with random weights. The driver builds it once with
transformers (seeded, nothing downloaded) and saves it as a safetensors checkpoint
in a temporary folder; every contender loads that same checkpoint:

- **keras_attn**: `keras_attn.convert.causal_lm_from_transformers(config, state_dict)`,
  the state dict read with `safetensors.numpy` (no pickle);
- **keras-hub**: `keras_hub.models.LlamaBackbone.from_preset(folder)` (keras-hub's
  own transformers loader) in a `LlamaCausalLM` with a greedy sampler;
- **HF** (PyTorch only): `LlamaForCausalLM.from_pretrained(folder)` with SDPA
  attention (dynamic cache), with eager attention, and with a static cache.

Equivalence first: each worker compares the prompt's logits with the driver's HF
logits (max |diff| / max |HF|) and the greedy tokens with HF's; a contender that
disagrees is reported as such and not timed.

Figures (B=1, prompt P=512, N=128 new greedy tokens; train at B=4, T=512; `--batch 8`:
prefill and generate of 8 rows, row 0 the checked prompt, the train step at B=8):
- prefill: one forward over the prompt (`predict_on_batch` for the Keras models,
  `torch.no_grad()` forward for HF);
- generate: the whole `generate` of N tokens after the P-token prompt;
- decode per token: (generate - prefill) / N;
- train step: `train_on_batch` (SGD, sparse cross-entropy from logits) for the Keras
  models, the same step as a torch loop for HF;
- with `--padded`, keras_attn only: `generate` of a left-padded batch of B=8 prompts
  of mixed lengths (P/8 .. P: the prompt's last tokens) with its `padding_mask`, N new
  tokens (its full-length row must give HF's tokens);
- peak RSS of the worker process (every contender of a backend lives in it).
Each backend runs in a fresh process that builds every contender, warms each up
(JAX and TensorFlow compile there), then times them in turn, round after round;
medians over rounds, the spread (min-max) beside them. Execution is each library's
default: keras_attn's `generate` compiles its loop with XLA on JAX and TensorFlow
(`jit_compile="auto"`) and runs it eagerly under `torch.no_grad()` on PyTorch;
keras-hub's `generate` compiles on JAX and with a plain `tf.function` on TensorFlow;
Keras's `predict_on_batch` and `train_on_batch` run a plain `tf.function` on a CPU-only
TensorFlow (its `jit_compile="auto"` turns XLA off there); PyTorch runs eagerly
everywhere.
"""

import argparse
import json
import os
import sys
import tempfile

from benchmarks import _common as common

DEFAULTS = {"vocab": 4096, "dim": 512, "layers": 4, "heads": 8, "kv_heads": 2,
            "ffn": 1408, "prompt": 512, "new": 128, "train_batch": 4, "rounds": 5,
            "model": "llama", "experts": 8, "top_k": 2}
QUICK = {"vocab": 512, "dim": 128, "layers": 2, "heads": 4, "kv_heads": 2,
         "ffn": 256, "prompt": 64, "new": 16, "train_batch": 2, "rounds": 2,
         "model": "llama", "experts": 8, "top_k": 2}
# --model: transformers' config and model classes, keras-hub's backbone and causal LM.
MODELS = {"llama": ("LlamaConfig", "LlamaForCausalLM", "LlamaBackbone", "LlamaCausalLM"),
          "mixtral": ("MixtralConfig", "MixtralForCausalLM", "MixtralBackbone",
                      "MixtralCausalLM")}
LOGITS_TOLERANCE = 1e-4  # max |diff| / max |HF logits| in float32


# ----------------------------------------------------------------------------
# The checkpoint (driver side).


def make_checkpoint(spec, folder):
    """Save a seeded random `spec["model"]` (`MODELS`) to `folder`, and its reference outputs."""
    import torch
    import transformers

    config_class, model_class = (getattr(transformers, name) for name in MODELS[spec["model"]][:2])
    extra = ({"num_local_experts": spec["experts"], "num_experts_per_tok": spec["top_k"],
              "sliding_window": None, "output_router_logits": False}
             if spec["model"] == "mixtral" else {})
    torch.manual_seed(0)
    config = config_class(vocab_size=spec["vocab"], hidden_size=spec["dim"],
                          intermediate_size=spec["ffn"], num_hidden_layers=spec["layers"],
                          num_attention_heads=spec["heads"],
                          num_key_value_heads=spec["kv_heads"],
                          max_position_embeddings=spec["prompt"] + spec["new"],
                          tie_word_embeddings=False, attn_implementation="sdpa", **extra)
    model = model_class(config).eval()
    with torch.no_grad():  # far from identity: std 0.02 init is too gentle for a check
        for name, parameter in model.named_parameters():
            if parameter.ndim >= 2:  # Mixtral's experts are stacked (E, ., .) tensors
                parameter.normal_(0.0, 0.1 if "router" in name or name.endswith(
                    ".gate.weight") else 0.05)
    common.save_with_reference(model, spec, folder)


# ----------------------------------------------------------------------------
# Contenders (worker side). Each is a dict of callables: logits(prompt) -> numpy,
# generate(prompt) -> numpy tokens (B, P + N), prefill(), generate_run(), train().


def _keras_contender(model, logits, generate, train_inputs, train_targets, **compile_extra):
    import keras
    import numpy as np

    model.compile(optimizer=keras.optimizers.SGD(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  **compile_extra)
    return {"logits": lambda prompt: np.asarray(logits(prompt), "float32"),
            "generate": lambda prompt: np.asarray(generate(prompt)),
            "train": lambda: model.train_on_batch(train_inputs, train_targets)}


def _ours(folder, spec):
    import numpy as np
    from safetensors.numpy import load_file

    from keras_attn.convert import causal_lm_from_transformers

    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    state = load_file(os.path.join(folder, "model.safetensors"))
    lm = causal_lm_from_transformers(config, state)
    length = spec["prompt"] + spec["new"]
    ids, targets = _train_batch(spec)
    contender = _keras_contender(
        lm, lambda prompt: lm.predict_on_batch(prompt.astype("int32")),
        lambda prompt: lm.generate(prompt.astype("int32"), max_length=length),
        ids, targets)
    contender["padded"] = lambda ids, mask: np.asarray(
        lm.generate(ids, max_length=length, padding_mask=mask))
    return contender


def _padded_batch(prompt, batch=8):
    """A left-padded (B, P) batch: row i the last P (i + 1) / B tokens of `prompt` (1, P)."""
    import numpy as np

    P = prompt.shape[1]
    ids, mask = np.zeros((batch, P), "int32"), np.zeros((batch, P), bool)
    for i in range(batch):
        n = max(1, P * (i + 1) // batch)
        ids[i, P - n:], mask[i, P - n:] = prompt[0, P - n:], True
    return ids, mask


def _hub(folder, spec):
    import keras_hub
    import numpy as np

    backbone_class, lm_class = (getattr(keras_hub.models, name)
                                for name in MODELS[spec["model"]][2:])
    backbone = backbone_class.from_preset(folder)
    lm = lm_class(backbone=backbone, preprocessor=None)
    length = spec["prompt"] + spec["new"]
    ids, targets = _train_batch(spec)

    def padded(prompt):
        tokens = np.zeros((len(prompt), length), "int32")
        tokens[:, :prompt.shape[1]] = prompt
        return {"token_ids": tokens, "padding_mask": tokens != 0}

    def logits(prompt):
        return lm.predict_on_batch({"token_ids": prompt.astype("int32"),
                                    "padding_mask": np.ones(prompt.shape, bool)})

    return _keras_contender(
        lm, logits, lambda prompt: lm.generate(padded(prompt), stop_token_ids=None)["token_ids"],
        {"token_ids": ids, "padding_mask": np.ones(ids.shape, bool)}, targets,
        sampler="greedy")


def _hf(folder, spec, attention="sdpa", cache=None):
    import torch
    import transformers

    model_class = getattr(transformers, MODELS[spec["model"]][1])
    model = model_class.from_pretrained(folder, attn_implementation=attention).eval()
    ids, targets = (torch.as_tensor(a, dtype=torch.long) for a in _train_batch(spec))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    extra = {"cache_implementation": cache} if cache else {}

    def logits(prompt):
        with torch.no_grad():
            return model(torch.as_tensor(prompt)).logits.numpy()

    def generate(prompt):
        with torch.no_grad():
            return model.generate(torch.as_tensor(prompt), max_new_tokens=spec["new"],
                                  min_new_tokens=spec["new"], do_sample=False,
                                  pad_token_id=0, **extra).numpy()

    def train():
        loss = torch.nn.functional.cross_entropy(model(ids).logits.reshape(-1, spec["vocab"]),
                                                 targets.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        model.zero_grad(set_to_none=True)

    return {"logits": logits, "generate": generate, "train": train}


def _train_batch(spec):
    import numpy as np

    rng = np.random.default_rng(2)
    ids = rng.integers(1, spec["vocab"], (spec["train_batch"], spec["prompt"])).astype("int32")
    return ids, np.roll(ids, -1, axis=-1)


def worker(spec):
    import numpy as np

    from keras_attn import _device

    _device.single_cpu_thread_for_small_ops()
    folder, backend = spec["folder"], spec["backend"]
    reference = np.load(os.path.join(folder, "reference.npz"))
    prompt = reference["prompt"]
    if spec.get("batch", 1) > 1:  # row 0 the reference prompt, the others seeded random
        rest = np.random.default_rng(3).integers(1, spec["vocab"],
                                                 (spec["batch"] - 1, prompt.shape[1]))
        prompt = np.concatenate([prompt, rest]).astype(prompt.dtype)
    builders = {"keras_attn": _ours}
    try:
        import keras_hub  # noqa: F401

        builders["keras_hub"] = _hub
    except ImportError as error:
        notes = {"keras_hub": f"not installed ({error})"}
    else:
        notes = {}
    if backend == "torch":
        builders.update({
            "hf_sdpa": _hf,
            "hf_eager": lambda *a: _hf(*a, attention="eager"),
            "hf_static": lambda *a: _hf(*a, cache="static")})
    contenders, checks = {}, {}
    for name, build in builders.items():
        print(f"[models] {backend}: building and checking {name}", file=sys.stderr, flush=True)
        contender = build(folder, spec)
        logits = contender["logits"](prompt)[:1]
        scale = float(np.max(np.abs(reference["logits"])))
        error = float(np.max(np.abs(logits - reference["logits"]))) / scale
        tokens = contender["generate"](prompt)  # also the warm-up (compiles on JAX, TF)
        same = bool(np.array_equal(tokens[:1], reference["tokens"]))
        checks[name] = {"logits_rel_error": error, "tokens_equal": same}
        if error <= LOGITS_TOLERANCE and same:
            contender["train"]()  # warm-up
            # JAX compiles keras_attn's kept generate loop once more after the first train
            # step (the updated variables reach it as new arrays: one extra compile, then
            # none; measured 7.0 s then 0.02 s). Paid here, not in the first round.
            contender["generate"](prompt)
            contenders[name] = contender
        else:
            notes[name] = f"not equivalent: logits {error:.1e}, tokens equal {same}"
    runs = {}
    for name, c in contenders.items():
        runs[f"{name}/prefill"] = lambda c=c: c["logits"](prompt)
        runs[f"{name}/generate"] = lambda c=c: c["generate"](prompt)
        runs[f"{name}/train"] = c["train"]
    print(f"[models] {backend}: timing {len(contenders)} contenders, {spec['rounds']} rounds",
          file=sys.stderr, flush=True)
    if spec.get("padded") and "keras_attn" in contenders:
        padded = contenders["keras_attn"]["padded"]
        ids, mask = _padded_batch(prompt)
        tokens = padded(ids, mask)  # the warm-up; its last row is the whole prompt
        checks["keras_attn"]["padded_tokens_equal"] = bool(
            np.array_equal(tokens[-1:], reference["tokens"]))
        runs["keras_attn/padded_generate"] = lambda: padded(ids, mask)
    rounds = common.interleaved(runs, spec["rounds"])
    times = common.medians(rounds)
    result = {"checks": checks, "notes": notes, "info": _device.describe(),
              "peak_rss_gib": common.peak_rss_gib(), "ms": {}, "spread": {}}
    for name in contenders:
        prefill, generate = times[f"{name}/prefill"], times[f"{name}/generate"]
        result["ms"][name] = {"prefill": prefill * 1e3, "generate": generate * 1e3,
                              "decode": (generate - prefill) / spec["new"] * 1e3,
                              "train": times[f"{name}/train"] * 1e3}
        # min-max over rounds; a round's decode is its generate less its prefill, both
        # timed in that round
        per_round = {figure: [t * 1e3 for t in rounds[f"{name}/{figure}"]]
                     for figure in ("prefill", "generate", "train")}
        per_round["decode"] = [(g - p) / spec["new"] for g, p in
                               zip(per_round["generate"], per_round["prefill"])]
        result["spread"][name] = {k: [min(v), max(v)] for k, v in per_round.items()}
    if "keras_attn/padded_generate" in times:
        result["ms"]["keras_attn"]["padded_generate_b8"] = (
            times["keras_attn/padded_generate"] * 1e3)
    return result


# ----------------------------------------------------------------------------
# Driver side.


FIGURES = ("prefill", "decode", "generate", "train")


def _cell(median, spread, digits):
    """`median (min-max)` over the rounds."""
    text = f"{median:.{digits}f}"
    return text if not spread else text + f" ({spread[0]:.{digits}f}-{spread[1]:.{digits}f})"


def table(results, spec):
    moe = (f", {spec['experts']} experts top-{spec['top_k']}"
           if spec.get("model") == "mixtral" else "")
    lines = [f"{spec.get('model', 'llama').capitalize()}: vocabulary {spec['vocab']}, "
             f"D={spec['dim']}, {spec['layers']} layers, "
             f"H={spec['heads']}/{spec['kv_heads']}, FFN {spec['ffn']}{moe}, float32; "
             f"B={spec.get('batch', 1)}, prompt "
             f"{spec['prompt']}, {spec['new']} greedy tokens; train B={spec['train_batch']}; "
             f"ms, medians (min-max) of {spec['rounds']} interleaved rounds", "",
             "| backend | contender | logits rel. error | tokens | prefill | decode / token "
             "| generate | train step | keras_attn / it (prefill, decode, train) |",
             "|---|---|---:|---|---:|---:|---:|---:|---|"]
    for backend, r in results.items():
        if "error" in r:
            lines.append(f"| {backend} | error: {r['error']} | | | | | | | |")
            continue
        ours = r["ms"].get("keras_attn")
        for name, check in r["checks"].items():
            ms = r["ms"].get(name)
            spread = r.get("spread", {}).get(name, {})
            cells = ([_cell(ms[k], spread.get(k), 2 if k == "decode" else 1) for k in FIGURES]
                     if ms else [r["notes"].get(name, "not timed")] + [""] * 3)
            ratio = ("" if not (ms and ours and name != "keras_attn") else
                     ", ".join(f"{ours[k] / ms[k]:.2f}" for k in ("prefill", "decode", "train")))
            lines.append(f"| {backend} | {name} | {check['logits_rel_error']:.1e} | "
                         f"{'same' if check['tokens_equal'] else 'DIFFER'} | "
                         + " | ".join(cells) + f" | {ratio} |")
        for name, note in r["notes"].items():
            if name not in r["checks"]:
                lines.append(f"| {backend} | {name} | | | {note} | | | | |")
        if ours and "padded_generate_b8" in ours:
            lines.append(f"| {backend} | keras_attn, B=8 mixed lengths (--padded) | | "
                         f"{'same' if r['checks']['keras_attn']['padded_tokens_equal'] else 'DIFFER'}"
                         f" | | | {ours['padded_generate_b8']:.1f} | | |")
        lines.append(f"| {backend} | (worker peak RSS {r['peak_rss_gib']:.2f} GiB) "
                     "| | | | | | | |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_options(parser, backend="list", quick="small smoke sizes",
                       rounds=("--rounds", None, "timing rounds (default 5)"),
                       timeout=("--timeout", 1800, "seconds per backend"),
                       json_help="write the results here")
    parser.add_argument("--model", choices=sorted(MODELS), default="llama",
                        help="the architecture (default llama; mixtral: 8 experts, top-2)")
    parser.add_argument("--batch", type=int, default=1,
                        help="B of the prefill and generate, and of the train step when "
                        "above 1 (default 1; the train step then at B=4)")
    parser.add_argument("--padded", action="store_true",
                        help="also time keras_attn's generate of a padded B=8 batch")
    args = parser.parse_args(argv)
    if args.worker:
        return common.worker_main(worker, args.worker)
    spec = dict(QUICK if args.quick else DEFAULTS, model=args.model)
    if args.rounds:
        spec["rounds"] = args.rounds
    spec["padded"] = args.padded
    if args.batch < 1:
        parser.error(f"--batch must be at least 1. Received: --batch {args.batch}")
    spec["batch"] = args.batch
    if args.batch > 1:
        spec["train_batch"] = args.batch
    with tempfile.TemporaryDirectory() as folder:
        print("[models] building the transformers checkpoint ...", file=sys.stderr, flush=True)
        make_checkpoint(spec, folder)
        common.run_backends("benchmarks.models", spec, args, table, extra={"folder": folder})
    return 0


if __name__ == "__main__":
    sys.exit(main())
