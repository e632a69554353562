"""Float64 NumPy reference of a mixture of experts (written from transformers'
`MixtralSparseMoeBlock` / `Qwen3MoeSparseMoeBlock` and `load_balancing_loss_func`, one
token and one expert at a time). Imports NumPy and this folder only."""

import numpy as np

from keras_attn.testing.reference import activation

__all__ = ["load_balancing_loss", "mixture_of_experts", "softmax_topk"]


def _softmax(logits):
    z = np.exp(logits - logits.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def softmax_topk(logits, k, norm_topk_prob):
    """Per token: the k largest softmax probabilities (descending) and their experts."""
    probabilities = _softmax(np.asarray(logits, np.float64))
    indices = np.argsort(-probabilities, axis=-1, kind="stable")[..., :k]
    weights = np.take_along_axis(probabilities, indices, -1)
    if norm_topk_prob:
        weights = weights / weights.sum(-1, keepdims=True)
    return weights, indices


def mixture_of_experts(x, weights, k, norm_topk_prob=True, act="silu"):
    """`x` `(B, T, D)`; `weights` {"router": (D, E), "gate": (E, D, F), "up": (E, D, F),
    "down": (E, F, D)}: `(y (B, T, D), router logits (B * T, E))`."""
    x = np.asarray(x, np.float64)
    B, T, D = x.shape
    tokens = x.reshape(B * T, D)
    w = {name: np.asarray(value, np.float64) for name, value in weights.items()}
    logits = tokens @ w["router"]
    routing, experts = softmax_topk(logits, k, norm_topk_prob)
    y = np.zeros_like(tokens)
    for n in range(B * T):
        for j in range(k):
            e = experts[n, j]
            hidden = activation(act, tokens[n] @ w["gate"][e]) * (tokens[n] @ w["up"][e])
            y[n] += routing[n, j] * (hidden @ w["down"][e])
    return y.reshape(B, T, D), logits


def load_balancing_loss(logits, k):
    """transformers' `load_balancing_loss_func` for one layer's logits `(N, E)`."""
    probabilities = _softmax(np.asarray(logits, np.float64))
    N, E = probabilities.shape
    _, experts = softmax_topk(logits, k, False)
    share = np.bincount(experts.reshape(-1), minlength=E) / N
    return float(E * np.sum(share * probabilities.mean(0)))
