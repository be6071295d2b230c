"""``python -m quorumlog``: the same as the ``quorumlog`` command."""

import sys

from quorumlog.commands import main

if __name__ == "__main__":
    sys.exit(main())
