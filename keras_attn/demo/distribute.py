"""`keras-attn demo --distribute data` on TensorFlow and PyTorch, with their own engines.

JAX goes through `keras.distribution` (demo/cli.py). Keras implements that on
JAX only, so the other two backends use what Keras's guides use:

- TensorFlow: `tf.distribute.MirroredStrategy`. The model is built, compiled
  and fitted in the strategy's scope, and `model.fit` splits each batch over
  the replicas. Over every GPU; on a machine without one, over 2 logical CPU
  devices (TensorFlow sees one CPU device however many cores it has), which
  must be configured before TensorFlow starts its runtime.
- PyTorch: `torch.nn.parallel.DistributedDataParallel` in processes started
  by `torch.multiprocessing` (one per GPU with NCCL, or 2 on CPU with gloo),
  trained by a torch loop as in Keras's torch guide: `model.fit` knows
  nothing of DDP. Rank 0 saves the trained weights, and the demo's own
  process loads them and goes on (evaluation, cached decoding, save, reload).
  The GPU variant is not tested here (no GPU on the test machines).

The demo is a tool (DESIGN.md): it may touch backends directly, layers may not.
"""

import os
import socket
import tempfile
import time

__all__ = ["mirrored_strategy", "torch_data_parallel_fit"]

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


def _schedule(total_steps, learning_rate):
    """The demo's Keras schedule (warm-up, cosine) as a function of the step."""
    import keras

    warmup = total_steps // 10
    schedule = keras.optimizers.schedules.CosineDecay(
        0.0, decay_steps=max(1, total_steps - warmup), alpha=0.02,
        warmup_target=learning_rate, warmup_steps=warmup)
    return lambda step: float(keras.ops.convert_to_numpy(schedule(step)))


def _worker(rank, world_size, port, build_kwargs, arrays, settings, weights_path):
    """One DDP process: train on this rank's rows of every global batch."""
    import keras
    import numpy as np
    import torch
    import torch.distributed as dist

    from keras_attn.demo.model import build_model

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
        learning_rate = _schedule(settings["total_steps"], settings["learning_rate"])
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, learning_rate)
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
    finally:
        dist.destroy_process_group()


def torch_data_parallel_fit(model, build_kwargs, train, *, epochs, batch_size,
                            learning_rate, seed):
    """Train `model` (made by `build_model(**build_kwargs)`) with DDP; returns seconds.

    Starts `torch_processes()` processes that build the same model, train it
    on their shares of each global batch of `batch_size`, and hand the
    trained weights back to `model` through a `.weights.h5` file.
    """
    import torch.multiprocessing as mp

    world_size = torch_processes()
    if batch_size % world_size:
        raise ValueError(f"--batch-size {batch_size} must be divisible by the {world_size} "
                         "DDP processes")
    sources, decoder_inputs, targets = train
    settings = {"seed": seed, "epochs": epochs, "batch_size": batch_size,
                "learning_rate": learning_rate,
                "total_steps": epochs * -(-len(sources) // batch_size)}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        weights_path = os.path.join(folder, "ddp.weights.h5")
        # "spawn": fresh interpreters, no copy of this process's threads or torch state.
        mp.start_processes(_worker, nprocs=world_size, join=True, start_method="spawn",
                           args=(world_size, _free_port(), build_kwargs,
                                 (sources, decoder_inputs, targets), settings, weights_path))
        model.load_weights(weights_path)
    return time.perf_counter() - start
