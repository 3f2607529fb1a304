"""`python -m scaletrain` is the `scaletrain` command."""

import sys

from scaletrain.cli import main

if __name__ == "__main__":
    sys.exit(main())
