"""`keras-attn parity`: the same cases on every backend, compared pairwise and
against the float64 NumPy reference, forward and backward.

One concept per module:

- `cases`: the fixed, named cases; their inputs and weights (NumPy, fixed seed)
  and their float64 reference (`keras_attn.testing.reference`).
- `worker`: runs the cases in one backend (`python -m keras_attn.parity.worker`,
  started in a subprocess with `KERAS_BACKEND` set). The only parity module that
  imports keras; backend-specific work goes through `keras_attn._device`.
- `compare`: pure NumPy comparison logic and the tolerance bookkeeping.
- `report`: the stdout table and the JSON report (save, load).
- `cli`: the subcommand: arguments, subprocesses, exit status.

The whole GPU check offline (the suite, parity on GPU and CPU, their comparison and
the benchmark) is a script of the checkout, not of this package: `tools/gpu_check.py`.
"""
