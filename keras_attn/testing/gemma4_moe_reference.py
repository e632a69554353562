"""The float64 NumPy reference of Gemma 4's feed-forward with its mixture of experts.

Written from transformers' `Gemma4TextRouter` (an RMSNorm without a scale, times `scale`
and `D**-0.5`, softmax over all experts, the top k renormalised, times
`per_expert_scale` of each), `Gemma4TextExperts` (fused gate/up, the tanh GELU) and the
`enable_moe_block` branch of `Gemma4TextDecoderLayer` (the dense MLP and the experts in
parallel, each between its two RMSNorms), token by token, expert by expert; it imports
nothing from the layers it checks.
"""

import numpy as np

__all__ = ["feed_forward", "gelu_tanh", "logit_margin", "mixture_of_experts", "rms_norm",
           "route"]


def gelu_tanh(x):
    """GELU's tanh approximation (`gelu_pytorch_tanh`)."""
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def rms_norm(x, scale, epsilon):
    """`x / sqrt(mean(x^2) + epsilon) * scale` over the last axis (`scale` None: 1)."""
    x = np.asarray(x, np.float64)
    out = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + epsilon)
    return out if scale is None else out * np.asarray(scale, np.float64)


def _logits(tokens, params, epsilon):
    D = tokens.shape[-1]
    routed = rms_norm(tokens, None, epsilon) * params["router_scale"] * D ** -0.5
    return routed @ np.asarray(params["router"], np.float64)


def route(tokens, params, k, epsilon):
    """`(weights (N, k), experts (N, k))` for `(N, D)` tokens: Gemma 4's router.

    `params`: `router` `(D, E)`, `router_scale` `(D,)`, `per_expert_scale` `(E,)`.
    """
    logits = _logits(np.asarray(tokens, np.float64), params, epsilon)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    experts = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
    weights = np.take_along_axis(probs, experts, -1)
    weights = weights / weights.sum(-1, keepdims=True)
    return weights * np.asarray(params["per_expert_scale"], np.float64)[experts], experts


def mixture_of_experts(x, router_x, params, k, epsilon):
    """The experts' weighted sum `(N, D)` for `x` `(N, D)` routed on `router_x` `(N, D)`.

    `params`: the router's (`route`) and `gate`, `up` `(E, D, F)`, `down` `(E, F, D)`.
    """
    p = {name: np.asarray(value, np.float64) for name, value in params.items()}
    weights, experts = route(router_x, p, k, epsilon)
    out = np.zeros(np.shape(x), np.float64)
    for n, token in enumerate(np.asarray(x, np.float64)):
        for w, e in zip(weights[n], experts[n], strict=True):
            out[n] += w * ((gelu_tanh(token @ p["gate"][e]) * (token @ p["up"][e]))
                           @ p["down"][e])
    return out


def feed_forward(x, params, k, epsilon):
    """Gemma 4's `enable_moe_block` feed-forward `(..., D)` for the residual `x` `(..., D)`,
    before the block's `post_feedforward_layernorm`.

    `N_1(mlp(N_0(x))) + N_3(experts(N_2(x)))`, the router on `x`. `params`: the mixture's
    (`mixture_of_experts`), the MLP's `mlp_gate`, `mlp_up` `(D, F_d)`, `mlp_down`
    `(F_d, D)` and the norms' scales `dense_norm`, `post_dense_norm`, `experts_norm`,
    `post_experts_norm` `(D,)`.
    """
    p = {name: np.asarray(value, np.float64) for name, value in params.items()}
    x = np.asarray(x, np.float64)
    tokens = x.reshape(-1, x.shape[-1])
    h = rms_norm(tokens, p["dense_norm"], epsilon)
    dense = (gelu_tanh(h @ p["mlp_gate"]) * (h @ p["mlp_up"])) @ p["mlp_down"]
    experts = mixture_of_experts(rms_norm(tokens, p["experts_norm"], epsilon), tokens, p, k,
                                 epsilon)
    out = (rms_norm(dense, p["post_dense_norm"], epsilon)
           + rms_norm(experts, p["post_experts_norm"], epsilon))
    return out.reshape(x.shape)


def logit_margin(x, params, k, epsilon):
    """The smallest gap, over tokens, between the k-th and (k+1)-th router logit (the
    softmax keeps their order): the choice is stable under float32 rounding (and finite
    differences) when it is large."""
    tokens = np.asarray(x, np.float64).reshape(-1, np.shape(params["router"])[0])
    ordered = -np.sort(-_logits(tokens, params, epsilon), axis=-1)
    return float((ordered[:, k - 1] - ordered[:, k]).min())
