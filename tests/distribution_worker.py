"""One process of a data-parallel JAX job (started by tests/test_distribution.py).

    python tests/distribution_worker.py COORDINATOR NUM_PROCESSES PROCESS_ID DATA.npz OUT.json

Joins the job through `keras.distribution.initialize` (coordinator on
127.0.0.1, CPU collectives over gloo), builds the demo's model at tiny size
with the weights in DATA.npz, and trains it under `DataParallel` over every
device of every process, on this process's half of the same global batch,
for a few steps. Writes the per-step losses to OUT.json and the trained
weights to OUT.json.npz.
"""

import json
import os
import sys

os.environ["KERAS_BACKEND"] = "jax"
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"  # 2 local devices


def main(coordinator, num_processes, process_id, data_path, out_path):
    import jax

    # Cross-process collectives on CPU need an implementation (none by default).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    import keras
    import numpy as np

    keras.distribution.initialize(coordinator, num_processes, process_id)
    from keras_attn.demo.model import build_model

    data = np.load(data_path)
    config = json.loads(str(data["config"]))
    devices = keras.distribution.list_devices()
    # Each process passes its own rows (numpy arrays; Keras auto-shards tf.data only).
    distribution = keras.distribution.DataParallel(devices=devices, auto_shard_dataset=False)
    keras.distribution.set_distribution(distribution)

    model = build_model(**config)
    model.set_weights([data[f"w{i}"] for i in range(len(model.weights))])
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(
                      from_logits=True, ignore_class=0))
    # This process's rows of the global batch (Keras assembles the global
    # batch from every process's local part).
    rows = len(data["sources"]) // num_processes
    local = slice(process_id * rows, (process_id + 1) * rows)
    history = model.fit([data["sources"][local], data["decoder_inputs"][local]],
                        data["targets"][local], batch_size=rows,
                        epochs=int(data["steps"]), shuffle=False, verbose=0)
    weights = [np.asarray(keras.ops.convert_to_numpy(w)) for w in model.weights]
    np.savez(out_path + ".npz", *weights)
    with open(out_path, "w") as f:
        json.dump({"process_id": process_id, "devices": len(devices),
                   "local_devices": jax.local_device_count(),
                   "losses": history.history["loss"]}, f)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
