"""The routers of `keras_attn.layers.MixtureOfExperts`: each rule turns router logits into
the k experts of every token and their weights, as a family's transformers router does;
and the load-balancing loss of the softmax routers.

A rule is `rule(logits, k, norm_topk_prob, *extra) -> (weights, indices, probs)`:
`(N, k)` float32 weights, `(N, k)` int32 expert indices, and the `(N, E)` scores the
load-balancing loss reads. `ROUTING` names them (the layer's `routing=`); the rules in
`GROUPED_ROUTING` also take the layer's correction bias, `n_group`, `topk_group` and
`routed_scaling_factor`.
"""

from keras import ops

__all__ = ["GROUPED_ROUTING", "INPUT_SCALED_ROUTING", "ROUTING", "llama4_sigmoid_topk",
           "load_balancing_loss", "scaled_rms_router_input", "sigmoid_group_topk",
           "softmax_topk", "topk_softmax"]


def softmax_topk(logits, num_experts_per_tok, norm_topk_prob):
    """Mixtral / Qwen3-MoE routing: softmax over all experts, top-k, optional renormalising.

    Args:
        logits: `(N, E)` float32 router logits.
        num_experts_per_tok: k.
        norm_topk_prob: divide the k kept probabilities by their sum.

    Returns:
        `(weights, indices, probs)`: `(N, k)` float32 weights, `(N, k)` int32 expert
        indices, and the `(N, E)` probabilities the load-balancing loss reads.
    """
    probs = ops.softmax(logits, axis=-1)
    weights, indices = ops.top_k(probs, num_experts_per_tok)
    if norm_topk_prob:
        weights = weights / ops.sum(weights, axis=-1, keepdims=True)
    return weights, ops.cast(indices, "int32"), probs


def sigmoid_group_topk(logits, num_experts_per_tok, norm_topk_prob, correction_bias,
                       n_group, topk_group, routed_scaling_factor):
    """DeepSeek V3 routing (transformers' `DeepseekV3TopkRouter`): sigmoid scores, a
    selection-only bias, group-limited top-k.

    `s = sigmoid(logits)`; the choice reads `c = s + correction_bias`: the E experts in
    `n_group` groups of E / n_group, each group scored by the sum of its two largest `c`,
    the `topk_group` best groups kept, the k largest `c` among their experts chosen. The
    weights are the chosen experts' unbiased `s`, divided by their sum (plus 1e-20) when
    `norm_topk_prob`, times `routed_scaling_factor`.

    Args:
        logits: `(N, E)` float32 router logits.
        num_experts_per_tok: k.
        norm_topk_prob: renormalise the k kept scores.
        correction_bias: `(E,)` float32, added for the choice only.
        n_group: the number of expert groups (divides E).
        topk_group: the groups kept per token.
        routed_scaling_factor: the weights' multiplier.

    Returns:
        `(weights, indices, scores)`: `(N, k)` float32, `(N, k)` int32, `(N, E)` the
        sigmoid scores.
    """
    scores = ops.sigmoid(logits)
    choice = scores + ops.cast(correction_bias, scores.dtype)[None, :]
    num_experts = ops.shape(logits)[-1]
    per_group = num_experts // n_group
    grouped = ops.reshape(choice, (-1, n_group, per_group))
    group_scores = ops.sum(ops.top_k(grouped, 2)[0], axis=-1)  # (N, G)
    _, groups = ops.top_k(group_scores, topk_group)
    kept = ops.sum(ops.one_hot(groups, n_group, dtype="float32"), axis=1)  # (N, G) 0 / 1
    kept = ops.reshape(ops.repeat(kept[..., None], per_group, axis=-1), (-1, num_experts))
    choice = ops.where(kept > 0, choice, ops.full_like(choice, float("-inf")))
    _, indices = ops.top_k(choice, num_experts_per_tok)
    indices = ops.cast(indices, "int32")
    weights = ops.take_along_axis(scores, indices, axis=-1)
    if norm_topk_prob:
        weights = weights / (ops.sum(weights, axis=-1, keepdims=True) + 1e-20)
    return weights * routed_scaling_factor, indices, scores


