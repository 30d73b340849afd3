"""Entry point: ``python -m serving.reference --model-path ref-tiny [SGLang flags]``."""

import sys

from serving.reference.cli import main

if __name__ == "__main__":
    sys.exit(main())
