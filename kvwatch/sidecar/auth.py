"""Basic auth against the bcrypt hashes of a Prometheus web config, hardened for hostile clients.

* **No user enumeration**: an unknown user's password is checked against a dummy hash of the same
  bcrypt cost, so a wrong user and a wrong password take the same time.
* **Cheap repeated scrapes**: a (user, password) pair that passed is remembered as an HMAC under a
  key drawn at start (never the password itself), so Prometheus pays bcrypt once per credential.
* **Failures are rationed**: each client address has a bucket of ``FAILURE_BURST`` failed checks,
  refilled at ``FAILURE_RATE`` per second; an empty bucket answers 429 without running bcrypt, and
  at most one bcrypt check of an unknown credential runs at a time, whatever the number of clients.
  A remembered credential is never throttled, so a scraper sharing an address with a password
  guesser keeps working.
* **bcrypt's 72-byte rule**: bcrypt reads only the first 72 bytes of a password, so ``htpasswd -B``
  (crypt_blowfish) hashes a longer one by its first 72 bytes; the check does the same (the
  ``bcrypt`` package raises on longer input instead of truncating since 5.0).
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import hmac
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

FAILURE_BURST = 5
FAILURE_RATE = 0.5
MAX_CLIENTS = 4096
CACHE_SIZE = 256
_DEFAULT_COST = 12
# bcrypt's key is at most 72 bytes; the rest of a longer password never reaches the hash.
BCRYPT_MAX_PASSWORD_BYTES = 72


class Verdict(enum.Enum):
    """Outcome of one check."""

    OK = "ok"
    DENIED = "denied"
    THROTTLED = "throttled"


class FailureLimiter:
    """Token buckets of failed logins per client address, bounded in number."""

    def __init__(
        self,
        burst: float = FAILURE_BURST,
        rate: float = FAILURE_RATE,
        max_clients: int = MAX_CLIENTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.burst = burst
        self.rate = rate
        self.max_clients = max_clients
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # client -> (tokens, as of)
        self._lock = threading.Lock()

    def _tokens(self, client: str, now: float) -> float:
        tokens, since = self._buckets.get(client, (self.burst, now))
        return min(self.burst, tokens + (now - since) * self.rate)

    def allowed(self, client: str) -> bool:
        """True while the client may have one more failed check."""
        with self._lock:
            return self._tokens(client, self._clock()) >= 1.0

    def retry_after(self, client: str) -> int:
        """Whole seconds until the client's next check is allowed."""
        with self._lock:
            missing = 1.0 - self._tokens(client, self._clock())
        return max(1, int(missing / self.rate + 0.999)) if self.rate > 0 else 60

    def failed(self, client: str) -> None:
        """Spend one token of the client's bucket."""
        with self._lock:
            now = self._clock()
            tokens = self._tokens(client, now) - 1.0
            self._buckets.pop(client, None)
            self._buckets[client] = (max(0.0, tokens), now)
            if len(self._buckets) > self.max_clients:
                # Drop the buckets that have refilled; if none has, the oldest (insertion order).
                full = [c for c in self._buckets if self._tokens(c, now) >= self.burst]
                for c in full or list(self._buckets)[: len(self._buckets) // 2]:
                    del self._buckets[c]


def _cost(hashed: str) -> int:
    """The cost factor of a bcrypt hash ('$2b$12$...'), or the usual default when unreadable."""
    try:
        return min(max(int(hashed.split("$")[2]), 4), 31)
    except (IndexError, ValueError):
        return _DEFAULT_COST


class BasicAuth:
    """Checks ``Authorization: Basic`` headers of one web config (no users: everything passes)."""

    def __init__(self, users: Mapping[str, str], limiter: FailureLimiter | None = None) -> None:
        self.users = {user: hashed.encode("utf-8") for user, hashed in users.items()}
        self.limiter = limiter if limiter is not None else FailureLimiter()
        self.throttled = 0
        self._key = os.urandom(32)
        self._ok: set[bytes] = set()
        self._lock = threading.Lock()
        # One unknown credential at a time goes through bcrypt: bounds the CPU guessers can burn.
        self._bcrypt_slot = threading.Semaphore(1)
        self._bcrypt: Any = None
        self.dummy_hash = b""
        if self.users:
            import bcrypt

            self._bcrypt = bcrypt
            cost = max(_cost(h.decode("utf-8", "replace")) for h in self.users.values())
            self.dummy_hash = bcrypt.hashpw(os.urandom(16), bcrypt.gensalt(rounds=cost))

    def check(self, header: str | None, client: str) -> Verdict:
        """OK, DENIED (401) or THROTTLED (429: too many failures from this client just now)."""
        if not self.users:
            return Verdict.OK
        if header is None or not header.startswith("Basic "):
            return Verdict.DENIED
        try:
            raw = base64.b64decode(header[6:], validate=True)
            user, _, password = raw.decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return Verdict.DENIED
        token = hmac.new(self._key, raw, hashlib.sha256).digest()
        with self._lock:
            if token in self._ok:
                return Verdict.OK
        if not self.limiter.allowed(client) or not self._bcrypt_slot.acquire(blocking=False):
            with self._lock:
                self.throttled += 1
            return Verdict.THROTTLED
        try:
            hashed = self.users.get(user)
            try:
                secret = password.encode("utf-8")[:BCRYPT_MAX_PASSWORD_BYTES]
                ok = bool(self._bcrypt.checkpw(secret, hashed or self.dummy_hash))
            except ValueError:  # a malformed hash in the web config
                ok = False
        finally:
            self._bcrypt_slot.release()
        if ok and hashed is not None:
            with self._lock:
                if len(self._ok) >= CACHE_SIZE:
                    self._ok.clear()
                self._ok.add(token)
            return Verdict.OK
        self.limiter.failed(client)
        return Verdict.DENIED
