"""Data parallelism with each backend's own engine (`keras-attn demo --distribute data`).

JAX goes through `keras.distribution`, which Keras implements on JAX only:

- TensorFlow: `tf.distribute.MirroredStrategy` over every GPU; on a machine without
  one, over 2 logical CPU devices (TensorFlow sees one CPU device however many
  cores it has), which must be configured before TensorFlow starts its runtime.
- PyTorch: `torch.nn.parallel.DistributedDataParallel` in processes started by
  `torch.multiprocessing` (one per GPU with NCCL, or 2 on CPU with gloo), trained by
  a torch loop as in Keras's torch guide (`model.fit` knows nothing of DDP). Rank 0
  saves the trained weights and the caller's process loads them. The GPU variant
  is not tested here (no GPU on the test machines).

Tearing a DDP process down: the `DistributedDataParallel` wrapper goes first,
then `destroy_process_group()`. In the other order, the wrapper's C++ `Reducer`
holds the last reference to the gloo process group and destroys it with the GIL
held; `~ProcessGroupGloo` joins its worker threads, and one of them may still be
dropping a finished work item whose saved thread-local state holds a Python
object (the `contextvars.Context` that torch 2.13's `backward()` stashes in TLS,
pytorch/pytorch#173568), which needs the GIL: a deadlock (seen as a DDP rank that
never exits, caught with gdb in CI) or, at interpreter exit, "terminate called
without an active exception". Dropped through `destroy_process_group()`, the
group's Python holder destroys it without the GIL, so nothing waits on anyone.

The demo's, not the library's: it uses each backend directly, as the demo and the
tools may (the layers reach a backend only through `keras_attn._device`'s hooks).
Each function imports its backend only when called.
"""

import gc
import os
import socket
import tempfile
import time

import keras

CPU_REPLICAS = 2


def mirrored_strategy():
    """`(strategy, description)`: MirroredStrategy over every GPU, else 2 logical CPUs."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        devices = [device.name for device in tf.config.list_logical_devices("GPU")]
    else:
        cpu = tf.config.list_physical_devices("CPU")[0]
        try:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration()] * CPU_REPLICAS)
        except RuntimeError as error:  # the runtime started already: keep what it has
            if "initialized" not in str(error):
                raise
        devices = [device.name for device in tf.config.list_logical_devices("CPU")]
    strategy = tf.distribute.MirroredStrategy(devices)
    return strategy, (f"MirroredStrategy over {strategy.num_replicas_in_sync} "
                      f"replica(s): {', '.join(devices)}")


def torch_processes():
    """How many DDP processes `torch_data_parallel_fit` starts: one per GPU, else 2."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else CPU_REPLICAS


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ddp_worker(rank, world_size, port, build_model, build_kwargs, arrays, settings,
                weights_path):
    """One DDP process: train on this rank's rows of every global batch."""
    import numpy as np
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    dist.init_process_group("nccl" if cuda else "gloo",
                            init_method=f"tcp://127.0.0.1:{port}",
                            world_size=world_size, rank=rank)
    try:
        keras.utils.set_random_seed(settings["seed"])
        model = build_model(**build_kwargs)
        # DDP broadcasts rank 0's weights here, so every replica starts equal.
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[rank] if cuda else None)
        optimizer = torch.optim.Adam(ddp.parameters(), lr=1.0)
        schedule = settings["schedule"]  # a Keras schedule, evaluated per step
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: float(keras.ops.convert_to_numpy(schedule(step))))
        loss_fn = torch.nn.CrossEntropyLoss(ignore_index=0)  # 0 is padding
        sources, decoder_inputs, targets = arrays
        batch = settings["batch_size"]
        rng = np.random.default_rng(settings["seed"])  # the same order in every rank
        for epoch in range(settings["epochs"]):
            start, losses = time.perf_counter(), []
            order = rng.permutation(len(sources))
            for first in range(0, len(order), batch):
                rows = order[first:first + batch][rank::world_size]  # this rank's share
                logits = ddp([torch.as_tensor(sources[rows]),
                              torch.as_tensor(decoder_inputs[rows])])  # (b, T, V)
                loss = loss_fn(logits.reshape(-1, logits.shape[-1]),
                               torch.as_tensor(targets[rows], dtype=torch.long).reshape(-1))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                scheduler.step()
                losses.append(float(loss.detach()))
            if rank == 0:
                print(f"epoch {epoch + 1}/{settings['epochs']}: loss {np.mean(losses):.4f} "
                      f"(rank 0), {time.perf_counter() - start:.0f} s", flush=True)
        if rank == 0:
            model.save_weights(weights_path)
        dist.barrier()  # nobody tears the group down while another rank still uses it
        del ddp, optimizer, scheduler  # the Reducer before the group (see the top)
        gc.collect()
    finally:
        dist.destroy_process_group()


def torch_data_parallel_fit(model, build_model, build_kwargs, train, *, epochs, batch_size,
                            schedule, seed):
    """Train `model` (made by `build_model(**build_kwargs)`) with DDP; returns seconds.

    Starts `torch_processes()` processes that build the same model (so
    `build_model` must be a module-level function: "spawn" pickles it by
    name), train it on their shares of each global batch of `batch_size`
    (inputs `(sources, decoder_inputs)`, targets with 0 as padding), and hand
    the trained weights back to `model` through a `.weights.h5` file.
    `schedule` is the Keras learning-rate schedule (pickled to each process)
    that a `torch.optim.Adam` follows step by step.
    """
    import torch.multiprocessing as mp

    world_size = torch_processes()
    if batch_size % world_size:
        raise ValueError(f"--batch-size {batch_size} must be divisible by the {world_size} "
                         "DDP processes")
    sources, decoder_inputs, targets = train
    settings = {"seed": seed, "epochs": epochs, "batch_size": batch_size,
                "schedule": schedule}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        weights_path = os.path.join(folder, "ddp.weights.h5")
        # "spawn": fresh interpreters, no copy of this process's threads or torch state.
        mp.start_processes(_ddp_worker, nprocs=world_size, join=True, start_method="spawn",
                           args=(world_size, _free_port(), build_model, build_kwargs,
                                 (sources, decoder_inputs, targets), settings, weights_path))
        model.load_weights(weights_path)
    return time.perf_counter() - start