# A routing rule is named here: `rule(logits, k, norm_topk_prob) -> (weights, indices,
# probs)` (gpt-oss's "topk_softmax" and Llama 4's "llama4_sigmoid_topk" are registered
# below it).
# "sigmoid_group_topk" also reads the layer's `router_correction_bias`, `n_group`,
# `topk_group` and `routed_scaling_factor` (`MixtureOfExperts._routing_arguments`).
ROUTING = {"softmax_topk": softmax_topk, "sigmoid_group_topk": sigmoid_group_topk}
# The rules that take the layer's group arguments after (logits, k, norm_topk_prob).
GROUPED_ROUTING = ("sigmoid_group_topk",)


def topk_softmax(logits, num_experts_per_tok, norm_topk_prob):
    """gpt-oss routing (transformers' `GptOssTopKRouter`): the top-k of the logits, then a
    softmax over those k only.

    The weights equal `softmax_topk`'s renormalised ones (`exp(l_i) / sum_{j in top-k}
    exp(l_j)` either way); they are computed as gpt-oss does. `norm_topk_prob` changes
    nothing (the k weights already sum to 1).

    Returns:
        `(weights, indices, probs)` as `softmax_topk`; `probs` the softmax over all E
        logits (what transformers' `load_balancing_loss_func` reads of any router).
    """
    del norm_topk_prob  # the weights sum to 1 already
    top, indices = ops.top_k(logits, num_experts_per_tok)
    return ops.softmax(top, axis=-1), ops.cast(indices, "int32"), ops.softmax(logits, axis=-1)


ROUTING["topk_softmax"] = topk_softmax


def llama4_sigmoid_topk(logits, num_experts_per_tok, norm_topk_prob):
    """Llama 4 routing (transformers' `Llama4Router`): the top-k logits, each through a
    sigmoid (the others' scores are `sigmoid(-inf) = 0`); `Llama4TextMoe` multiplies each
    chosen expert's INPUT by its score (`INPUT_SCALED_ROUTING`), not its output.

    `norm_topk_prob` must be False (Llama 4 does not renormalise; the layer refuses True).

    Returns:
        `(weights, indices, probs)` as `softmax_topk`: `(N, k)` sigmoid scores, `(N, k)`
        int32, and the softmax over all E logits (what transformers'
        `load_balancing_loss_func` reads of the router logits).
    """
    del norm_topk_prob  # refused by the layer
    top, indices = ops.top_k(logits, num_experts_per_tok)
    return ops.sigmoid(top), ops.cast(indices, "int32"), ops.softmax(logits, axis=-1)


ROUTING["llama4_sigmoid_topk"] = llama4_sigmoid_topk
# The rules whose weights scale each chosen expert's input (`expert_e(w_e x)`) instead of
# its output (`w_e expert_e(x)`): `keras_attn.layers._moe_experts`' `scale_inputs`.
INPUT_SCALED_ROUTING = ("llama4_sigmoid_topk",)


def load_balancing_loss(probs, indices, num_experts):
    """transformers' `load_balancing_loss_func` for one layer, no attention mask.

    `E * sum_e f_e * P_e`, `f_e` the share of the N*k assignments that went to expert e
    times k (counts / N), `P_e` the mean router probability of e. `f` is a count: its
    gradient is zero, as in transformers (`torch.histc`); the gradient flows through P.
    """
    rows = ops.cast(ops.shape(probs)[0], "float32")
    counts = ops.sum(ops.one_hot(indices, num_experts, dtype="float32"), axis=(0, 1))
    return num_experts * ops.sum((counts / rows) * (ops.sum(probs, axis=0) / rows))


def scaled_rms_router_input(tokens, scale, epsilon):
    """Gemma 4's router input (transformers' `Gemma4TextRouter`): `x / sqrt(mean(x^2) +
    epsilon)` over D (an RMSNorm without a scale of its own, in float32, cast back), times
    the learned `scale` `(D,)` and `D**-0.5`.

    Args:
        tokens: `(N, D)`.
        scale: `(D,)`, the router's `scale`.
        epsilon: the norm's epsilon.

    Returns:
        `(N, D)` in the tokens' dtype.
    """
    x = ops.cast(tokens, "float32")
    normed = x * ops.power(ops.mean(ops.square(x), axis=-1, keepdims=True) + epsilon, -0.5)
    normed = ops.cast(normed, tokens.dtype)
    return normed * ops.cast(scale, tokens.dtype) * (tokens.shape[-1] ** -0.5)
