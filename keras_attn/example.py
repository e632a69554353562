"""`keras-attn example`: a small Functional model built from these layers."""

import numpy as np

__all__ = ["add_arguments", "build_model", "run"]


def add_arguments(parser):
    parser.add_argument("--seed", type=int, default=0, help="weights and inputs seed")


def build_model(vocab_size=20, length=8, model_dim=16, num_heads=2):
    """Embedding(mask_zero) -> encoder -> decoder-only block -> pooled logits."""
    import keras

    import keras_attn

    tokens = keras.Input((length,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(vocab_size, model_dim, mask_zero=True)(tokens)
    x = keras_attn.TransformerEncoderLayer(num_heads, intermediate_dim=2 * model_dim, name="encoder")(x)
    x = keras_attn.TransformerDecoderLayer(num_heads, intermediate_dim=2 * model_dim, name="decoder")(x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    outputs = keras.layers.Dense(2, name="logits")(x)
    return keras.Model(tokens, outputs, name="keras_attn_example")


def run(args):
    import keras

    from keras_attn import _device, cli

    info = _device.describe()
    print(f"backend: {info['backend']} {info['backend_version']} (keras {info['keras']}), "
          f"device: {info['device']}")
    cli.set_random_seed(args.seed)  # quiet: Keras imports TensorFlow to seed it
    model = build_model()
    model.summary()
    tokens = np.array([[3, 5, 7, 0, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6, 7, 8]], "int32")
    print("logits:\n", np.round(keras.ops.convert_to_numpy(model(tokens)), 4))
    return 0
