"""The open-files limit of a bookie process.

A bookie holds a descriptor per connection, its journal's, its index's and a bounded
set for its entry logs (``EntryLogger.max_read_fds``). Distributions start processes
with a soft limit of 1024 while the hard limit is often far higher; the bookie raises
its soft limit to the hard one (capped), as a server that expects many clients does.
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger(__name__)

# Enough for tens of thousands of connections; a hard limit of "unlimited" is not
# taken literally (some allocators size tables by it).
OPEN_FILES_CAP = 1 << 20


def raise_open_files_limit(cap: int = OPEN_FILES_CAP) -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (at most ``cap``); returns the
    soft limit in force afterwards. Never lowers it; a refusal is logged, not raised."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = cap if hard == resource.RLIM_INFINITY else min(hard, cap)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning(
                "open-files limit stays %d (raising it to %d failed: %s)", soft, target, exc
            )
            return soft
        return target
    return soft
