"""A sparse mixture of gated feed-forward experts (Shazeer et al., 2017; Mixtral, Qwen3-MoE)."""

from collections.abc import Callable

import keras
from keras import ops

from keras_attn._observe import record_path
from keras_attn._shapes import static_shape
from keras_attn._typing import Initializer
from keras_attn._validation import check_positive_int, check_rank
from keras_attn.layers._common import clone_initializer

__all__ = ["IMPLEMENTATIONS", "ROUTINGS", "MixtureOfExperts"]

# routing -> what it computes (a new rule is an entry here and a branch in `route`).
ROUTINGS = {
    "softmax_topk": "softmax over all experts' logits, then the top k (transformers' "
                    "MixtralTopKRouter and Qwen3MoeTopKRouter)",
}
IMPLEMENTATIONS = ("auto", "dense", "sparse")


@keras.saving.register_keras_serializable(package="keras_attn")
class MixtureOfExperts(keras.layers.Layer):
    """A sparse mixture of gated feed-forward experts: each token runs through the k experts
    its router picks, their outputs summed with the router's weights.

    For a token x (width D), with E experts of width F and top-k routing
    (`routing="softmax_topk"`, as transformers' Mixtral and Qwen3-MoE):

        p = softmax(x W_router)                     # (E,), in float32 at least
        w, i = top_k(p, k)                          # w / sum(w) if norm_topk_prob
        y = sum_j w_j * W_down[i_j] (act(x W_gate[i_j]) * (x W_up[i_j]))

    No token is dropped: there is no capacity limit (Mixtral, Qwen3-MoE and the other
    families converted here route every token to its k experts). Mixtral always
    renormalises the top-k weights (`norm_topk_prob=True`, the default here); Qwen3-MoE
    reads `norm_topk_prob` from its config.

    Shapes: B batch, T length, D model width, E `num_experts`, k `num_experts_per_tok`,
    F `intermediate_dim`, N = B * T tokens.

    Args:
        num_experts: E (transformers' `num_local_experts` / `num_experts`).
        num_experts_per_tok: k, the experts each token runs through (1 <= k <= E).
        intermediate_dim: F, each expert's hidden width (`intermediate_size`, or
            `moe_intermediate_size` where a family has both).
        activation: the gate's activation (`hidden_act`), default "silu" (SwiGLU).
        norm_topk_prob: divide the k weights by their sum.
        routing: the routing rule, a key of `ROUTINGS`.
        router_aux_loss_coef: the weight of the router's load-balancing loss, added
            with `add_loss` in training only (0, the default: none). The loss is
            transformers' `load_balancing_loss_func` over this layer's router logits:
            `E * sum_e f_e P_e`, f_e the share of the N k assignments that go to expert
            e and P_e the mean router probability of e. transformers sums the counts
            and probabilities over all layers before multiplying; per layer, the two
            agree for a model with one MoE layer.
        implementation: "dense" (every expert on every token, weighted by the routing
            weights, zero outside the top k: E/k times the FLOPs, but one matmul per
            weight), "sparse" (each token's k experts' weights gathered and applied to
            it: N k weight copies read), or "auto" (default): sparse when N k < E,
            where it reads fewer expert weights than dense (decoding a few tokens), and
            where N is not known, dense. `keras_attn.observe_paths` counts
            "moe_dense" / "moe_sparse".
        kernel_initializer: initializer of the router and expert kernels.
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Weights: `router/kernel` `(D, E)` (transformers' `gate.weight` transposed),
    `gate_kernel` and `intermediate_kernel` `(E, D, F)` (the halves of transformers'
    `experts.gate_up_proj`, transposed), `output_kernel` `(E, F, D)` (`experts.down_proj`
    transposed).

    Call arguments:
        inputs: `(B, T, D)`.
        training: whether the load-balancing loss is added.

    Returns:
        `(B, T, D)`. Keras masks pass through unchanged.

    Example:

    >>> import numpy as np
    >>> moe = MixtureOfExperts(num_experts=4, num_experts_per_tok=2, intermediate_dim=8)
    >>> tuple(moe(np.zeros((2, 3, 16), "float32")).shape)
    (2, 3, 16)
    """

    def __init__(self, num_experts: int, num_experts_per_tok: int, intermediate_dim: int,
                 activation: str | Callable = "silu", norm_topk_prob: bool = True,
                 routing: str = "softmax_topk", router_aux_loss_coef: float = 0.0,
                 implementation: str = "auto",
                 kernel_initializer: Initializer = "glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        self.num_experts = check_positive_int("num_experts", num_experts)
        self.num_experts_per_tok = check_positive_int("num_experts_per_tok",
                                                      num_experts_per_tok)
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(
                "`num_experts_per_tok` must be at most `num_experts`. Received: "
                f"num_experts_per_tok={num_experts_per_tok}, num_experts={num_experts}")
        self.intermediate_dim = check_positive_int("intermediate_dim", intermediate_dim)
        self.activation = keras.activations.get(activation)
        if not isinstance(norm_topk_prob, bool):
            raise ValueError("`norm_topk_prob` must be a bool. "
                             f"Received: norm_topk_prob={norm_topk_prob!r}")
        self.norm_topk_prob = norm_topk_prob
        if routing not in ROUTINGS:
            raise ValueError(f"`routing` must be one of {sorted(ROUTINGS)}. "
                             f"Received: routing={routing!r}")
        self.routing = routing
        if (isinstance(router_aux_loss_coef, bool)
                or not isinstance(router_aux_loss_coef, (int, float))
                or router_aux_loss_coef < 0):
            raise ValueError("`router_aux_loss_coef` must be a float >= 0. "
                             f"Received: router_aux_loss_coef={router_aux_loss_coef!r}")
        self.router_aux_loss_coef = float(router_aux_loss_coef)
        if implementation not in IMPLEMENTATIONS:
            raise ValueError(f"`implementation` must be one of {IMPLEMENTATIONS}. "
                             f"Received: implementation={implementation!r}")
        self.implementation = implementation
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.supports_masking = True  # per token: a Keras mask passes through

    def build(self, input_shape):
        D = check_rank("inputs", input_shape, 3, "(B, T, D)")[-1]
        E, F = self.num_experts, self.intermediate_dim
        self.router = keras.layers.Dense(
            E, use_bias=False, kernel_initializer=clone_initializer(self.kernel_initializer),
            dtype=self.dtype_policy, name="router")
        self.router.build(tuple(input_shape))

        def expert_weight(name, shape):
            return self.add_weight(name=name, shape=shape,
                                   initializer=clone_initializer(self.kernel_initializer))

        self.gate_kernel = expert_weight("gate_kernel", (E, D, F))
        self.intermediate_kernel = expert_weight("intermediate_kernel", (E, D, F))
        self.output_kernel = expert_weight("output_kernel", (E, F, D))
        self.built = True

    def route(self, x):
        """The routing of tokens `x` `(N, D)`: `(weights (N, k), indices (N, k), logits
        (N, E))`, the weights and logits in float32 (float64 for a float64 layer)."""
        logits = self.router(x)  # (N, E)
        compute = "float64" if keras.backend.standardize_dtype(
            logits.dtype) == "float64" else "float32"
        logits = ops.cast(logits, compute)
        probabilities = ops.softmax(logits, axis=-1)  # (N, E)
        weights, indices = ops.top_k(probabilities, self.num_experts_per_tok)  # (N, k) each
        if self.norm_topk_prob:
            weights = weights / ops.sum(weights, axis=-1, keepdims=True)
        return weights, indices, logits

    def _choose_path(self, tokens):
        if self.implementation != "auto":
            return self.implementation
        if tokens is None:  # not known while tracing: dense reads each weight once
            return "dense"
        return "sparse" if tokens * self.num_experts_per_tok < self.num_experts else "dense"

    def call(self, inputs, training=None):
        B, T, D = static_shape(inputs)
        x = ops.reshape(inputs, (-1, D))  # (N, D)
        weights, indices, logits = self.route(x)
        tokens = B * T if B is not None and T is not None else None
        path = record_path(f"moe_{self._choose_path(tokens)}")
        weights = ops.cast(weights, x.dtype)
        if path == "moe_dense":
            y = self._all_experts(x, weights, indices)
        else:
            y = self._routed_experts(x, weights, indices)
        if training and self.router_aux_loss_coef:
            self.add_loss(self.router_aux_loss_coef * self.load_balancing_loss(logits))
        return ops.reshape(y, ops.shape(inputs))  # (B, T, D)

    def _all_experts(self, x, weights, indices):
        """Every expert on every token; the routing weights `(N, E)` zero outside the top k."""
        routed = ops.sum(ops.one_hot(indices, self.num_experts, dtype=x.dtype)
                         * weights[..., None], axis=1)  # (N, E)
        gate = ops.einsum("nd,edf->enf", x, self.gate_kernel)  # (E, N, F)
        up = ops.einsum("nd,edf->enf", x, self.intermediate_kernel)  # (E, N, F)
        out = ops.matmul(self.activation(gate) * up, self.output_kernel)  # (E, N, D)
        return ops.einsum("ne,end->nd", routed, out)  # (N, D)

    def _routed_experts(self, x, weights, indices):
        """Each token through its k experts only: their weights gathered per assignment."""
        k = self.num_experts_per_tok
        flat = ops.reshape(indices, (-1,))  # (N k,)
        rows = ops.repeat(x, k, axis=0)[:, None, :]  # (N k, 1, D), token n's k copies in a row
        gate = ops.matmul(rows, ops.take(self.gate_kernel, flat, axis=0))  # (N k, 1, F)
        up = ops.matmul(rows, ops.take(self.intermediate_kernel, flat, axis=0))  # (N k, 1, F)
        out = ops.matmul(self.activation(gate) * up,
                         ops.take(self.output_kernel, flat, axis=0))[:, 0]  # (N k, D)
        out = ops.reshape(out, (-1, k, ops.shape(x)[-1]))  # (N, k, D)
        return ops.sum(out * weights[..., None], axis=1)  # (N, D)

    def load_balancing_loss(self, logits):
        """transformers' `load_balancing_loss_func` of router `logits` `(N, E)`: `E * sum_e
        f_e P_e` (f_e the share of the N k top-k assignments to e, P_e its mean softmax
        probability); its gradient flows through P only, as there."""
        E = self.num_experts
        probabilities = ops.softmax(logits, axis=-1)  # (N, E)
        _, selected = ops.top_k(probabilities, self.num_experts_per_tok)  # (N, k)
        counts = ops.sum(ops.one_hot(selected, E, dtype=probabilities.dtype), axis=(0, 1))
        rows = ops.cast(ops.shape(probabilities)[0], probabilities.dtype)
        share = ops.stop_gradient(counts / rows)  # (E,): sums to k
        return E * ops.sum(share * ops.mean(probabilities, axis=0))

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update({
            "num_experts": self.num_experts,
            "num_experts_per_tok": self.num_experts_per_tok,
            "intermediate_dim": self.intermediate_dim,
            "activation": keras.activations.serialize(self.activation),
            "norm_topk_prob": self.norm_topk_prob,
            "routing": self.routing,
            "router_aux_loss_coef": self.router_aux_loss_coef,
            "implementation": self.implementation,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
        })
        return config
