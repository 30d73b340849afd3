"""``python -m orchestrator.sweep SPEC [options]``: the ``ray job submit`` entry point.

Exactly ``spectune sweep`` (same options, same exit codes), for environments where the
``spectune`` script is not on PATH, such as a Ray job's working-directory copy.
"""

import sys

from orchestrator.cli import main

if __name__ == "__main__":
    sys.argv = [sys.argv[0], "sweep", *sys.argv[1:]]
    main()
