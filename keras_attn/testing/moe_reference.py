"""The float64 NumPy reference of a mixture of experts and its aux loss.

Written from the Mixtral / Qwen3-MoE definitions (transformers'
`MixtralSparseMoeBlock`, `Qwen3MoeSparseMoeBlock`, `load_balancing_loss_func`), DeepSeek
V3's (`DeepseekV3TopkRouter`, `DeepseekV3MoE`: sigmoid scores, a selection-only bias,
group-limited top-k, a shared expert), Qwen3-Next's sigmoid-gated shared expert and Llama
4's (`Llama4Router`, `Llama4TextMoe`: the sigmoid of the top-k logits scales each chosen
expert's input),
token by token, expert by expert; it imports nothing from the layer it checks.
"""

import numpy as np

__all__ = ["group_route", "group_route_margins", "llama4_route", "load_balancing_loss",
           "mixture_of_experts", "route", "top_k_margin"]


def _silu(x):
    return x / (1.0 + np.exp(-x))


def route(x, router, k, norm_topk_prob):
    """`(weights (N, k), experts (N, k), probs (N, E))` for tokens `x` `(N, D)`."""
    logits = np.asarray(x, np.float64) @ np.asarray(router, np.float64)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    experts = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
    weights = np.take_along_axis(probs, experts, -1)
    if norm_topk_prob:
        weights = weights / weights.sum(-1, keepdims=True)
    return weights, experts, probs


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _group_choice(choice, k, n_group, topk_group):
    """One token's k experts: the `topk_group` groups with the largest sum of their two
    best `choice` values, then the k best experts inside them (as sets, sorted)."""
    groups = np.asarray(choice).reshape(n_group, -1)
    per = groups.shape[1]
    group_scores = np.sort(groups, axis=-1)[:, -2:].sum(-1)
    kept = np.argsort(-group_scores, kind="stable")[:topk_group]
    candidates = [g * per + j for g in sorted(kept) for j in range(per)]
    best = sorted(candidates, key=lambda e: -choice[e])[:k]
    return np.array(sorted(best))


def group_route(x, router, k, norm_topk_prob, bias, n_group, topk_group, scaling):
    """DeepSeek V3's routing: `(weights (N, k), experts (N, k), scores (N, E))`."""
    logits = np.asarray(x, np.float64) @ np.asarray(router, np.float64)
    scores = _sigmoid(logits)
    experts = np.stack([_group_choice(s + np.asarray(bias, np.float64), k, n_group,
                                      topk_group) for s in scores])
    weights = np.take_along_axis(scores, experts, -1)
    if norm_topk_prob:
        weights = weights / (weights.sum(-1, keepdims=True) + 1e-20)
    return weights * scaling, experts, scores


def group_route_margins(x, router, k, bias, n_group, topk_group):
    """`(group margin, expert margin)`, the smallest over tokens: the gap between the
    `topk_group`-th and next group score, and between the k-th and (k+1)-th biased score
    inside the kept groups. Both large: the choice is stable under float32 rounding and
    finite differences."""
    tokens = np.asarray(x, np.float64).reshape(-1, np.shape(router)[0])
    choice = _sigmoid(tokens @ np.asarray(router, np.float64)) + np.asarray(bias, np.float64)
    group_margin = expert_margin = np.inf
    for c in choice:
        groups = c.reshape(n_group, -1)
        scores = np.sort(np.sort(groups, axis=-1)[:, -2:].sum(-1))[::-1]
        if topk_group < n_group:
            group_margin = min(group_margin, scores[topk_group - 1] - scores[topk_group])
        kept = np.argsort(-np.sort(groups, axis=-1)[:, -2:].sum(-1), kind="stable")[:topk_group]
        inside = np.sort(groups[kept].reshape(-1))[::-1]
        if k < inside.size:
            expert_margin = min(expert_margin, inside[k - 1] - inside[k])
    return float(group_margin), float(expert_margin)


def llama4_route(x, router, k):
    """Llama 4's routing: `(weights (N, k), experts (N, k))`, the sigmoid of the k largest
    logits."""
    logits = np.asarray(x, np.float64) @ np.asarray(router, np.float64)
    experts = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
    return _sigmoid(np.take_along_axis(logits, experts, -1)), experts


def _mlp(token, gate, up, down, activation):
    return (activation(token @ gate) * (token @ up)) @ down


def mixture_of_experts(x, params, k, norm_topk_prob, activation=_silu, grouping=None,
                       scale_output=False):
    """The output `(..., D)` for `x` `(..., D)`.

    `params`: `router` `(D, E)`, `gate` `(E, D, F)`, `up` `(E, D, F)`, `down` `(E, F, D)`;
    a shared expert with `shared_gate` `(D, S)`, `shared_up` `(D, S)`, `shared_down`
    `(S, D)` (and `shared_expert_gate` `(D, 1)`: Qwen3-Next's sigmoid gate).
    `grouping`: None (softmax top-k), DeepSeek V3's routing as a dict `bias` `(E,)`,
    `n_group`, `topk_group`, `scaling`, or "llama4": Llama 4's, each chosen expert run on
    `w_e * token`, its output unweighted (`scale_output=True`: weighted instead, the
    ablation).
    """
    x = np.asarray(x, np.float64)
    tokens = x.reshape(-1, x.shape[-1])
    if grouping == "llama4":
        weights, experts = llama4_route(tokens, params["router"], k)
    elif grouping is None:
        weights, experts, _ = route(tokens, params["router"], k, norm_topk_prob)
    else:
        weights, experts, _ = group_route(tokens, params["router"], k, norm_topk_prob,
                                          grouping["bias"], grouping["n_group"],
                                          grouping["topk_group"], grouping["scaling"])
    out = np.zeros_like(tokens)
    for n, token in enumerate(tokens):
        for w, e in zip(weights[n], experts[n], strict=True):
            expert = (params["gate"][e], params["up"][e], params["down"][e], activation)
            if grouping == "llama4" and not scale_output:
                out[n] += _mlp(w * token, *expert)
            else:
                out[n] += w * _mlp(token, *expert)
        if "shared_gate" in params:
            shared = _mlp(token, params["shared_gate"], params["shared_up"],
                          params["shared_down"], activation)
            if "shared_expert_gate" in params:
                shared = _sigmoid(token @ params["shared_expert_gate"]) * shared
            out[n] += shared
    return out.reshape(x.shape)


def load_balancing_loss(x, router, k):
    """Switch Transformer Eqs. 4-6 as transformers computes them for one layer's logits:
    `E * sum_e (count_e / N) * mean_n p_ne`, count_e the top-k picks of expert e."""
    tokens = np.asarray(x, np.float64).reshape(-1, np.shape(router)[0])
    _, experts, probs = route(tokens, router, k, False)
    num_experts = probs.shape[-1]
    counts = np.bincount(experts.reshape(-1), minlength=num_experts)
    return num_experts * float(np.sum(counts / len(tokens) * probs.mean(0)))


def top_k_margin(x, router, k):
    """The smallest gap, over tokens, between the k-th and the (k+1)-th router
    probability: the choice of experts is stable under float32 rounding (and finite
    differences) when it is large."""
    tokens = np.asarray(x, np.float64).reshape(-1, np.shape(router)[0])
    _, _, probs = route(tokens, router, 1, False)
    ordered = -np.sort(-probs, axis=-1)
    return float((ordered[:, k - 1] - ordered[:, k]).min())
