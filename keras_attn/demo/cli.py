"""The `keras-attn demo` command: options, checks, train, decode, save, reload."""

import argparse
import contextlib
import os
import sys
import tempfile
import time

import numpy as np

__all__ = ["add_arguments", "run"]

_TASKS = ("reverse", "sort", "copy", "add")
# Defaults of the sequence tasks (reverse, sort, copy); `add` has its own
# (keras_attn.demo.add_command.ADD_DEFAULTS).
_DEFAULTS = {"epochs": 4, "num_train": 16000, "num_test": 1000, "model_dim": 64,
             "num_layers": 2, "batch_size": 128, "learning_rate": 3e-3}


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _model_dim(text):
    value = _positive_int(text)
    if value % 4:
        raise argparse.ArgumentTypeError(
            f"expected a multiple of 4 (the number of heads), got {text!r}")
    return value


def _positive_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def add_arguments(parser):
    """The demo's options; defaults reach >= 95% on reversal in minutes on a CPU."""
    parser.add_argument("--task", choices=_TASKS, default="reverse",
                        help="what the model learns to do to a digit sequence (default: "
                             "reverse); 'add': a decoder-only model learns addition "
                             "('123+458=' -> '1850': it writes the answer least significant "
                             "digit first; the command prints answers in the usual order, "
                             "'0581')")
    parser.add_argument("--epochs", type=_positive_int, default=None,
                        help="training epochs (default: 4, add: 6; 1 gives a quick smoke run)")
    parser.add_argument("--seed", type=int, default=0, help="data and weights seed (default: 0)")
    parser.add_argument("--output", default="keras-attn-demo", metavar="DIR",
                        help="where the .keras model is saved (default: ./keras-attn-demo)")
    parser.add_argument("--num-train", type=_positive_int, default=None,
                        help="training sequences (default: 16000, add: 40000)")
    parser.add_argument("--num-test", type=_positive_int, default=None,
                        help="held-out sequences, never seen in training (default: 1000)")
    parser.add_argument("--max-length", type=_positive_int, default=10,
                        help="longest sequence; lengths vary from 2 (default: 10; "
                             "not for add)")
    parser.add_argument("--digits", type=_positive_int, default=3,
                        help="add only: digits of each operand (default: 3)")
    parser.add_argument("--model-dim", type=_model_dim, default=None,
                        help="model width, a multiple of the 4 heads (default: 64)")
    parser.add_argument("--num-layers", type=_positive_int, default=None,
                        help="encoder layers, and as many decoder layers; add: decoder "
                             "layers (default: 2, add: 3)")
    parser.add_argument("--batch-size", type=_positive_int, default=None,
                        help="training batch size (default: 128)")
    parser.add_argument("--learning-rate", type=_positive_float, default=None,
                        help="peak Adam learning rate (default: 0.003)")
    parser.add_argument("--examples", type=int, default=5,
                        help="held-out examples to print (default: 5)")
    parser.add_argument("--distribute", choices=("data", "model"), default=None,
                        help="'data': data-parallel training with the backend's own engine "
                             "(JAX: keras.distribution.DataParallel over every device; "
                             "TensorFlow: MirroredStrategy over every GPU, else 2 logical "
                             "CPUs; PyTorch: DistributedDataParallel, a process per GPU, "
                             "else 2 on CPU). 'model': ModelParallel with "
                             "keras_attn.distribution.get_layout_map, JAX only")


