"""The float64 NumPy reference of a softmax-top-k mixture of experts and its aux loss.

Written from the Mixtral / Qwen3-MoE definitions (transformers'
`MixtralSparseMoeBlock`, `Qwen3MoeSparseMoeBlock`, `load_balancing_loss_func`),
token by token, expert by expert; it imports nothing from the layer it checks.
"""

import numpy as np

__all__ = ["load_balancing_loss", "mixture_of_experts", "route", "top_k_margin"]


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


def mixture_of_experts(x, params, k, norm_topk_prob, activation=_silu):
    """The output `(..., D)` for `x` `(..., D)`.

    `params`: `router` `(D, E)`, `gate` `(E, D, F)`, `up` `(E, D, F)`, `down` `(E, F, D)`.
    """
    x = np.asarray(x, np.float64)
    tokens = x.reshape(-1, x.shape[-1])
    weights, experts, _ = route(tokens, params["router"], k, norm_topk_prob)
    out = np.zeros_like(tokens)
    for n, token in enumerate(tokens):
        for w, e in zip(weights[n], experts[n], strict=True):
            hidden = activation(token @ params["gate"][e]) * (token @ params["up"][e])
            out[n] += w * (hidden @ params["down"][e])
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
