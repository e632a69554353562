"""Quiet TensorFlow's start-up notices when running the `keras-attn` command.

Keras imports TensorFlow on every backend when it is installed (for its
random seeds and data utilities), and TensorFlow then prints its oneDNN
and CPU-feature notices on stderr. The command's output should be its own,
so when this process is the `keras-attn` command (or `python -m
keras_attn`), and only then, this sets `TF_CPP_MIN_LOG_LEVEL=2` unless the
user chose it. A user's own program keeps its settings. It deliberately
leaves `TF_ENABLE_ONEDNN_OPTS` alone, although TensorFlow >= 2.20 prints its
one-line oneDNN notice whatever the log level: turning oneDNN off changes
TensorFlow's numerics (its bfloat16 kernels most), and the parity workers
inherit this environment, so the command must run TensorFlow as users do.
Imported first by `keras_attn/__init__.py`, because it must run before
`keras` is imported.
"""

import os
import sys


def invoked_as_cli():
    """Whether this process is the `keras-attn` command."""
    if sys.argv and os.path.basename(sys.argv[0]) == "keras-attn":
        return True
    argv = getattr(sys, "orig_argv", [])
    return any(a == "-m" and b == "keras_attn" for a, b in zip(argv, argv[1:], strict=False))


if invoked_as_cli():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
