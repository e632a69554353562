"""`CausalLM.generate`'s kept loop on one replica under a `tf.distribute` strategy.

Keras's TensorFlow `predict_on_batch` runs a model created in (or called from) a
strategy's scope through `strategy.run`, once per replica with the whole batch, and
concatenates the replicas' outputs: `generate` of a `(B, P)` prompt under
`MirroredStrategy` on two devices returned `(2 B, L)` (issue 38), and a model built
outside the scope failed on the second device ("Trying to access resource ... located
in device CPU:0 from device CPU:1"). A decoding loop is one sequence of steps, not data
to split: it runs once, on the default device, in the strategy's cross-replica context
(where a mirrored variable reads as its copy there), from a `tf.function` kept on the
loop (with XLA when the loop's `jit_compile`).
"""

import keras

__all__ = ["predict_on_one_replica"]


def predict_on_one_replica(model, inputs):
    """`model.predict_step((inputs,))` as NumPy, run once, where Keras's `predict_on_batch`
    would run it on each replica of a `tf.distribute` strategy; None elsewhere (no strategy,
    or not TensorFlow: call `predict_on_batch`)."""
    if keras.backend.backend() != "tensorflow":
        return None
    import tensorflow as tf

    # The loop keeps the strategy it was made in (Keras's rule), and reads the current one.
    if not tf.distribute.has_strategy() and model.distribute_strategy is tf.distribute.get_strategy():
        return None
    function = getattr(model, "_one_replica_function", None)
    if function is None:
        function = tf.function(lambda x: model.predict_step((x,)),
                               jit_compile=bool(model.jit_compile))
        model._one_replica_function = function
    outputs = function(tf.nest.map_structure(tf.convert_to_tensor, inputs))
    return tf.nest.map_structure(lambda t: t.numpy(), outputs)
