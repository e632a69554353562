"""A mixture of gated-MLP experts behind a top-k router (Mixtral, Qwen3-MoE, gpt-oss,
DeepSeek V3, Llama 4, Gemma 4).

Shazeer et al. 2017, "Outrageously Large Neural Networks: The Sparsely-Gated
Mixture-of-Experts Layer"; the load-balancing loss of Fedus et al. 2021,
"Switch Transformers" (Eqs. 4-6), as transformers' `load_balancing_loss_func`.
"""

from collections.abc import Callable

import keras
import numpy as np
from keras import ops

from keras_attn._observe import record_path
from keras_attn._typing import Initializer
from keras_attn._validation import check_positive_float, check_positive_int
from keras_attn.layers import _moe_experts
from keras_attn.layers._common import clone_initializer
from keras_attn.layers._moe_experts import EXPERT_ACTIVATIONS
from keras_attn.layers._moe_routing import (
    GROUPED_ROUTING,
    INPUT_SCALED_ROUTING,
    ROUTING,
    load_balancing_loss,
    scaled_rms_router_input,
)

__all__ = ["MixtureOfExperts"]

IMPLEMENTATIONS = ("auto", "dense", "sparse")
# The rule `implementation="auto"` follows: `_moe_experts.chosen_path`.
DENSE_UP_TO_EXPERTS = _moe_experts.DENSE_UP_TO_EXPERTS
# Rows per block of the sparse dispatch (`_moe_experts`).
SPARSE_BLOCK_ROWS = _moe_experts.SPARSE_BLOCK_ROWS