def _distribution(kind, batch_size):
    """`(distribution, description)` over every visible device, or raise ValueError."""
    import math

    import keras

    from keras_attn.distribution import get_layout_map

    devices = keras.distribution.list_devices()
    n = len(devices)
    if kind == "data":
        mesh_shape, names = (n,), ("batch",)
        distribution = keras.distribution.DataParallel(devices=devices)
    else:
        model_size = math.gcd(n, 4)  # the demo's 4 heads split evenly
        mesh_shape, names = (n // model_size, model_size), ("batch", "model")
        mesh = keras.distribution.DeviceMesh(mesh_shape, names, devices=devices)
        distribution = keras.distribution.ModelParallel(layout_map=get_layout_map(mesh))
    if batch_size % mesh_shape[0]:
        raise ValueError(f"--batch-size {batch_size} must be divisible by the {mesh_shape[0]} "
                         "devices of the mesh's batch axis")
    return distribution, (f"{type(distribution).__name__} on {n} device(s), mesh "
                          f"{dict(zip(names, mesh_shape, strict=True))}")


def _output_problem(path):
    """Why `path` cannot take the model file, or None if it can."""
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test-"):
            pass
    except OSError as error:
        return error.strerror or str(error)
    return None


def _fail(message):
    print(f"keras-attn demo: error: {message}", file=sys.stderr)
    return 2


def run(args):
    """Train, evaluate, save, reload and compare; 0 on success."""
    from keras_attn.demo.add_command import ADD_DEFAULTS, run_add

    defaults = ADD_DEFAULTS if args.task == "add" else _DEFAULTS
    for name, value in defaults.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    min_length = min(2, args.max_length)
    problem = _output_problem(args.output)
    if problem:
        return _fail(f"cannot write to --output {args.output!r}: {problem}")

    import keras

    from keras_attn import _device, cli
    from keras_attn.demo.data import VOCAB_SIZE, decode_tokens, make_split
    from keras_attn.demo.decode import cached_decode, exact_match, greedy_decode
    from keras_attn.demo.model import build_model, compile_for_training, learning_rate_schedule

    start = time.perf_counter()
    info = _device.describe()
    print(f"backend: {info['backend']} {info['backend_version']} (keras {info['keras']}), "
          f"device: {info['device']}")
    if args.distribute == "model" and info["backend"] != "jax":
        return _fail(f"--distribute model needs the JAX backend: Keras implements "
                     f"layouts (keras.distribution) on JAX only (this is "
                     f"{info['backend']}); set KERAS_BACKEND=jax, or use --distribute data")
    if info["backend"] == "numpy":
        return _fail("the numpy backend cannot train; set KERAS_BACKEND to jax, torch "
                     "or tensorflow")
    if args.distribute and args.task == "add":
        return _fail("--distribute is for the sequence tasks, not --task add")
    distribution = None
    if args.distribute and info["backend"] == "tensorflow":
        from keras_attn.demo.data_parallel import mirrored_strategy

        # Before anything starts TensorFlow's runtime: it may split the CPU.
        distribution, description = mirrored_strategy()
        if args.batch_size % distribution.num_replicas_in_sync:
            return _fail(f"--batch-size {args.batch_size} must be divisible by the "
                         f"{distribution.num_replicas_in_sync} replicas")
        print(f"distribution: {description}")
    elif args.distribute and info["backend"] == "torch":
        from keras_attn.demo.data_parallel import torch_processes

        print(f"distribution: DistributedDataParallel over {torch_processes()} "
              "process(es)")
    elif args.distribute:
        try:
            distribution, description = _distribution(args.distribute, args.batch_size)
        except ValueError as error:
            return _fail(str(error))
        print(f"distribution: {description}")
    _device.single_cpu_thread_for_small_ops()
    if args.task == "add":
        return run_add(args, _fail)
    cli.set_random_seed(args.seed)  # quiet: Keras imports TensorFlow to seed it
    try:
        train, test = make_split(args.task, args.num_train, args.num_test, min_length,
                                 args.max_length, args.seed)
    except ValueError as error:
        return _fail(str(error))
    target_length = args.max_length + 1
    print(f"task: {args.task} digit sequences of length {min_length}..{args.max_length}; "
          f"{len(train[0])} training, {len(test[0])} held-out")

    # Under a distribution, variables are laid out when they are created and
    # the batches of `fit` are split across the mesh's batch axis.
    scope = distribution.scope if distribution is not None else contextlib.nullcontext
    build_kwargs = dict(vocab_size=VOCAB_SIZE, source_length=args.max_length,
                        target_length=target_length, model_dim=args.model_dim,
                        intermediate_dim=2 * args.model_dim, num_heads=4,
                        num_layers=args.num_layers, name=f"{args.task}_transformer")
    with scope():
        model = build_model(**build_kwargs)
    steps = args.epochs * -(-len(train[0]) // args.batch_size)
    torch_ddp = bool(args.distribute) and info["backend"] == "torch"
    if not torch_ddp:  # DDP trains with a torch optimizer, in processes of its own
        with scope():
            compile_for_training(model, steps, args.learning_rate)
    print(f"model: {args.num_layers} encoder + {args.num_layers} decoder layers, "
          f"width {args.model_dim}, 4 heads, {model.count_params():,} parameters")

    sources, decoder_inputs, targets = train
    fit_start = time.perf_counter()
    # Weight 0 on padding, so the loss and the token accuracy count real tokens only.
    weights = (targets != 0).astype("float32")
    if torch_ddp:
        from keras_attn.demo.data_parallel import torch_data_parallel_fit

        try:
            torch_data_parallel_fit(model, build_model, build_kwargs, train, epochs=args.epochs,
                                    batch_size=args.batch_size,
                                    schedule=learning_rate_schedule(steps, args.learning_rate),
                                    seed=args.seed)
        except ValueError as error:
            return _fail(str(error))
    else:
        with scope():
            model.fit([sources, decoder_inputs], targets, sample_weight=weights,
                      batch_size=args.batch_size,
                      epochs=args.epochs, verbose=1)
    fit_seconds = time.perf_counter() - fit_start
    if args.distribute and info["backend"] == "tensorflow":
        # Decode on one device: Keras 3.15's predict_on_batch on a model made in a
        # MirroredStrategy scope returns every replica's copy of the batch (2B rows).
        trained = model
        model = build_model(**build_kwargs)
        model.set_weights(trained.get_weights())

    test_sources, _, test_targets = test
    predicted = greedy_decode(model, test_sources, target_length)
    correct = exact_match(predicted, test_targets)
    accuracy = float(correct.mean())
    print(f"\nexact-sequence accuracy (greedy decoding, {len(correct)} held-out): "
          f"{100 * accuracy:.1f}%")
    for i in range(min(args.examples, len(correct))):
        mark = "ok" if correct[i] else "WRONG"
        print(f"  {decode_tokens(test_sources[i]):>{args.max_length}} -> "
              f"{decode_tokens(predicted[i]):>{args.max_length}}  "
              f"(target {decode_tokens(test_targets[i])}) {mark}")

    # The same decoding through keras_attn.generation.generate, with a key/value
    # cache per decoder layer: it must give the same sequences.
    cached = cached_decode(model, test_sources, target_length)
    agree = exact_match(cached, predicted)
    print(f"cached decoding (generate, key/value caches) gives the same sequences as "
          f"uncached: {'yes' if agree.all() else 'NO'} ({int(agree.sum())} of {len(agree)})")

    path = os.path.join(args.output, f"{args.task}.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path)
    again = greedy_decode(reloaded, test_sources, target_length)
    same = bool(np.array_equal(predicted, again))
    print(f"saved {path}; reloaded model decodes identically: {'yes' if same else 'NO'}")
    total = time.perf_counter() - start
    print(f"time: {fit_seconds:.0f} s training, {total:.0f} s in all")
    if not agree.all():
        return _fail(f"cached decoding differs from uncached decoding on "
                     f"{int((~agree).sum())} of {len(agree)} held-out sequences")
    if not same:
        differ = int(np.sum(np.any(predicted != again, axis=-1)))
        return _fail(f"the reloaded model decodes {differ} of {len(correct)} held-out "
                     "sequences differently")
    return 0
