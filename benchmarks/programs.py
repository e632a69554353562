"""Before/after without timing: are two checkouts' compiled programs the same?

    python -m benchmarks.programs --baseline ../before     # JAX, the attention sizes

On JAX, `keras_attn.MultiHeadAttention`'s causal forward and its gradient are
lowered with `jax.jit(...).lower(...)` from the `--baseline` checkout and from
this tree, in one process (`_common.import_tree`), and their StableHLO texts
are compared. Identical programs run at the same speed, so a timing ratio off
1.0 between them is machine noise (on this 2-core machine under load, the
attention benchmark's `--baseline` ratios moved 0.94-1.10 for programs that
this found identical). Exit status 1 when any program differs.
"""

import argparse
import hashlib
import os
import sys

from benchmarks import _common as common

SIZES = ((8, 128, 256, 8), (8, 256, 256, 8), (4, 1024, 256, 8), (2, 4096, 256, 8))


def lowered(B, T, D, H, gradient):
    """StableHLO text of the causal MHA forward (or its gradient) at `(B, T, D)`, H heads."""
    import jax
    import keras
    import numpy as np

    import keras_attn

    keras.utils.set_random_seed(0)
    layer = keras_attn.MultiHeadAttention(H, D // H)
    layer.build((B, T, D))
    x = np.random.default_rng(0).standard_normal((B, T, D)).astype("float32")
    variables = layer.weights

    def forward(values, x):
        with keras.StatelessScope(state_mapping=list(zip(variables, values, strict=True))):
            return layer(x, use_causal_mask=True)

    fn = jax.grad(lambda v, x: forward(v, x).sum()) if gradient else forward
    return jax.jit(fn).lower([v.value for v in variables], x).as_text()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, metavar="DIR",
                        help="another checkout (a `git worktree` of an earlier commit)")
    args = parser.parse_args(argv)
    os.environ["KERAS_BACKEND"] = "jax"
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    texts = {}
    for name, root in (("baseline", args.baseline), ("this", here)):
        common.import_tree(root)
        for size in SIZES:
            for gradient in (False, True):
                texts[name, size, gradient] = lowered(*size, gradient)
    print("| size BxTxDxH | program | baseline md5 | this md5 | same |\n|---|---|---|---|---|")
    differ = 0
    for size in SIZES:
        for gradient in (False, True):
            a, b = (hashlib.md5(texts[n, size, gradient].encode()).hexdigest()[:12]
                    for n in ("baseline", "this"))
            differ += a != b
            print(f"| {'x'.join(map(str, size))} | {'gradient' if gradient else 'forward'} | "
                  f"{a} | {b} | {'yes' if a == b else 'NO'} |")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