@keras.saving.register_keras_serializable(package="keras_attn")
class MixtureOfExperts(keras.layers.Layer):
    """A router picks k of E gated-MLP experts per token; their outputs, weighted, sum.

    `y = sum_{e in topk(x)} w_e(x) * W_down_e (act(W_gate_e x) * W_up_e x)`, with
    `routing="softmax_topk"`: `p = softmax(x W_router)` over all E experts, the k largest
    kept, divided by their sum when `norm_topk_prob` (transformers'
    `Qwen3MoeTopKRouter`). Mixtral's `MixtralTopKRouter` always divides (it has no
    `norm_topk_prob` field): a Mixtral layer is `norm_topk_prob=True`. The router's
    softmax runs in float32 whatever the compute dtype, as transformers does.

    With `routing="sigmoid_group_topk"` (DeepSeek V3, transformers'
    `DeepseekV3TopkRouter`): scores `s = sigmoid(x W_router)`; the choice reads
    `s + router_correction_bias` (a non-trainable `(E,)` weight, DeepSeek's
    `e_score_correction_bias`, for the choice only: the weights never see it): the E
    experts in `n_group` groups, each group scored by the sum of its two best, the
    `topk_group` best groups kept and the k best of their experts chosen; the weights
    are those experts' `s`, divided by their sum when `norm_topk_prob`, times
    `routed_scaling_factor`. In float32 too.

    Routing rules (`routing`): the scores; what chooses the k experts; their weights
    (`norm`: renormalised when `norm_topk_prob`; G `n_group`, g `topk_group`,
    factor `routed_scaling_factor`).

    | rule                   | scores  | choice                                | weights                 |
    |------------------------|---------|---------------------------------------|-------------------------|
    | `"softmax_topk"`       | softmax | top-k scores                          | norm(scores)            |
    | `"sigmoid_group_topk"` | sigmoid | top-k scores + bias in best g of G groups | norm(scores) x factor |
    | `"llama4_sigmoid_topk"`| sigmoid | top-k logits                          | scores, on the input    |

    With `"llama4_sigmoid_topk"` (Llama 4, transformers' `Llama4Router` and
    `Llama4TextMoe`) the weight scales the chosen expert's input, not its output:
    `y = sum_{e in topk} W_down_e (act(W_gate_e (w_e x)) * W_up_e (w_e x))`, with
    `w_e = sigmoid(x W_router)_e` (no renormalising: `norm_topk_prob` must be False).

    Shared expert (`shared_intermediate_dim` S: DeepSeek V3's `n_shared_experts *
    moe_intermediate_size`, Qwen3-Next's `shared_expert_intermediate_size`): a dense
    gated MLP every token runs, summed with the routed output,
    `y += W_sd (act(W_sg x) * W_su x)`; with `shared_expert_gate` (Qwen3-Next) it is
    first multiplied by the per-token scalar `sigmoid(x W_gate_s)`.

    No token is dropped: every token runs through its k experts whatever the load
    (no capacity factor), as Mixtral and Qwen3-MoE do.

    Two computations give the same numbers:
        - "dense": every expert on every token (`E * N` expert calls), weighted by the
          routing weights, zero for the experts not chosen. Exact and simple; the
          cheaper one for a few experts.
        - "sparse": each token only through its k experts. The `N * k` token copies are
          sorted by expert into blocks of at most 256 rows, one expert per block (each
          expert's rows padded to whole blocks), and each block runs one batched matmul
          against its expert's gathered weights; the outputs are gathered back. Every
          shape follows from the input's (`ceil(N k / b) + E` blocks of `b` rows), so
          JAX and TensorFlow compile it once per input shape; fewer copies than
          experts (a decode step) gather just their experts' weights instead. On
          PyTorch (CPU), one grouped matmul per projection over the copies sorted by
          expert (`torch._grouped_mm`, as transformers 5 runs its experts: each
          expert's weights read in place, no padded rows; "moe_grouped" is recorded
          too), eagerly and in the traced decoding step, where the rows are a multiple
          of 16 bytes (the kernel's rule; else the forms above).
        - "auto": "dense" up to 4 experts; also for up to 4 experts per chosen one
          (`num_experts <= 4 * num_experts_per_tok`) over at most 256 tokens (known
          when traced: a decode step, a short prompt) on PyTorch and JAX, where the
          sparse path's sorting and gathering measured slower; "sparse" otherwise
          (`DENSE_UP_TO_TOKENS`, measured by benchmarks/moe_paths.py). The path
          taken is recorded for `keras_attn.observe_paths()` as "moe_dense" or
          "moe_sparse" (with "moe_gathered" or "moe_grouped" for the sparse forms).

    `routing="topk_softmax"` is gpt-oss's router (`GptOssTopKRouter`): the k largest
    logits `x W_router + b_router`, softmax over those k only (the same weights as
    "softmax_topk" with `norm_topk_prob=True`, computed as gpt-oss does).

    gpt-oss's experts (`GptOssExperts`): `use_router_bias` and `use_expert_bias` add a
    bias to the router's logits and to each expert's three projections, and
    `expert_activation="gpt_oss_swiglu"` replaces `activation(g) * u` by the clamped
    SwiGLU `(clip(u, -limit, limit) + 1) * g' * sigmoid(alpha * g')`, `g' = min(g, limit)`
    (`swiglu_alpha`, `swiglu_limit`), on both paths. The output bias is weighted with
    its expert's output: `w_e (W_down_e h + b_down_e)`.

    Weights (a contract): `router_kernel` `(D, E)`; the experts' kernels stacked on a
    leading expert axis, named after `PositionwiseFeedForward(gated=True)`'s sublayers:
    `gate_kernel` `(E, D, F)` (W_gate, with the activation), `intermediate_kernel`
    `(E, D, F)` (W_up) and `output_kernel` `(E, F, D)` (W_down). No biases by default;
    `router_bias` `(E,)` with `use_router_bias`, `gate_bias`, `intermediate_bias`
    `(E, F)` and `output_bias` `(E, D)` with `use_expert_bias`.
    transformers' fused `experts.gate_up_proj` `(E, 2F, D)` is `[gate; up]` transposed
    (gpt-oss's `(E, D, 2F)` interleaves them: gate the even columns, up the odd ones).
    With a shared expert: `shared_gate_kernel` `(D, S)`, `shared_intermediate_kernel`
    `(D, S)`, `shared_output_kernel` `(S, D)` (transformers' `shared_experts.gate_proj`,
    `up_proj`, `down_proj` transposed) and, gated, `shared_expert_gate_kernel` `(D, 1)`.
    With `"sigmoid_group_topk"`: `router_correction_bias` `(E,)` (float32, not trainable).
    Gemma 4's router scales (ones at first): `router_scale` `(D,)` with
    `router_input_norm`, `per_expert_scale` `(E,)` with `use_per_expert_scale`.

    Gemma 4's router (transformers' `Gemma4TextRouter`): with `router_input_norm` the
    router reads `x / sqrt(mean(x^2) + router_norm_epsilon) * router_scale * D**-0.5`
    (an RMSNorm without its own scale, the norm in float32); with
    `use_per_expert_scale` each kept weight is multiplied by `per_expert_scale` of its
    expert after the rule (and its renormalising). The call's `router_inputs` lets the
    router read other tokens than the experts (Gemma 4 routes on the residual stream and
    runs the experts on its normalised copy: `keras_attn.ParallelMixtureOfExperts`).

    Shapes: B batch, T length, D width, E `num_experts`, k `num_experts_per_tok`,
    F `intermediate_dim`, S `shared_intermediate_dim`, N = B*T tokens.

    Args:
        num_experts: E.
        num_experts_per_tok: k, the experts each token runs through (1 <= k <= E).
        intermediate_dim: F, the hidden width of each expert.
        activation: the gate's activation ("silu": SwiGLU experts); unused with
            `expert_activation="gpt_oss_swiglu"`.
        norm_topk_prob: renormalise the k kept probabilities to sum to 1.
        router_aux_loss_coef: the weight of the load-balancing loss, added through
            `add_loss` when called with `training=True` (0, the default: none). Per
            layer: `coef * E * sum_e f_e P_e` over this call's B*T tokens (padding
            included: the feed-forward sees no mask). transformers computes one loss
            from all layers' logits concatenated, which for L layers is not the sum of
            the L per-layer losses. Not with `"sigmoid_group_topk"` (DeepSeek V3
            balances through its correction bias): a `ValueError`.
        routing: the routing rule's name: "softmax_topk" (softmax over all E, then the
            top k), "topk_softmax" (the top k logits, then a softmax over them: gpt-oss)
            "sigmoid_group_topk" (DeepSeek V3) or "llama4_sigmoid_topk" (Llama 4: the
            expert's input scaled; above).
        implementation: "auto", "dense" or "sparse" (above).
        kernel_initializer: initializer of every kernel.
        use_router_bias: add a bias `router_bias` `(E,)` to the router's logits (gpt-oss).
        use_expert_bias: add biases to every expert's gate, up and down projections
            (`gate_bias`, `intermediate_bias` `(E, F)`, `output_bias` `(E, D)`; gpt-oss).
            Biases start at zero.
        expert_activation: "gated" (`activation(gate) * up`) or "gpt_oss_swiglu" (the
            clamped SwiGLU above).
        swiglu_alpha: alpha of "gpt_oss_swiglu" (gpt-oss: 1.702).
        swiglu_limit: the clamp of "gpt_oss_swiglu" (gpt-oss: 7.0).
        shared_intermediate_dim: S, the shared expert's hidden width, or 0 / None (the
            default) for no shared expert.
        shared_expert_gate: multiply the shared expert's output by
            `sigmoid(x W_gate_s)` (Qwen3-Next's `shared_expert_gate`); needs S.
        n_group: the expert groups of `"sigmoid_group_topk"` (it divides E into groups of
            at least 2); 1 with the other rules.
        topk_group: the groups kept per token (at most `n_group`, and their experts at
            least k); 1 with the other rules.
        routed_scaling_factor: the routing weights' multiplier (> 0) of
            `"sigmoid_group_topk"`; 1.0 with the other rules.
        router_input_norm: RMS-normalise the router's input, times `router_scale` and
            `D**-0.5` (Gemma 4; above).
        router_norm_epsilon: that norm's epsilon (> 0; Gemma 4's `rms_norm_eps`).
        use_per_expert_scale: multiply each kept weight by its expert's
            `per_expert_scale` (Gemma 4).
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: `(B, T, D)` (any leading dims work).
        training: whether the load-balancing loss is added.
        router_inputs: None (the router reads `inputs`), or the `(B, T, D)` tokens the
            router reads instead.

    Returns:
        `(B, T, D)`. Keras masks pass through unchanged.

    Example:

    >>> import numpy as np
    >>> moe = MixtureOfExperts(num_experts=4, num_experts_per_tok=2, intermediate_dim=32)
    >>> tuple(moe(np.zeros((2, 5, 16), "float32")).shape)
    (2, 5, 16)
    >>> gpt_oss = MixtureOfExperts(num_experts=4, num_experts_per_tok=2, intermediate_dim=32,
    ...                            routing="topk_softmax", use_router_bias=True,
    ...                            use_expert_bias=True, expert_activation="gpt_oss_swiglu")
    >>> tuple(gpt_oss(np.ones((2, 5, 16), "float32")).shape)
    (2, 5, 16)

    DeepSeek V3's routing and shared expert: 8 experts in 4 groups, 2 groups kept.

    >>> deepseek = MixtureOfExperts(num_experts=8, num_experts_per_tok=2, intermediate_dim=8,
    ...                             norm_topk_prob=True, routing="sigmoid_group_topk",
    ...                             n_group=4, topk_group=2, routed_scaling_factor=2.5,
    ...                             shared_intermediate_dim=16)
    >>> tuple(deepseek(np.ones((2, 5, 16), "float32")).shape)
    (2, 5, 16)
    >>> tuple(deepseek.router_correction_bias.shape), deepseek.router_correction_bias.trainable
    ((8,), False)

    Llama 4's: the sigmoid of the top-1 logit scales the expert's input; a shared expert.

    >>> llama4 = MixtureOfExperts(num_experts=4, num_experts_per_tok=1, intermediate_dim=8,
    ...                           routing="llama4_sigmoid_topk", shared_intermediate_dim=8)
    >>> tuple(llama4(np.ones((2, 5, 16), "float32")).shape)
    (2, 5, 16)
    """

    def __init__(
        self,
        num_experts: int,
        num_experts_per_tok: int,
        intermediate_dim: int,
        activation: str | Callable = "silu",
        norm_topk_prob: bool = False,
        router_aux_loss_coef: float = 0.0,
        routing: str = "softmax_topk",
        implementation: str = "auto",
        kernel_initializer: Initializer = "glorot_uniform",
        use_router_bias: bool = False,
        use_expert_bias: bool = False,
        expert_activation: str = "gated",
        swiglu_alpha: float = 1.702,
        swiglu_limit: float = 7.0,
        shared_intermediate_dim: int | None = None,
        shared_expert_gate: bool = False,
        n_group: int = 1,
        topk_group: int = 1,
        routed_scaling_factor: float = 1.0,
        router_input_norm: bool = False,
        router_norm_epsilon: float = 1e-6,
        use_per_expert_scale: bool = False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_experts = check_positive_int("num_experts", num_experts)
        self.num_experts_per_tok = check_positive_int("num_experts_per_tok", num_experts_per_tok)
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(
                "`num_experts_per_tok` must be at most `num_experts` "
                f"({self.num_experts}). Received: num_experts_per_tok={num_experts_per_tok!r}")
        self.intermediate_dim = check_positive_int("intermediate_dim", intermediate_dim)
        self.activation = keras.activations.get(activation)
        self.norm_topk_prob = bool(norm_topk_prob)
        if isinstance(router_aux_loss_coef, bool) or not isinstance(
                router_aux_loss_coef, (int, float)) or not router_aux_loss_coef >= 0:
            raise ValueError("`router_aux_loss_coef` must be a number >= 0. "
                             f"Received: router_aux_loss_coef={router_aux_loss_coef!r}")
        self.router_aux_loss_coef = float(router_aux_loss_coef)
        if routing not in ROUTING:
            raise ValueError(f"`routing` must be one of {sorted(ROUTING)}. "
                             f"Received: routing={routing!r}")
        self.routing = routing
        if routing in INPUT_SCALED_ROUTING and self.norm_topk_prob:
            raise ValueError(f"`norm_topk_prob` renormalises output weights; routing {routing!r} "
                             "scales the experts' inputs by their sigmoid scores as they are. "
                             "Received: norm_topk_prob=True")
        if implementation not in IMPLEMENTATIONS:
            raise ValueError(f"`implementation` must be one of {IMPLEMENTATIONS}. "
                             f"Received: implementation={implementation!r}")
        self.implementation = implementation
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self._init_gpt_oss_options(use_router_bias, use_expert_bias, expert_activation,
                                   swiglu_alpha, swiglu_limit)
        self._init_shared_expert(shared_intermediate_dim, shared_expert_gate)
        self._init_group_routing(n_group, topk_group, routed_scaling_factor)
        for name, value in (("router_input_norm", router_input_norm),
                            ("use_per_expert_scale", use_per_expert_scale)):
            if not isinstance(value, bool):
                raise ValueError(f"`{name}` must be True or False. Received: {name}={value!r}")
        self.router_input_norm, self.use_per_expert_scale = router_input_norm, use_per_expert_scale
        self.router_norm_epsilon = check_positive_float("router_norm_epsilon",
                                                        router_norm_epsilon)
        self.supports_masking = True  # per token: a Keras mask passes through

    def _init_gpt_oss_options(self, use_router_bias, use_expert_bias, expert_activation,
                              swiglu_alpha, swiglu_limit):
        """The router's and experts' biases and the expert activation (gpt-oss)."""
        for name, value in (("use_router_bias", use_router_bias),
                            ("use_expert_bias", use_expert_bias)):
            if not isinstance(value, bool):
                raise ValueError(f"`{name}` must be True or False. Received: {name}={value!r}")
        self.use_router_bias = use_router_bias
        self.use_expert_bias = use_expert_bias
        if expert_activation not in EXPERT_ACTIVATIONS:
            raise ValueError(f"`expert_activation` must be one of {EXPERT_ACTIVATIONS}. "
                             f"Received: expert_activation={expert_activation!r}")
        self.expert_activation = expert_activation
        self.swiglu_alpha = check_positive_float("swiglu_alpha", swiglu_alpha)
        self.swiglu_limit = check_positive_float("swiglu_limit", swiglu_limit)

    def _init_shared_expert(self, shared_intermediate_dim, shared_expert_gate):
        """The shared expert's width (0 / None: none) and its sigmoid gate."""
        self.shared_intermediate_dim = check_positive_int(
            "shared_intermediate_dim", shared_intermediate_dim or None, allow_none=True)
        if not isinstance(shared_expert_gate, bool):
            raise ValueError("`shared_expert_gate` must be a bool. "
                             f"Received: shared_expert_gate={shared_expert_gate!r}")
        if shared_expert_gate and not self.shared_intermediate_dim:
            raise ValueError("`shared_expert_gate=True` gates the shared expert, which needs "
                             "`shared_intermediate_dim`. Received: shared_expert_gate=True, "
                             f"shared_intermediate_dim={shared_intermediate_dim!r}")
        self.shared_expert_gate = shared_expert_gate

    def _init_group_routing(self, n_group, topk_group, routed_scaling_factor):
        """DeepSeek V3's routing arguments: checked, and neutral under the other rules."""
        self.n_group = check_positive_int("n_group", n_group)
        self.topk_group = check_positive_int("topk_group", topk_group)
        if isinstance(routed_scaling_factor, bool) or not isinstance(
                routed_scaling_factor, (int, float)) or not routed_scaling_factor > 0:
            raise ValueError("`routed_scaling_factor` must be a number > 0. "
                             f"Received: routed_scaling_factor={routed_scaling_factor!r}")
        self.routed_scaling_factor = float(routed_scaling_factor)
        if self.routing not in GROUPED_ROUTING:
            for name, neutral in (("n_group", 1), ("topk_group", 1),
                                  ("routed_scaling_factor", 1.0)):
                if getattr(self, name) != neutral:
                    raise ValueError(
                        f"`{name}` is read by routing {GROUPED_ROUTING[0]!r} only; routing "
                        f"{self.routing!r} needs it at {neutral!r}. Received: "
                        f"{name}={getattr(self, name)!r}")
            return
        E = self.num_experts
        if E % self.n_group or E // self.n_group < 2:
            raise ValueError(
                f"`n_group` must divide num_experts={E} into groups of at least 2 experts "
                f"(each group is scored by its top 2). Received: n_group={n_group!r}")
        if self.topk_group > self.n_group:
            raise ValueError(f"`topk_group` must be at most n_group={self.n_group}. "
                             f"Received: topk_group={topk_group!r}")
        if self.num_experts_per_tok > self.topk_group * (E // self.n_group):
            raise ValueError(
                f"`num_experts_per_tok` must be at most the experts of the kept groups "
                f"(topk_group * num_experts / n_group = {self.topk_group * (E // self.n_group)})"
                f". Received: num_experts_per_tok={self.num_experts_per_tok!r}")
        if self.router_aux_loss_coef:
            raise ValueError(
                "`router_aux_loss_coef` is the softmax routers' load-balancing loss; routing "
                f"{self.routing!r} (DeepSeek V3) balances with its correction bias instead. "
                f"Received: router_aux_loss_coef={self.router_aux_loss_coef!r}")

    def _kernel(self, shape, name):
        return self.add_weight(shape=shape, name=name,
                               initializer=clone_initializer(self.kernel_initializer))

    def build(self, input_shape):
        D, E, F = input_shape[-1], self.num_experts, self.intermediate_dim
        self.router_kernel = self._kernel((D, E), "router_kernel")
        self.gate_kernel = self._kernel((E, D, F), "gate_kernel")
        self.intermediate_kernel = self._kernel((E, D, F), "intermediate_kernel")
        self.output_kernel = self._kernel((E, F, D), "output_kernel")
        self._build_biases(D, E, F)
        self._build_shared_expert(D)
        if self.routing in GROUPED_ROUTING:  # used for the choice only: no gradient reaches it
            self.router_correction_bias = self.add_weight(
                shape=(E,), name="router_correction_bias", initializer="zeros",
                trainable=False, dtype="float32")
        if self.router_input_norm:  # Gemma 4's router scales (ones, as transformers')
            self.router_scale = self.add_weight(shape=(D,), name="router_scale",
                                                initializer="ones")
        if self.use_per_expert_scale:
            self.per_expert_scale = self.add_weight(shape=(E,), name="per_expert_scale",
                                                    initializer="ones")
        self.built = True

    def _build_biases(self, D, E, F):
        if self.use_router_bias:
            self.router_bias = self.add_weight(shape=(E,), name="router_bias",
                                               initializer="zeros")
        if self.use_expert_bias:
            for name, width in (("gate_bias", F), ("intermediate_bias", F),
                                ("output_bias", D)):
                setattr(self, name, self.add_weight(shape=(E, width), name=name,
                                                    initializer="zeros"))

    def _build_shared_expert(self, D):
        S = self.shared_intermediate_dim
        if not S:
            return
        self.shared_gate_kernel = self._kernel((D, S), "shared_gate_kernel")
        self.shared_intermediate_kernel = self._kernel((D, S), "shared_intermediate_kernel")
        self.shared_output_kernel = self._kernel((S, D), "shared_output_kernel")
        if self.shared_expert_gate:
            self.shared_expert_gate_kernel = self._kernel((D, 1), "shared_expert_gate_kernel")

    def _shared_expert(self, tokens):
        """The shared expert's `(N, D)` output: `W_down (act(W_gate x) * W_up x)`, times
        `sigmoid(x W_sg)` with `shared_expert_gate`."""
        hidden = self.activation(ops.matmul(tokens, self.shared_gate_kernel)) * ops.matmul(
            tokens, self.shared_intermediate_kernel)
        out = ops.matmul(hidden, self.shared_output_kernel)
        if self.shared_expert_gate:
            out = ops.sigmoid(ops.matmul(tokens, self.shared_expert_gate_kernel)) * out
        return out

    def _routing_arguments(self):
        """The arguments a rule takes after `(logits, k, norm_topk_prob)`."""
        if self.routing not in GROUPED_ROUTING:
            return ()
        return (self.router_correction_bias, self.n_group, self.topk_group,
                self.routed_scaling_factor)

    def route(self, tokens):
        """`(weights, indices, probs)` for `(N, D)` tokens (see `softmax_topk`,
        `sigmoid_group_topk`: its `probs` are the sigmoid scores)."""
        if self.router_input_norm:
            tokens = scaled_rms_router_input(tokens, self.router_scale,
                                             self.router_norm_epsilon)
        logits = ops.matmul(tokens, self.router_kernel)
        if self.use_router_bias:
            logits = logits + self.router_bias
        logits = ops.cast(logits, "float32")
        weights, indices, probs = ROUTING[self.routing](
            logits, self.num_experts_per_tok, self.norm_topk_prob, *self._routing_arguments())
        if self.use_per_expert_scale:
            weights = weights * ops.take(ops.cast(self.per_expert_scale, "float32"), indices)
        return weights, indices, probs

    def _chosen_path(self, tokens=None):
        """The path of a call over `tokens` (N, static; None: not known when traced)."""
        return _moe_experts.chosen_path(self.implementation, self.num_experts,
                                        self.num_experts_per_tok, tokens)

    def call(self, inputs, training=None, router_inputs=None):
        shape = ops.shape(inputs)
        tokens = ops.reshape(inputs, (-1, shape[-1]))  # (N, D)
        weights, indices, probs = self.route(
            tokens if router_inputs is None else ops.reshape(router_inputs, (-1, shape[-1])))
        weights = ops.cast(weights, self.compute_dtype)
        static = tuple(inputs.shape)[:-1]
        count = None if None in static else int(np.prod(static))  # N, where it is static
        path = record_path("moe_" + self._chosen_path(count))
        scale_inputs = self.routing in INPUT_SCALED_ROUTING  # Llama 4: w_e scales x
        experts = _moe_experts.dense if path == "moe_dense" else _moe_experts.sparse
        out = experts(self, tokens, weights, indices, scale_inputs)
        if self.shared_intermediate_dim:  # every token through the shared expert too
            out = out + self._shared_expert(tokens)
        if training and self.router_aux_loss_coef:
            self.add_loss(self.router_aux_loss_coef
                          * load_balancing_loss(probs, indices, self.num_experts))
        return ops.reshape(out, shape)

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
            "router_aux_loss_coef": self.router_aux_loss_coef,
            "routing": self.routing,
            "implementation": self.implementation,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "use_router_bias": self.use_router_bias,
            "use_expert_bias": self.use_expert_bias,
            "expert_activation": self.expert_activation,
            "swiglu_alpha": self.swiglu_alpha,
            "swiglu_limit": self.swiglu_limit,
            "shared_intermediate_dim": self.shared_intermediate_dim,
            "shared_expert_gate": self.shared_expert_gate,
            "n_group": self.n_group,
            "topk_group": self.topk_group,
            "routed_scaling_factor": self.routed_scaling_factor,
        })
        if self.router_input_norm or self.use_per_expert_scale:  # Gemma 4's: absent if unset
            config.update(router_input_norm=self.router_input_norm,
                          router_norm_epsilon=self.router_norm_epsilon,
                          use_per_expert_scale=self.use_per_expert_scale)
        return config
