import sys

from keras_attn.cli import main

sys.exit(main())
