"""`python -m keras_attn`: the `keras-attn` command.

Python imports the package (and so Keras and its backend) before it runs this;
`python -m keras_attn_cli` (or `keras-attn`) starts without a backend.
"""

import sys

from keras_attn_cli import main

sys.exit(main())
