"""Which form of the q/k/v/o projections is faster on each backend: einsum or matmul?

    python -m benchmarks.projection_forms                 # every backend, default sizes
    python -m benchmarks.projection_forms --backend torch --quick

`keras_attn.layers._projection` runs a plain (no LoRA, not quantized, not float16)
projection as one `ops.einsum` over the `(in, H, d)` view of the `Dense` kernel, or as
one `ops.matmul` over the 2-D kernel and a free reshape (`projection_form`): the same
weights, the same numbers up to rounding. `keras_attn._device.PROJECTION_FORMS` says
which each backend uses; this benchmark is what it rests on (issue 37 item 1).

Per backend, in a fresh process: two `keras_attn.CausalLM`s with the same random
weights (a Llama: vocabulary 4096, D=512, 4 layers, 8 query over 2 key/value heads of
64, SwiGLU 1408, float32), one traced and run with each form (the `"projection_form"`
hook set while it traces, and around every call, so that PyTorch's eager calls use it
too). Timed in turn, round after round: prefill (`predict_on_batch`, B=1, T=512),
`generate` of 32 tokens after a 64-token prompt (decode per token: its time / 32), and a
train step (`train_on_batch`, B=4, T=512, SGD). Medians, min-max, and the ratio
matmul / einsum (below 1: matmul faster). The two models' logits must agree (1e-5
relative) or the backend is reported as not equivalent.
"""

import argparse
import statistics
import sys

from benchmarks import _common as common

DEFAULTS = {"vocab": 4096, "dim": 512, "layers": 4, "heads": 8, "kv_heads": 2, "ffn": 1408,
            "prompt": 512, "short": 64, "new": 32, "train_batch": 4, "rounds": 5}
QUICK = {"vocab": 256, "dim": 64, "layers": 2, "heads": 4, "kv_heads": 2, "ffn": 128,
         "prompt": 32, "short": 8, "new": 4, "train_batch": 2, "rounds": 2}
FORMS = ("einsum", "matmul")
FIGURES = ("prefill", "decode", "train")


def _model(spec):
    import keras

    import keras_attn

    keras.utils.set_random_seed(0)
    blocks = [keras_attn.TransformerDecoderLayer(
        spec["heads"], intermediate_dim=spec["ffn"], key_dim=spec["dim"] // spec["heads"],
        num_key_value_heads=spec["kv_heads"], rope_max_wavelength=1e4, normalization="rms",
        normalize_first=True, gated_feed_forward=True, activation="silu", use_bias=False)
        for _ in range(spec["layers"])]
    lm = keras_attn.CausalLM(spec["vocab"], spec["dim"], blocks, normalization="rms")
    lm.compile(optimizer=keras.optimizers.SGD(1e-3),
               loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return lm


def worker(spec):
    import numpy as np

    from keras_attn import _device, _hooks

    _device.single_cpu_thread_for_small_ops()
    rng = np.random.default_rng(0)
    prompt = rng.integers(1, spec["vocab"], (1, spec["prompt"])).astype("int32")
    short = prompt[:, :spec["short"]]
    ids = rng.integers(1, spec["vocab"], (spec["train_batch"], spec["prompt"])).astype("int32")
    targets = np.roll(ids, -1, axis=-1)
    length = spec["short"] + spec["new"]
    models, runs = {}, {}
    for form in FORMS:
        def using(fn, form=form):
            def run():
                _hooks.set("projection_form", lambda: form)
                return fn()
            return run
        lm = models[form] = _model(spec)
        if form != FORMS[0]:
            lm.set_weights(models[FORMS[0]].get_weights())
        runs[f"{form}/prefill"] = using(lambda lm=lm: lm.predict_on_batch(prompt))
        runs[f"{form}/generate"] = using(lambda lm=lm: lm.generate(short, max_length=length))
        runs[f"{form}/train"] = using(lambda lm=lm: lm.train_on_batch(ids, targets))
    print(f"[projection_forms] {_device.describe()['backend']}: warming up", file=sys.stderr,
          flush=True)
    logits = {}
    for form in FORMS:  # traced under its own form (JAX and TensorFlow compile here)
        logits[form] = np.asarray(runs[f"{form}/prefill"]())
        runs[f"{form}/generate"]()
    scale = float(np.abs(logits["einsum"]).max())
    error = float(np.abs(logits["matmul"] - logits["einsum"]).max()) / scale
    if error > 1e-5:
        return {"error": f"the forms disagree: {error:.1e}"}
    for form in FORMS:  # then the train step (after it, the weights differ: prefill first)
        runs[f"{form}/train"]()
        runs[f"{form}/generate"]()  # JAX recompiles the kept loop once after training
    print(f"[projection_forms] timing {spec['rounds']} rounds", file=sys.stderr, flush=True)
    times = common.interleaved(runs, spec["rounds"])
    result = {"info": _device.describe(), "logits_rel_difference": error, "ms": {}}
    for form in FORMS:
        prefill = [t * 1e3 for t in times[f"{form}/prefill"]]
        decode = [t * 1e3 / spec["new"] for t in times[f"{form}/generate"]]
        train = [t * 1e3 for t in times[f"{form}/train"]]
        result["ms"][form] = {"prefill": prefill, "decode": decode, "train": train}
    return result


def table(results, spec):
    lines = [f"Llama: vocabulary {spec['vocab']}, D={spec['dim']}, {spec['layers']} layers, "
             f"H={spec['heads']}/{spec['kv_heads']}, FFN {spec['ffn']}, float32; prefill "
             f"B=1 T={spec['prompt']}; decode: generate {spec['new']} tokens after "
             f"{spec['short']}, per token; train B={spec['train_batch']} T={spec['prompt']}; "
             f"ms, medians (min-max) of {spec['rounds']} interleaved rounds", "",
             "| backend | figure | einsum | matmul | matmul / einsum |", "|---|---|---:|---:|---:|"]
    for backend, r in results.items():
        if "error" in r:
            lines.append(f"| {backend} | error: {r['error']} | | | |")
            continue
        for figure in FIGURES:
            cells, medians = [], {}
            for form in FORMS:
                values = r["ms"][form][figure]
                medians[form] = statistics.median(values)
                cells.append(f"{medians[form]:.2f} ({min(values):.2f}-{max(values):.2f})")
            lines.append(f"| {backend} | {figure} | {cells[0]} | {cells[1]} | "
                         f"{medians['matmul'] / medians['einsum']:.2f} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_options(parser, backend="list", quick="small smoke sizes",
                       rounds=("--rounds", None, "timing rounds (default 5)"),
                       timeout=("--timeout", 1800, "seconds per backend"),
                       json_help="write the results here")
    args = parser.parse_args(argv)
    if args.worker:
        return common.worker_main(worker, args.worker)
    spec = dict(QUICK if args.quick else DEFAULTS)
    if args.rounds:
        spec["rounds"] = args.rounds
    common.run_backends("benchmarks.projection_forms", spec, args, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
