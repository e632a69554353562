"""The fields transformers 4's `PretrainedConfig` adds to every config, classified once.

transformers 4 (4.45 to 4.57) serialised about 35 keys into every `to_dict()` that
transformers 5 no longer writes: its `generate` defaults (5 keeps them in
`GenerationConfig`) and legacy flags. A config.json saved by 4.x holds those that
differ from their defaults (`save_pretrained` writes the difference); a config object
of 4.x holds them all. None of them changes the logits of the decoder-only families
keras_attn converts (their 4.x modeling files read none of them: the greedy tokens
and logits of tests/convert/test_families.py match under 4.45.2), so they are
`ignored`, each with its reason; `cross_attention_hidden_size` is `neutral` (None):
a size for cross-attention describes an encoder-decoder's decoder, as
`add_cross_attention` does. `_transformers_config.table_of` adds both to every
family's table, so every family accepts 4.x and 5.x configs alike.
"""

__all__ = ["IGNORED_4", "NEUTRAL_4"]

# transformers 4's `generate` defaults, read from the model config when no
# generation_config.json overrode them.
_GENERATION = (
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams",
    "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p", "typical_p",
    "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences",
    "output_scores", "return_dict_in_generate", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
    "suppress_tokens", "begin_suppress_tokens", "decoder_start_token_id")

IGNORED_4 = {
    **{field: "a default of transformers 4's `generate` (transformers 5 keeps it in "
              "GenerationConfig): the logits are the same, and keras_attn's `generate` "
              "takes its own arguments" for field in _GENERATION},
    "use_bfloat16": "a flag of transformers 4's TensorFlow models; the Keras model's dtype "
                    "policy decides, as for `dtype`",
    "tf_legacy_loss": "the loss of transformers 4's TensorFlow models (training only)",
    "is_decoder": "read by encoder models' attention masks only; the decoder-only "
                  "families' models are causal whatever it says",
    "finetuning_task": "metadata of fine-tuning scripts",
    "prefix": "a text prefix for transformers 4's pipelines (the tokenizer's side)",
    "task_specific_params": "settings of transformers 4's pipelines (generation lengths, "
                            "prefixes): the logits are the same",
    "tokenizer_class": "the tokenizer's class",
    "sep_token_id": "as `bos_token_id`",
    "_attn_implementation_autoset": "which kernel transformers 4.4x chose for its attention "
                                    "(eager, sdpa, flash): the same values",
}

NEUTRAL_4 = {"cross_attention_hidden_size": (None,)}
