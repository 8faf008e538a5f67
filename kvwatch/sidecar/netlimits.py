"""What the HTTP server's caps rest on and what they count: the process's fd limit, the address a
client is counted by, the connections per address (kvwatch.sidecar.server caps connections in all
and per client address), and the server's counters."""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import resource
from typing import Generic, TypeVar

C = TypeVar("C")


@dataclasses.dataclass
class ServerStats:
    """Counters of the connections the server turned away (written by the selector thread only)."""

    refused: int = 0
    timed_out: int = 0
    open: int = 0
    # Requests dropped unrun because their client hung up while they waited for a worker.
    abandoned: int = 0


def raise_fd_limit(wanted: int) -> int:
    """Raise the soft RLIMIT_NOFILE towards ``wanted`` (within the hard limit); the soft limit after.

    Idle connections are cheap here, but each is an fd, and many systems start processes at 1024.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    return int(soft) if soft != resource.RLIM_INFINITY else wanted


def client_key(host: str) -> str:
    """The address the per-client cap counts by: an IPv4 address (also mapped into IPv6), or the
    /64 of an IPv6 address (the usual allotment of one host: its addresses are free to pick)."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return f"{ipaddress.IPv6Network((ip, 64), strict=False).network_address}/64"
    return str(ip)


class ClientSlots(Generic[C]):
    """Open connections per client key, and per key the ones waiting for a request (in a TLS
    handshake, idle, or in the middle of a head) in the order they began to wait: the oldest is
    the one to close when the key is at its cap. Selector thread only."""

    def __init__(self) -> None:
        self._count: dict[str, int] = {}
        self._waiting: dict[str, dict[C, None]] = {}  # insertion-ordered: oldest first

    def count(self, key: str) -> int:
        """Open connections of ``key``."""
        return self._count.get(key, 0)

    def add(self, key: str, conn: C) -> None:
        """A new connection, waiting for its first request."""
        self._count[key] = self.count(key) + 1
        self.waiting(key, conn)

    def remove(self, key: str, conn: C) -> None:
        """A connection closed."""
        self.busy(key, conn)
        left = self._count.pop(key, 1) - 1
        if left > 0:
            self._count[key] = left

    def waiting(self, key: str, conn: C) -> None:
        """``conn`` waits for a request from now on (the newest waiting of its key)."""
        waiting = self._waiting.setdefault(key, {})
        waiting.pop(conn, None)
        waiting[conn] = None

    def busy(self, key: str, conn: C) -> None:
        """``conn`` has a request (or a response to write): not to be closed for room."""
        waiting = self._waiting.get(key)
        if waiting is not None and waiting.pop(conn, 1) is None and not waiting:
            del self._waiting[key]

    def oldest_waiting(self, key: str) -> C | None:
        """The connection of ``key`` waiting longest, if any."""
        waiting = self._waiting.get(key)
        return next(iter(waiting)) if waiting else None
