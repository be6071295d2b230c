"""``python -m quorumlog.server``: run one bookie in the foreground, with the bookie's
flags (``--help``), the ready line and the exit statuses of :mod:`quorumlog.server.process`.

What starts bookies on this machine (:mod:`quorumlog.server.local_cluster`, tests) runs
this, not the ``quorumlog`` command: no configuration file, no co-hosted autorecovery
(``quorumlog bookie --autorecovery`` adds that, as it needs the client).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from quorumlog.server.options import (
    add_bookie_options,
    add_log_level_option,
    configs_from_args,
    configure_logging,
    listen_from_args,
)
from quorumlog.server.process import EXIT_REFUSED, run_bookie

_PROG = "python -m quorumlog.server"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=_PROG,
        description="Run one bookie in the foreground until SIGTERM or SIGINT.",
        allow_abbrev=False,
    )
    add_bookie_options(parser)
    add_log_level_option(parser)
    args = parser.parse_args(argv)
    configure_logging(args)
    try:
        config, server_config, uri = configs_from_args(args)
        listen = listen_from_args(args)
    except ValueError as exc:  # InvalidArgumentError is a ValueError too
        print(f"{_PROG}: error: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    return run_bookie(config, server_config, uri, listen, prog=_PROG)


if __name__ == "__main__":
    sys.exit(main())
