"""`CausalLM.generate` under `tf.distribute.MirroredStrategy` (started by
tests/models/test_serving_context.py).

    python tests/serving_worker.py OUT.npz

Splits the CPU into 2 logical devices (before TensorFlow starts, hence a process of its
own), makes a small model outside any strategy and generates with it (greedy with XLA,
TensorFlow's default, and without; seeded sampling); then, over both devices, with a copy
made in the strategy's scope, and greedily with the outside model called in the scope
and with the scoped copy called outside it. Writes each case's
tokens, and whether the one-replica path ran, to OUT.npz.
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(out_path):
    os.environ["KERAS_BACKEND"] = "tensorflow"
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

    from keras_attn.models._generate_loop import loops_of
    from tests.models.test_serving_context import PROMPTS, make_lm

    def cases(lm):
        """Greedy with XLA (TF's default) and without; seeded sampling."""
        return {"greedy": lm.generate(PROMPTS, 9),
                "greedy_graph": lm.generate(PROMPTS, 9, jit_compile=False),
                "sampled": lm.generate(PROMPTS, 9, temperature=1.0, seed=4)}

    results = {}
    outside = make_lm()
    results.update({f"unscoped/{k}": v for k, v in cases(outside).items()})
    outside_loops = len(loops_of(outside))
    strategy = tf.distribute.MirroredStrategy(
        [d.name for d in tf.config.list_logical_devices("CPU")])
    results["replicas"] = strategy.num_replicas_in_sync
    with strategy.scope():
        scoped = make_lm(weights=outside.get_weights())
        results.update({f"scoped/{k}": v for k, v in cases(scoped).items()})
        results["outside_model_in_scope/greedy"] = outside.generate(PROMPTS, 9)
    results["scoped_model_outside/greedy"] = scoped.generate(PROMPTS, 9)
    # The path: the one-replica function ran for every kept loop made or called in the scope.
    results["one_replica_loops"] = sum(hasattr(loop, "_one_replica_function")
                                       for loop in loops_of(scoped).values())
    results["scoped_loops"] = len(loops_of(scoped))
    results["outside_one_replica_loops"] = sum(
        hasattr(loop, "_one_replica_function") for loop in loops_of(outside).values())
    results["outside_loops"] = outside_loops, len(loops_of(outside))
    np.savez(out_path, **{k: np.asarray(v) for k, v in results.items()})


if __name__ == "__main__":
    main(sys.argv[1])
