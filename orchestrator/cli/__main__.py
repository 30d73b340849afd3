"""``python -m orchestrator.cli``: the ``spectune`` script, where it is not on PATH."""

from orchestrator.cli import main

if __name__ == "__main__":
    main()
