"""``python -m quorumlog``: the same as the ``quorumlog`` command."""

import sys

from quorumlog.cli import main

if __name__ == "__main__":
    sys.exit(main())
