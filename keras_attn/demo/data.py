"""The demo's synthetic sequence-to-sequence tasks, generated in memory.

A source is a sequence of decimal digits of varying length, padded with 0
(the padding id, so `Embedding(mask_zero=True)` masks it). The target is
the source reversed (`reverse`), sorted (`sort`) or unchanged (`copy`).

Token ids: 0 padding, 1 start, 2 end, and digit `d` is `d + 3`.

Arrays for teacher forcing, with L the longest source and N examples:
    sources: int32 `(N, L)`, digits then padding.
    decoder_inputs: int32 `(N, L + 1)`, start, target digits, padding.
    targets: int32 `(N, L + 1)`, target digits, end, padding.
"""

import numpy as np

__all__ = [
    "END",
    "PAD",
    "START",
    "TASKS",
    "VOCAB_SIZE",
    "decode_tokens",
    "make_split",
]

PAD, START, END = 0, 1, 2
DIGIT_OFFSET = 3
VOCAB_SIZE = DIGIT_OFFSET + 10

TASKS = {
    "reverse": lambda digits: digits[::-1],
    "sort": lambda digits: np.sort(digits),
    "copy": lambda digits: digits,
}


def _sample(rng, count, min_length, max_length, exclude):
    """`count` distinct digit sequences not in `exclude`, as tuples."""
    seen = set()
    out = []
    # The space of short sequences is small: give up after enough tries
    # rather than loop forever when the caller asks for too many.
    for _ in range(50 * count):
        length = int(rng.integers(min_length, max_length + 1))
        seq = tuple(int(d) for d in rng.integers(0, 10, size=length))
        if seq in seen or seq in exclude:
            continue
        seen.add(seq)
        out.append(seq)
        if len(out) == count:
            return out
    raise ValueError(
        f"Could not draw {count} distinct sequences of length {min_length}.."
        f"{max_length}. Received: count={count}"
    )


def _encode(sequences, task, max_length):
    n = len(sequences)
    sources = np.zeros((n, max_length), "int32")
    decoder_inputs = np.zeros((n, max_length + 1), "int32")
    targets = np.zeros((n, max_length + 1), "int32")
    decoder_inputs[:, 0] = START
    for i, seq in enumerate(sequences):
        digits = np.asarray(seq, "int32")
        target = TASKS[task](digits) + DIGIT_OFFSET
        k = len(digits)
        sources[i, :k] = digits + DIGIT_OFFSET
        decoder_inputs[i, 1:k + 1] = target
        targets[i, :k] = target
        targets[i, k] = END
    return sources, decoder_inputs, targets


def make_split(task, num_train, num_test, min_length, max_length, seed):
    """Training and held-out data; no held-out source appears in training.

    Args:
        task: one of `TASKS`.
        num_train: number of training examples.
        num_test: number of held-out examples.
        min_length: shortest source (digits).
        max_length: longest source (digits), L.
        seed: NumPy seed.

    Returns:
        `(train, test)`, each a tuple `(sources, decoder_inputs, targets)`
        of int32 arrays shaped as in the module docstring.
    """
    if task not in TASKS:
        raise ValueError(f"Unknown task; expected one of {sorted(TASKS)}. Received: task={task!r}")
    rng = np.random.default_rng(seed)
    test = _sample(rng, num_test, min_length, max_length, exclude=set())
    train = _sample(rng, num_train, min_length, max_length, exclude=set(test))
    return _encode(train, task, max_length), _encode(test, task, max_length)


def decode_tokens(row):
    """Token ids -> digit string, stopping at the end token (or padding)."""
    digits = []
    for token in np.asarray(row).tolist():
        if token in (END, PAD):
            break
        digits.append(str(token - DIGIT_OFFSET) if token >= DIGIT_OFFSET else "?")
    return "".join(digits)
