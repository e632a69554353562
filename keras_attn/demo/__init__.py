"""`keras-attn demo`: train an encoder-decoder Transformer on a toy task.

An encoder-decoder built only from keras_attn layers learns to reverse
(or sort, or copy) digit sequences of varying length, with padding masked
through `mask_zero`. It trains with `model.fit`, decodes held-out sources
greedily, reports exact-sequence accuracy, checks that cached decoding
(`keras_attn.generation.generate` with key/value caches) gives the same
sequences, saves a `.keras` file, reloads it and checks that the reloaded
model decodes identically. `--task add` trains a Llama-style decoder-only
model on addition written as text instead (`addition`, `add_command`).

Modules: `data` (the tasks), `model` (the Transformer), `decode` (greedy
decoding, uncached and cached), `cli` (the command), `addition` and
`add_command` (the add task).
"""

from keras_attn.demo.cli import add_arguments, run

__all__ = ["add_arguments", "run"]
