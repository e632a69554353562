"""`python -m keras_attn`: the `keras-attn` command (`keras_attn.cli`), which starts
without a backend (the package's face is lazy)."""

import sys

from keras_attn.cli import main

sys.exit(main())
