"""One process of a data-parallel job (started by tests/test_data_parallel.py).

    python tests/data_parallel_worker.py torch PORT WORLD_SIZE RANK DROPOUT OUT
    python tests/data_parallel_worker.py tensorflow IMPLEMENTATION OUT.npz

torch: joins a gloo process group on 127.0.0.1:PORT, wraps the model of
tests/data_parallel_model.py in `torch.nn.parallel.DistributedDataParallel`
(as Keras's torch guide does, on CPU so without `device_ids`) and trains it
on this rank's rows of each global batch. Each rank writes its trained
weights, its per-step losses and the attention paths that ran during
training to OUT.rankR.npz.

tensorflow: splits the CPU into 2 logical devices (which must happen before
TensorFlow starts, hence a process of its own), builds and compiles the
model inside `tf.distribute.MirroredStrategy` over them and runs `model.fit`
on the global batches; then trains the same model on one device, without a
strategy, in the same process. Writes both sets of weights to OUT.npz.
"""

import gc
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _count_paths():
    """A Counter of the attention paths chosen from now on, in every thread.

    `observe_paths()` is scoped to a context, and tf.distribute runs each
    replica in a thread of its own, so the workers count at the source.
    """
    import collections

    from keras_attn import _policy

    taken = collections.Counter()
    record = _policy.record_path

    def counting(path):
        taken[path] += 1
        return record(path)

    _policy.record_path = counting
    return taken


def _paths(taken):
    return np.asarray(sorted(path for path, count in taken.items() if count))


def torch_worker(port, world_size, rank, dropout, out_path):
    os.environ["KERAS_BACKEND"] = "torch"
    import torch
    import torch.distributed as dist

    from tests import data_parallel_model as dp

    torch.set_num_threads(1)  # two processes on two cores
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            world_size=world_size, rank=rank)
    try:
        model = dp.build_model(dropout=dropout)
        ddp_model = torch.nn.parallel.DistributedDataParallel(model)
        tokens, targets = dp.make_data()
        rows = dp.GLOBAL_BATCH // world_size
        local = slice(rank * rows, (rank + 1) * rows)
        taken = _count_paths()
        losses = dp.torch_train(ddp_model, tokens[:, local], targets[:, local])
        np.savez(f"{out_path}.rank{rank}.npz", *dp.weights_of(model),
                 losses=np.asarray(losses), paths=_paths(taken))
        dist.barrier()
        # The Reducer before the group: the other order can deadlock in torch 2.13
        # (keras_attn/demo/data_parallel.py says why).
        del ddp_model
        gc.collect()
    finally:
        dist.destroy_process_group()


def tensorflow_worker(implementation, out_path):
    os.environ["KERAS_BACKEND"] = "tensorflow"
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras

    from tests import data_parallel_model as dp

    tokens, targets = dp.make_data()

    def fit(model):
        model.compile(optimizer=keras.optimizers.SGD(dp.LEARNING_RATE),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        history = model.fit(tokens.reshape(-1, dp.T), targets.reshape(-1, dp.T),
                            batch_size=dp.GLOBAL_BATCH, epochs=1, shuffle=False, verbose=0)
        return history

    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    strategy = tf.distribute.MirroredStrategy(devices)
    with strategy.scope():
        mirrored = dp.build_model(implementation)
        taken = _count_paths()  # from here on: the replicas' traces, not the build
        fit(mirrored)
    single = dp.build_model(implementation)
    fit(single)
    np.savez(out_path, *dp.weights_of(mirrored), *dp.weights_of(single),
             replicas=strategy.num_replicas_in_sync, paths=_paths(taken))


if __name__ == "__main__":
    if sys.argv[1] == "torch":
        torch_worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]),
                     sys.argv[6])
    else:
        tensorflow_worker(sys.argv[2], sys.argv[3])
