"""A dense MLP and a mixture of experts side by side, each with its norms (Gemma 4's
26B-A4B feed-forward, transformers' `Gemma4TextDecoderLayer` with `enable_moe_block`)."""

from collections.abc import Callable

import keras

from keras_attn._typing import Initializer
from keras_attn._validation import check_positive_float, check_positive_int
from keras_attn.layers._common import gelu_approximate
from keras_attn.layers.feed_forward import PositionwiseFeedForward
from keras_attn.layers.mixture_of_experts import MixtureOfExperts

__all__ = ["ParallelMixtureOfExperts"]


@keras.saving.register_keras_serializable(package="keras_attn")
class ParallelMixtureOfExperts(keras.layers.Layer):
    """A gated MLP and a routed mixture of experts in parallel, their normed outputs summed.

    `y = N_1(mlp(N_0(x))) + N_3(experts(N_2(x), routed on x))`: the dense gated MLP
    reads `dense_norm(x)`, its output normalised by `post_dense_norm`; the mixture's
    router reads the input `x` itself (Gemma 4's router: RMS-normalised without a scale,
    times its `router_scale` and `D**-0.5`, softmax over all E experts, the top k
    renormalised, each weight times its expert's `per_expert_scale`) and its experts
    read `experts_norm(x)`, their weighted sum normalised by `post_experts_norm`.

    A block's feed-forward (`feed_forward=`) that normalises its own input: give the
    block `use_feed_forward_norm=False`, so that the router sees the residual stream.
    transformers' names: `pre_feedforward_layernorm` is `dense_norm`,
    `post_feedforward_layernorm_1` `post_dense_norm`, `pre_feedforward_layernorm_2`
    `experts_norm`, `post_feedforward_layernorm_2` `post_experts_norm`; `mlp` is
    `dense`; `router` and `experts` are `experts` (a `keras_attn.MixtureOfExperts`
    with `norm_topk_prob`, `router_input_norm` and `use_per_expert_scale`). The
    block's `post_feed_forward_norm` is Gemma 4's `post_feedforward_layernorm` of the
    sum. RMSNorms multiply by their scale (`Gemma4RMSNorm`, ones at first).

    Shapes: B batch, T length, D width, F `intermediate_dim`, E `num_experts`,
    k `num_experts_per_tok`, F_e `expert_intermediate_dim`.

    Args:
        intermediate_dim: F, the dense MLP's hidden width.
        num_experts: E.
        num_experts_per_tok: k (Gemma 4's `top_k_experts`).
        expert_intermediate_dim: F_e, each expert's hidden width (Gemma 4's
            `moe_intermediate_size`).
        activation: the gates' activation, the MLP's and the experts' (Gemma 4's
            `gelu_pytorch_tanh`: the default).
        epsilon: every norm's epsilon, the router's too (`rms_norm_eps`).
        implementation: the mixture's path, "auto", "dense" or "sparse"
            (`keras_attn.MixtureOfExperts`).
        kernel_initializer: initializer of every kernel.
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: `(B, T, D)`.
        training: passed to the sublayers.

    Returns:
        `(B, T, D)`.

    Example:

    >>> import numpy as np
    >>> ffn = ParallelMixtureOfExperts(intermediate_dim=32, num_experts=4,
    ...                                num_experts_per_tok=2, expert_intermediate_dim=8)
    >>> tuple(ffn(np.ones((2, 5, 16), "float32")).shape)
    (2, 5, 16)
    >>> [w.name for w in ffn.experts.weights[-2:]]
    ['router_scale', 'per_expert_scale']
    """

    def __init__(
        self,
        intermediate_dim: int,
        num_experts: int,
        num_experts_per_tok: int,
        expert_intermediate_dim: int,
        activation: str | Callable = gelu_approximate,
        epsilon: float = 1e-6,
        implementation: str = "auto",
        kernel_initializer: Initializer = "glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.intermediate_dim = check_positive_int("intermediate_dim", intermediate_dim)
        self.expert_intermediate_dim = check_positive_int("expert_intermediate_dim",
                                                          expert_intermediate_dim)
        self.activation = keras.activations.get(activation)
        self.epsilon = check_positive_float("epsilon", epsilon)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        # Made now, so that bad mixture arguments are refused by MixtureOfExperts' checks.
        self.experts = MixtureOfExperts(
            num_experts, num_experts_per_tok, self.expert_intermediate_dim,
            activation=self.activation, norm_topk_prob=True, implementation=implementation,
            kernel_initializer=self.kernel_initializer, router_input_norm=True,
            router_norm_epsilon=self.epsilon, use_per_expert_scale=True,
            dtype=self.dtype_policy, name="experts")
        self.num_experts, self.num_experts_per_tok = num_experts, num_experts_per_tok
        self.implementation = implementation
        self.supports_masking = True

    def _norm(self, name, input_shape):
        norm = keras.layers.RMSNormalization(epsilon=self.epsilon, dtype=self.dtype_policy,
                                             name=name)
        norm.build(input_shape)
        return norm

    def build(self, input_shape):
        input_shape = tuple(input_shape)
        self.dense_norm = self._norm("dense_norm", input_shape)
        self.dense = PositionwiseFeedForward(
            self.intermediate_dim, activation=self.activation, use_bias=False, gated=True,
            kernel_initializer=self.kernel_initializer, dtype=self.dtype_policy, name="dense")
        self.dense.build(input_shape)
        self.post_dense_norm = self._norm("post_dense_norm", input_shape)
        self.experts_norm = self._norm("experts_norm", input_shape)
        self.experts.build(input_shape)
        self.post_experts_norm = self._norm("post_experts_norm", input_shape)
        self.built = True

    def call(self, inputs, training=None):
        dense = self.post_dense_norm(self.dense(self.dense_norm(inputs), training=training))
        experts = self.experts(self.experts_norm(inputs), training=training,
                               router_inputs=inputs)
        return dense + self.post_experts_norm(experts)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update({
            "intermediate_dim": self.intermediate_dim,
            "num_experts": self.num_experts,
            "num_experts_per_tok": self.num_experts_per_tok,
            "expert_intermediate_dim": self.expert_intermediate_dim,
            "activation": keras.activations.serialize(self.activation),
            "epsilon": self.epsilon,
            "implementation": self.implementation,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
        })
        return config
