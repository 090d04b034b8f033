"""``python -m ctxguard``: the ``ctxguard`` command, for environments without its script."""

from ctxguard.cli import main

if __name__ == "__main__":
    main()
