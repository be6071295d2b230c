"""Where a server listens and what it tells others to connect to.

Every quorumlog server has two addresses, as BookKeeper's bookies do: the *bind
address* (the local interface its socket listens on; ``0.0.0.0`` for all of them)
and the *advertised address* (the host name or IP that other machines use to reach
it, which is what it registers in the metadata store and what a bookie's cookie
records). Both default to ``127.0.0.1``, the local cluster's. A wildcard bind
address says nothing about where the server can be reached, so it needs an
advertised address.
"""

from __future__ import annotations

import argparse

LOCAL_HOST = "127.0.0.1"
# Binding to these means "every interface": no other host can connect to them.
WILDCARD_HOSTS = frozenset({"0.0.0.0", "", "*"})


def add_address_options(p: argparse.ArgumentParser, what: str) -> None:
    """``--bind-address`` and ``--advertised-address`` for a server that serves ``what``."""
    p.add_argument(
        "--bind-address",
        metavar="ADDR",
        default=None,
        help=f"local interface {what} listens on; 0.0.0.0 for every interface, which "
        f"needs --advertised-address (default: {LOCAL_HOST})",
    )
    p.add_argument(
        "--advertised-address",
        metavar="HOST",
        default=None,
        help="host name or IP other machines reach this server at, as registered in the "
        "metadata store (default: the bind address)",
    )


def check_host(text: str, flag: str) -> str:
    """A host name or IPv4 address given to ``flag``; ValueError with a one-line reason."""
    host = text.strip()
    if not host or any(c.isspace() for c in host) or ":" in host or "/" in host:
        raise ValueError(f"{flag} {text!r}: expected a host name or IPv4 address, no port")
    return host


def resolve_addresses(bind: str | None, advertised: str | None) -> tuple[str, str]:
    """(bind host, advertised host) from the two flags; ValueError with a one-line reason.

    A wildcard bind without an advertised address is refused: registering
    ``0.0.0.0:PORT`` would send every client to its own machine.
    """
    bind_host = LOCAL_HOST if bind is None else bind.strip()
    if bind_host not in WILDCARD_HOSTS:
        bind_host = check_host(bind_host, "--bind-address")
    elif advertised is None:
        raise ValueError(
            f"--bind-address {bind_host or repr(bind_host)} listens on every interface: "
            "give --advertised-address HOST, the name other machines reach this one at"
        )
    if bind_host in ("", "*"):
        bind_host = "0.0.0.0"
    if advertised is None:
        return bind_host, bind_host
    advertised_host = check_host(advertised, "--advertised-address")
    if advertised_host in WILDCARD_HOSTS:
        raise ValueError(f"--advertised-address {advertised!r}: not an address others can reach")
    return bind_host, advertised_host
