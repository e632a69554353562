"""`CausalLM`: a decoder-only language model built from `TransformerDecoderLayer` blocks."""

from collections.abc import Sequence

import keras
from keras import ops

from keras_attn._validation import check_positive_float, check_positive_int
from keras_attn.cache import empty_cache
from keras_attn.layers._common import check_not_quantized
from keras_attn.models import _padding, _per_layer_inputs
from keras_attn.models._checks import (
    _built_width,
    _check_blocks,
    _check_kv_sharing,
    _check_kv_sharing_blocks,
    _check_positions,
    _check_source_config,
    _check_token_ids,
)
from keras_attn.models._generate_loop import generate_over_kept_loops

__all__ = ["CausalLM"]


@keras.saving.register_keras_serializable(package="keras_attn")
class CausalLM(keras.Model):
    """A decoder-only language model: token ids `(B, T)` to next-token logits `(B, T, V)`.

    The model computes, in order: `x = token_embedding(ids)` `(B, T, D)`,
    times `embedding_scale` if set (Gemma: `sqrt(D)`, the multiplier cast to
    the compute dtype first, as Hugging Face does); plus, with
    `max_position_embeddings`, the learned position embedding of each token's
    position (GPT-2's `wpe`); each of the `blocks` (a
    causal, decoder-only `keras_attn.TransformerDecoderLayer` without
    memory, with any `attention=` and `feed_forward=`; each keeps its own
    window, RoPE and options); `final_norm` (`normalization`,
    `layer_norm_epsilon`); the head: the embedding matrix transposed
    (`tie_word_embeddings=True`) or `lm_head`, a `Dense(V)` without bias;
    divided by `logits_scaling` if set (Granite); and, if
    `final_logit_soft_cap` c is set, `c * tanh(logits / c)` (Gemma 2), on
    the scaled logits. Positions are `0 .. T - 1` (in a cached step
    `cache_update_index + i`).

    A block is any `keras.layers.Layer` that keeps this contract (which
    `TransformerDecoderLayer` keeps, whatever its sublayers):
    `block(x, use_causal_mask=True)` maps `(B, T, D)` to `(B, T, D)`; it is
    built with `block.build((None, None, D))` if it is not built; and for
    `generate`, `block(x, self_attention_cache=c,
    self_attention_cache_update_index=i)` returns `(y, new_c)` with `c` from
    `keras_attn.empty_cache(block, B, L)` (which needs the block's
    `self_attention` to be a `keras_attn.MultiHeadAttention` or to expose its
    `num_key_value_heads` and `key_dim`). A model of blocks without such a
    cache is called on whole sequences; `generate` raises a `ValueError`.
    A hybrid stack (Qwen 3.5) mixes blocks whose attention is a
    `keras_attn.layers.GatedDeltaNet` (their cache a fixed-size
    `keras_attn.recurrent_cache.RecurrentCache`, which `empty_cache` makes
    for them) with softmax blocks (a `KVCache` of L slots): `generate`'s
    prefill runs the whole prompt through each (the chunked delta rule), its
    steps one token (the recurrent form), in the one compiled loop.

    Shapes: B batch, T length, V `vocabulary_size`, D `hidden_dim`, P the
    prompt length and L the generated length (`max_length`).

    Sublayers (weight names): `token_embedding`, `blocks` (a list),
    `final_norm` and, untied, `lm_head` (and `position_embedding` with
    `max_position_embeddings`). The model is built when made.

    Args:
        vocabulary_size: V.
        hidden_dim: D, the width of the embedding and of every block.
        blocks: the `keras_attn.TransformerDecoderLayer`s (or other layers
            keeping the contract above), in order, or their serialized
            configs. A built block must be built for `(..., D)` without
            memory; an unbuilt one is built here.
        normalization: `"rms"` (`keras.layers.RMSNormalization`) or
            `"layer"` (`keras.layers.LayerNormalization`): the final norm.
        layer_norm_epsilon: the final norm's epsilon (> 0).
        tie_word_embeddings: whether the head is the embedding matrix
            transposed (True) or its own `lm_head` kernel `(D, V)`.
        embedding_scale: the multiplier of the embedded tokens (> 0), or
            None for none.
        final_logit_soft_cap: c > 0, or None: the logits become
            `c * tanh(logits / c)`.
        logits_scaling: s > 0, or None: the head's logits are divided by s
            (transformers' Granite `logits_scaling`, which has no soft-cap;
            here the cap, if any, applies after the division). In the config
            only when set.
        kv_sharing: None, or one entry per block: None, or the index j of an
            earlier block whose keys and values (after qk-norm and RoPE) this
            block attends instead of its own (Gemma 4's `num_kv_shared_layers`:
            transformers' "reuse" layers and their "store" layer). Block i's
            self-attention must have `is_kv_shared_layer=True` exactly where
            an index is given; it reads block j's cache (in `generate`, at the
            step's index; uncached, block j runs over a cache of T slots, so
            the batch and length must be static). In the config when set.
        hidden_size_per_layer_input: P, or None: Gemma 4's (Gemma 3n's)
            per-layer input embeddings. Sublayers `embed_tokens_per_layer`
            `Embedding(V_p, L * P)`, `per_layer_model_projection` `Dense(L * P)`
            (no bias) and `per_layer_projection_norm` (RMS over P); the inputs
            `(norm(reshape(x W / sqrt(D))) + sqrt(P) reshape(E[ids])) / sqrt(2)`
            `(B, T, L, P)` of the scaled embeddings `x`, slice i passed to block
            i as `per_layer_input` (its `hidden_size_per_layer_input` must be
            P). In the config when set.
        vocab_size_per_layer_input: V_p, the per-layer embeddings' vocabulary
            (None: V); with `hidden_size_per_layer_input` only.
        max_position_embeddings: N, or None: learned absolute positions (GPT-2's
            `wpe`, transformers' `max_position_embeddings` / `n_positions`): a
            sublayer `position_embedding` `Embedding(N, D)` (keras-hub's GPT2Backbone's
            name) whose row p is added to the (scaled) token embedding at position p
            (`cache_update_index + i` in a cached step). T > N or `max_length` > N is
            a `ValueError`. `generate` takes prompts without padding here: a
            left-padded row would need per-row positions (transformers'
            `attention_mask.cumsum(-1) - 1`). In the config when set.
        source_config: None, or the Hugging Face config (a `config.json` dict)
            the model was converted from: `keras_attn.convert` sets it, and
            `save_pretrained` writes the checkpoint of that family from it. In
            the config when set.
        lora: None, or `{"rank": r, "target_names": [...]}`: what `enable_lora`
            enabled (it sets it; a saved model gets its LoRA back). In the config
            when set.
        **kwargs: `name`, `dtype` and the other arguments of `keras.Model`.

    Call arguments:
        token_ids: int `(B, T)`; or keras-hub's dict `{"token_ids": ...,
            "padding_mask": ...}` (the form `fit` and `predict` pass a model
            given a dict; `"attention_mask"` is accepted in it too).
        padding_mask: None, or bool/int `(B, T)`, True/1 = a real token: a
            batch padded on the left (every row's last position real) or on
            the right (every row's first position real). Each row's logits
            at its real positions are those of the row alone (left padding:
            rolled to the right, the forward, rolled back); at padded
            positions they are 0. A concrete mask of another layout is a
            `ValueError`; a traced one (inside `fit`) is taken as given.
        attention_mask: transformers' name for `padding_mask` (not both).

    Returns:
        The logits, `(B, T, V)` in the compute dtype.

    Example: two blocks (the second with a sliding window), then 4 greedy tokens.

    >>> import keras
    >>> import numpy as np
    >>> import keras_attn
    >>> blocks = [keras_attn.TransformerDecoderLayer(
    ...     2, intermediate_dim=32, key_dim=8, rope_max_wavelength=1e4, normalization="rms",
    ...     normalize_first=True, gated_feed_forward=True, activation="silu",
    ...     use_bias=False, sliding_window=window) for window in (None, 3)]
    >>> lm = keras_attn.CausalLM(vocabulary_size=50, hidden_dim=16, blocks=blocks)
    >>> prompt = np.array([[1, 2, 3], [4, 5, 6]])
    >>> tuple(lm(prompt).shape)
    (2, 3, 50)
    >>> tokens = lm.generate(prompt, max_length=7)
    >>> tuple(tokens.shape), keras.backend.standardize_dtype(tokens.dtype)
    ((2, 7), 'int32')
    """

    def __init__(self, vocabulary_size: int, hidden_dim: int,
                 blocks: Sequence[keras.layers.Layer | dict], *,
                 normalization: str = "rms", layer_norm_epsilon: float = 1e-6,
                 tie_word_embeddings: bool = True, embedding_scale: float | None = None,
                 final_logit_soft_cap: float | None = None,
                 logits_scaling: float | None = None,
                 kv_sharing: Sequence[int | None] | None = None,
                 hidden_size_per_layer_input: int | None = None,
                 vocab_size_per_layer_input: int | None = None,
                 max_position_embeddings: int | None = None,
                 source_config: dict | None = None, lora: dict | None = None,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        self.vocabulary_size = check_positive_int("vocabulary_size", vocabulary_size)
        self.hidden_dim = check_positive_int("hidden_dim", hidden_dim)
        if normalization not in ("rms", "layer"):
            raise ValueError("`normalization` must be 'rms' or 'layer'. "
                             f"Received: normalization={normalization!r}")
        self.normalization = normalization
        self.layer_norm_epsilon = check_positive_float("layer_norm_epsilon", layer_norm_epsilon)
        self.tie_word_embeddings = bool(tie_word_embeddings)
        self.embedding_scale = check_positive_float(
            "embedding_scale", embedding_scale, allow_none=True)
        self.final_logit_soft_cap = check_positive_float(
            "final_logit_soft_cap", final_logit_soft_cap, allow_none=True)
        self.logits_scaling = check_positive_float(
            "logits_scaling", logits_scaling, allow_none=True)
        self.blocks = _check_blocks(blocks)
        self.token_embedding = keras.layers.Embedding(
            self.vocabulary_size, self.hidden_dim, dtype=self.dtype_policy,
            name="token_embedding")
        self.final_norm = (keras.layers.RMSNormalization if normalization == "rms"
                           else keras.layers.LayerNormalization)(
            epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name="final_norm")
        self.lm_head = None if self.tie_word_embeddings else keras.layers.Dense(
            self.vocabulary_size, use_bias=False, dtype=self.dtype_policy, name="lm_head")
        self.hidden_size_per_layer_input = check_positive_int(
            "hidden_size_per_layer_input", hidden_size_per_layer_input, allow_none=True)
        self.vocab_size_per_layer_input = check_positive_int(
            "vocab_size_per_layer_input", vocab_size_per_layer_input, allow_none=True)
        _per_layer_inputs.check(self)
        if self.hidden_size_per_layer_input:
            _per_layer_inputs.add_sublayers(self)
        self.kv_sharing = _check_kv_sharing(kv_sharing, len(self.blocks))
        self.max_position_embeddings = check_positive_int(
            "max_position_embeddings", max_position_embeddings, allow_none=True)
        if self.max_position_embeddings:
            self.position_embedding = keras.layers.Embedding(
                self.max_position_embeddings, self.hidden_dim, dtype=self.dtype_policy,
                name="position_embedding")
        self.source_config = _check_source_config(source_config)
        self.lora = None
        self.build((None, None))
        if lora is not None:  # a saved LoRA model: its LoRA again (models/_lora.py)
            from keras_attn.models._lora import enable_from_config

            enable_from_config(self, lora)

    def build(self, input_shape=None):
        hidden_shape = (None, None, self.hidden_dim)
        self.token_embedding.build((None, None))
        for i, block in enumerate(self.blocks):
            if not block.built:
                block.build(hidden_shape)
            elif _built_width(block) not in (None, self.hidden_dim):
                raise ValueError(
                    f"`blocks[{i}]` ('{block.name}') was built for inputs of width "
                    f"{_built_width(block)}, not hidden_dim="
                    f"{self.hidden_dim}. Received: hidden_dim={self.hidden_dim}")
        self.final_norm.build(hidden_shape)
        if self.max_position_embeddings:
            self.position_embedding.build((None,))
        if self.lm_head is not None:
            self.lm_head.build(hidden_shape)
        if self.hidden_size_per_layer_input:
            _per_layer_inputs.build(self, hidden_shape)
        _check_kv_sharing_blocks(self.blocks, self.kv_sharing)
        self.built = True

    def _per_layer_inputs(self, token_ids, x):
        """`(B, T, L, P)`: Gemma 4's per-layer inputs (`_per_layer_inputs.compute`), or None."""
        if not self.hidden_size_per_layer_input:
            return None
        return _per_layer_inputs.compute(self, token_ids, x)

    def _blocks(self, x, per_layer, caches=None, cache_update_index=None):
        """The blocks over `x` `(B, T, D)`, uncached (`caches` None) or cached: `(x, new
        caches or None)`. A KV-shared block (`kv_sharing`) reads its source block's cache:
        uncached, the source runs over a cache of T slots (its keys and values, after
        qk-norm and RoPE, are then the shared ones)."""
        sources = self.kv_sharing or [None] * len(self.blocks)
        producers = {j for j in sources if j is not None}
        shared, new_caches = {}, []
        for i, block in enumerate(self.blocks):
            extra = {} if per_layer is None else {"per_layer_input": per_layer[:, :, i, :]}
            if caches is not None:
                cache, index = caches[i], cache_update_index
            elif i in producers or sources[i] is not None:
                B, T = tuple(x.shape)[:2]
                cache, index = empty_cache(block, B, T, as_kv_cache=True), 0
            else:
                x = block(x, use_causal_mask=True, **extra)
                continue
            if sources[i] is not None:  # attends its source's keys and values, writes none
                x, _ = block(x, self_attention_cache=shared[sources[i]],
                             self_attention_cache_update_index=index, **extra)
            else:
                x, cache = block(x, self_attention_cache=cache,
                                 self_attention_cache_update_index=index, **extra)
                shared[i] = cache
            new_caches.append(cache)
        return x, (new_caches if caches is not None else None)

    def _embed(self, token_ids, start=0):
        """The (scaled) token embeddings, plus those of the positions `start + i` with
        `max_position_embeddings` (`start`: 0, or a cached step's index)."""
        x = self.token_embedding(token_ids)
        if self.embedding_scale is not None:
            x = x * ops.cast(self.embedding_scale, x.dtype)
        if self.max_position_embeddings:
            _check_positions(token_ids, start, self.max_position_embeddings)
            positions = ops.arange(ops.shape(token_ids)[1], dtype="int32") + ops.cast(
                start, "int32")
            x = x + ops.cast(self.position_embedding(positions), x.dtype)[None]
        return x

    def _logits(self, x):
        x = self.final_norm(x)
        if self.lm_head is None:
            kernel = ops.cast(self.token_embedding.embeddings, x.dtype)
            logits = ops.matmul(x, ops.transpose(kernel))
        else:
            logits = self.lm_head(x)
        if self.logits_scaling is not None:
            logits = logits / ops.cast(self.logits_scaling, logits.dtype)
        if self.final_logit_soft_cap is not None:
            cap = ops.cast(self.final_logit_soft_cap, logits.dtype)
            logits = cap * ops.tanh(logits / cap)
        return logits

    def call(self, token_ids, padding_mask=None, attention_mask=None):
        """Logits `(B, T, V)`; with a padding mask, see `_padding.padded_call`."""
        token_ids, mask = _padding.unpack_inputs(token_ids, padding_mask, attention_mask)
        token_ids = _check_token_ids("token_ids", token_ids, self.vocabulary_size)
        if mask is not None:
            return _padding.padded_call(self._forward, token_ids, mask)
        return self._forward(token_ids)

    def _forward(self, token_ids):
        x = self._embed(token_ids)
        x, _ = self._blocks(x, self._per_layer_inputs(token_ids, x))
        return self._logits(x)

    def compute_output_spec(self, token_ids, padding_mask=None, attention_mask=None):
        token_ids, _ = _padding.unpack_inputs(token_ids, padding_mask, attention_mask)
        _check_token_ids("token_ids", token_ids)
        shape = tuple(token_ids.shape)
        return keras.KerasTensor(shape + (self.vocabulary_size,), dtype=self.compute_dtype)

    def next_token_logits(self, token_ids, caches, cache_update_index, logits_to_keep=0):
        """One cached step: `(logits (B, T, V), caches)`, the `next_token_fn` of `generate`.

        `caches` is a list of one cache per block: a `keras_attn.KVCache`
        (`keras_attn.empty_cache(block, B, S_max, as_kv_cache=True)`, what
        `generate` uses) or keras-hub's tensor (`empty_cache(block, B, S_max)`);
        the T tokens are the positions `cache_update_index + i`. `logits_to_keep`:
        transformers' argument; N > 0 gives the last N positions' logits `(B, N, V)`
        only (`generate`'s prefill keeps 1: the head skips the other positions), 0 all.
        """
        if logits_to_keep != 0:
            check_positive_int("logits_to_keep", logits_to_keep)
        x = self._embed(token_ids, cache_update_index)
        x, new_caches = self._blocks(x, self._per_layer_inputs(token_ids, x), list(caches),
                                     cache_update_index)
        return self._logits(x[:, -logits_to_keep:] if logits_to_keep else x), new_caches

    def generate(self, prompt_ids, max_length: int, *, end_token_id=None,
                 temperature: float = 0.0, top_k: int | None = None, seed=None,
                 jit_compile="auto", padding_mask=None, attention_mask=None,
                 pad_token_id: int | None = None, return_lengths: bool = False,
                 top_p: float | None = None, streamer=None):
        """Extend `prompt_ids` `(B, P)` to `(B, L)` tokens, greedy by default.

        A prefill over the prompt, then one cached step per token inside
        `keras.ops.while_loop` (`keras_attn.generation.generate`, which documents
        `end_token_id`, `temperature`, `top_k`, `top_p`, `seed` and `streamer`), over one
        key/value cache of L slots per block.

        RoPE whose frequencies switch with the positions (longrope: past
        `original_max_position_embeddings`) recompute the caches once there, as
        transformers' Phi-3 generation does (`keras_attn.generation.generate`'s
        `recompute_cache_at`): the tokens are the uncached forward's greedy ones.

        Compilation (docs/guides/cache.md, "Compilation"): a concrete prompt's prefill
        and loop run as one function, compiled once per prompt shape and settings and
        kept (at most 8, least recently used dropped; the seed, temperature, `top_k` and
        `top_p` are its inputs). `jit_compile="auto"`: XLA on JAX and TensorFlow (also on
        CPU), a traced decoding step on PyTorch; `True` on PyTorch: `torch.compile`;
        `False`: no XLA and no graph. A traced prompt, a `SeedGenerator` or no seed runs
        the loop in the caller's context; a `streamer` runs the steps from Python.

        Padded batches (`padding_mask`; docs/guides/cache.md): each row is
        decoded as if alone (rolled to right padding, fed its own prompt
        tokens until its prompt ends); right-padded rows come back as
        keras-hub's (prompt, `L - len_i` new tokens), left-padded ones as
        transformers' (the same pads, the prompt, `L - P` new tokens).

        Args:
            prompt_ids: int `(B, P)`: every row P real tokens, or padded as
                `padding_mask` says.
            max_length: L > P, the length of the result (prompt included).
            end_token_id: None, a stop token id, or a list of them.
            temperature: 0 for greedy decoding, else the sampling
                temperature.
            top_k: with sampling, only among the k most likely tokens.
            seed: an int or `keras.random.SeedGenerator`, for sampling.
            jit_compile: "auto", True or False, as described above.
            padding_mask: None, or bool/int `(B, P)`, True/1 = a real token
                (keras-hub's name): every row padded on the left (its last
                position real) or every row on the right (its first position
                real). Holes, a row without a real token or a mix of sides
                are a `ValueError`; so is a model whose RoPE recomputes its
                caches (longrope) with rows of different lengths.
            attention_mask: transformers' name for `padding_mask` (not both).
            pad_token_id: None, or an id in `[0, V)` for the positions after a
                row's stop token (None: the first stop id, as without it).
            return_lengths: also return each row's real tokens (prompt and
                generated, the stop token included).
            top_p: None, or with sampling the nucleus mass, in (0, 1].
            streamer: None, or an object with `put(value)` and `end()`.

        Returns:
            int32 `(B, L)`: the prompt, then the generated tokens (in the
            layouts above for a padded prompt); with `return_lengths`,
            `(tokens, lengths)`, `lengths` int32 `(B,)`.

        Example: a left-padded batch, transformers' layout back.

        >>> import numpy as np
        >>> import keras_attn
        >>> lm = keras_attn.CausalLM(32, 16, [keras_attn.TransformerDecoderLayer(
        ...     2, intermediate_dim=32, rope_max_wavelength=1e4)])
        >>> ids = np.array([[0, 0, 5, 6], [7, 8, 9, 10]])  # row 0: 2 pads (id 0)
        >>> tokens, lengths = lm.generate(ids, 8, padding_mask=ids != 0,
        ...                               return_lengths=True)
        >>> np.asarray(tokens)[:, :4].tolist(), np.asarray(lengths).tolist()
        ([[0, 0, 5, 6], [7, 8, 9, 10]], [6, 8])
        """
        return generate_over_kept_loops(self, prompt_ids, max_length, end_token_id=end_token_id,
                                        temperature=temperature, top_k=top_k, seed=seed,
                                        jit_compile=jit_compile, padding_mask=padding_mask,
                                        attention_mask=attention_mask,
                                        pad_token_id=pad_token_id,
                                        return_lengths=return_lengths, top_p=top_p,
                                        streamer=streamer)

    def enable_lora(self, rank: int, target_names=None):
        """Freeze the model and enable LoRA of `rank` on the projections named `target_names`.

        keras-hub's `Backbone.enable_lora`: every weight is frozen, then Keras's own
        `enable_lora(rank)` runs on each `Dense` sublayer named in `target_names`
        (None: keras-hub's default, "query_dense" and "value_dense"; the blocks' are
        "query_dense", "key_dense", "value_dense", "output_dense", "gate_dense",
        "intermediate_dense"). `fit` then trains the low-rank factors only;
        `save_pretrained` writes the merged kernels; a `.keras` file stores them and
        `lora` (the config's), so the reloaded model has its LoRA again.

        Args:
            rank: the LoRA rank, a positive int.
            target_names: None or a list of sublayer names.

        Example:

        >>> import keras_attn
        >>> blocks = [keras_attn.TransformerDecoderLayer(
        ...     num_heads=2, key_dim=8, intermediate_dim=32, gated_feed_forward=True,
        ...     normalization="rms", normalize_first=True, use_bias=False)]
        >>> lm = keras_attn.CausalLM(vocabulary_size=50, hidden_dim=16, blocks=blocks)
        >>> lm.enable_lora(4)
        >>> sorted(w.path.split("/")[-2] for w in lm.trainable_weights)[:2]
        ['query_dense', 'query_dense']
        >>> len(lm.trainable_weights)  # A and B of the query and value projections
        4
        """
        from keras_attn.models._lora import enable_lora

        enable_lora(self, rank, target_names)

    def save(self, filepath, *args, **kwargs):
        """`keras.Model.save`, refusing a quantized model before a file is written
        (`get_config` refuses it too, after Keras has opened the file)."""
        check_not_quantized(self)
        return super().save(filepath, *args, **kwargs)

    def save_pretrained(self, path, max_shard_size="5GB"):
        """Write a Hugging Face checkpoint folder that transformers' `from_pretrained` loads.

        `keras_attn.convert.causal_lm_to_pretrained(self, path, ...)`: `config.json`
        (from `source_config`) and `model.safetensors`, or shards and their index past
        `max_shard_size`.

        Args:
            path: the folder (made if absent).
            max_shard_size: bytes per shard, an int or a string ("5GB", "200MB").
        """
        from keras_attn.convert.pretrained import causal_lm_to_pretrained

        causal_lm_to_pretrained(self, path, max_shard_size=max_shard_size)

    def get_config(self):
        check_not_quantized(self)
        config = super().get_config()
        config.update({
            "vocabulary_size": self.vocabulary_size,
            "hidden_dim": self.hidden_dim,
            "blocks": [keras.saving.serialize_keras_object(b) for b in self.blocks],
            "normalization": self.normalization,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "tie_word_embeddings": self.tie_word_embeddings,
            "embedding_scale": self.embedding_scale,
            "final_logit_soft_cap": self.final_logit_soft_cap,
        })
        if self.logits_scaling is not None:  # absent when unset: the config stays today's
            config["logits_scaling"] = self.logits_scaling
        for name in ("kv_sharing", "hidden_size_per_layer_input", "vocab_size_per_layer_input",
                     "max_position_embeddings", "source_config", "lora"):
            if getattr(self, name) is not None:  # likewise
                config[name] = getattr(self, name)
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["blocks"] = [keras.saving.deserialize_keras_object(b) for b in config["blocks"]]
        return cls(**config)
