"""The float64 NumPy reference of gpt-oss's mixture of experts.

Written from transformers' `GptOssTopKRouter` (logits with a bias, the top k of them,
a softmax over those k) and `GptOssExperts` (biased gate/up/down projections, the
clamped SwiGLU `(clip(u, -limit, limit) + 1) * g * sigmoid(alpha g)`, `g` clamped above
at `limit`), token by token, expert by expert; it imports nothing from the layer it
checks.
"""

import numpy as np

__all__ = ["clamped_fraction", "logit_margin", "mixture_of_experts", "route"]


def route(x, router, router_bias, k):
    """`(weights (N, k), experts (N, k))` for tokens `x` `(N, D)`: softmax over the top-k
    logits `x router + router_bias`."""
    logits = np.asarray(x, np.float64) @ np.asarray(router, np.float64) + router_bias
    experts = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
    top = np.take_along_axis(logits, experts, -1)
    weights = np.exp(top - top.max(-1, keepdims=True))
    return weights / weights.sum(-1, keepdims=True), experts


def _swiglu(gate, up, alpha, limit):
    gate = np.minimum(gate, limit)
    up = np.clip(up, -limit, limit)
    return (up + 1.0) * gate / (1.0 + np.exp(-alpha * gate))


def mixture_of_experts(x, params, k, alpha=1.702, limit=7.0):
    """The output `(..., D)` for `x` `(..., D)`.

    `params`: `router` `(D, E)`, `router_bias` `(E,)`, `gate`, `up` `(E, D, F)`,
    `gate_bias`, `up_bias` `(E, F)`, `down` `(E, F, D)`, `down_bias` `(E, D)`.
    """
    p = {name: np.asarray(value, np.float64) for name, value in params.items()}
    x = np.asarray(x, np.float64)
    tokens = x.reshape(-1, x.shape[-1])
    weights, experts = route(tokens, p["router"], p["router_bias"], k)
    out = np.zeros_like(tokens)
    for n, token in enumerate(tokens):
        for w, e in zip(weights[n], experts[n], strict=True):
            gate = token @ p["gate"][e] + p["gate_bias"][e]
            up = token @ p["up"][e] + p["up_bias"][e]
            out[n] += w * (_swiglu(gate, up, alpha, limit) @ p["down"][e] + p["down_bias"][e])
    return out.reshape(x.shape)


def logit_margin(x, router, router_bias, k):
    """The smallest gap, over tokens, between the k-th and (k+1)-th router logit: the
    choice of experts is stable under float32 rounding (and finite differences) when it
    is large."""
    tokens = np.asarray(x, np.float64).reshape(-1, np.shape(router)[0])
    ordered = -np.sort(-(tokens @ router + router_bias), axis=-1)
    return float((ordered[:, k - 1] - ordered[:, k]).min())


def clamped_fraction(x, params, limit):
    """The fractions of gate values above `limit` and of up values outside
    `[-limit, limit]`, over every token and expert: a test's clamp is exercised when
    both are well above 0."""
    tokens = np.asarray(x, np.float64).reshape(-1, np.shape(params["gate"])[1])
    gate = np.einsum("nd,edf->enf", tokens, params["gate"]) + params["gate_bias"][:, None]
    up = np.einsum("nd,edf->enf", tokens, params["up"]) + params["up_bias"][:, None]
    return float((gate > limit).mean()), float((np.abs(up) > limit).mean())
