"""`model_type="exaone4"` (EXAONE 4): OLMo 2's block shape (no norm before the
sublayers; `post_attention_layernorm`, `post_feedforward_layernorm` after them) with a
per-head qk-norm (`q_norm`, `k_norm` `(d,)`) before RoPE, no biases, and
"sliding_attention" / "full_attention" blocks (`layer_types`; without it every
`sliding_window_pattern`-th block full). With a `sliding_window` the full blocks have no
RoPE ("global NoPE": `modeling_exaone4.Exaone4Attention` rotates only when
`sliding_window is None or is_sliding`); without one every block is full and rotated."""

from keras_attn.convert._transformers_config import ModelSpec
from keras_attn.convert.families import _shared

MODEL_TYPE = "exaone4"
ARCHITECTURES = ("Exaone4ForCausalLM", "Exaone4Model")  # transformers' classes (`architectures`)
FIELDS = {
    "read": _shared.CORE_FIELDS + ("hidden_act", "rms_norm_eps", "sliding_window",
                                   "sliding_window_pattern", "layer_types"),
    "neutral": {},
    "ignored": {},
}


def spec(config):
    core = _shared.core(config, default_epsilon=1e-5)
    n = core["num_layers"]
    # Exaone4Config's default window (4096) when a config.json has none; None: no window.
    window = _shared.window_of({"sliding_window": 4096, **config})
    types = config.get("layer_types")
    if types is None:
        pattern = config.get("sliding_window_pattern", 4)
        if window is None:
            types = ["full_attention"] * n  # transformers sets the pattern to 0: no window
        elif isinstance(pattern, bool) or not isinstance(pattern, int) or pattern <= 0:
            # transformers 5.24 derives layer_types from an int pattern only
            _shared.refuse("sliding_window_pattern", pattern,
                           "without `layer_types`, a positive int: every n-th block full")
        else:
            types = _shared.every_nth_full(n, pattern)
    types = _shared.checked_layer_types(types, n, window)
    # Global NoPE: with a window, only the sliding blocks are rotated.
    uses_rope = [window is None or kind == "sliding_attention" for kind in types]
    return ModelSpec(
        **core, qkv_bias=False, output_bias=False, mlp_bias=False, qk_norm=True,
        final_logit_soft_cap=None, input_norms=False,
        layers=_shared.layer_specs(n, _shared.rope_of(config), uses_rope=uses_rope,
                                   windows=_shared.sliding_windows(types, window),
                                   qk_norm="rms", qk_norm_epsilon=core["epsilon"]))
