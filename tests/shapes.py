"""The suite's shape vocabulary: the sizes numerics tests build their inputs from.

JAX compiles every op once per new shape (about 0.6 s for an eager attention call on 2
cores; the same shape again costs about 1 ms), so a test that picks sizes of its own
pays for a compile that a shared size would have reused. Numerics tests take their
sizes from here; the Hypothesis `ci` profile draws lengths and head widths from the
same lists (tests/strategies.py).

Letters: B batch, T query length, S key length, D model width, H query heads, d head
width, S_MAX cache slots.
"""

B = 2
T = 5
S = 7
D = 8
H = 2
HEAD_DIM = 4
S_MAX = 10

# Lengths around the test block size of 4: one partial block, a full and a partial
# block, several blocks (and the empty and one-token edges).
LENGTHS = (0, 1, 5, 9)
HEAD_DIMS = (3, 4)
LEADS = ((2, 3), (2, 1, 2))
