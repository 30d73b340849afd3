"""``python -m orchestrator.sweep SPEC [options]``: exactly ``spectune sweep``, for a Ray job
(``ray job submit``) where the ``spectune`` script is not on PATH.
"""

import sys

from orchestrator.cli import main

if __name__ == "__main__":
    sys.argv = [sys.argv[0], "sweep", *sys.argv[1:]]
    main()
