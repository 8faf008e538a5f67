"""Basic auth against the bcrypt hashes of a Prometheus web config."""

from __future__ import annotations

import base64
import binascii
import hashlib
import threading
from collections.abc import Mapping


class BasicAuth:
    """Checks ``Authorization: Basic`` headers; a credential that passed once is remembered."""

    def __init__(self, users: Mapping[str, str]) -> None:
        self.users = dict(users)
        self._ok: set[bytes] = set()
        self._lock = threading.Lock()

    def authorized(self, header: str | None) -> bool:
        """Basic-auth check against the web config's bcrypt hashes (verified once per credential)."""
        if not self.users:
            return True
        if header is None or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        hashed = self.users.get(user)
        if hashed is None:
            return False
        # bcrypt is slow on purpose; remember credentials that passed so scrapes stay cheap.
        token = hashlib.sha256(f"{user}\0{password}\0{hashed}".encode()).digest()
        with self._lock:
            if token in self._ok:
                return True
        import bcrypt

        try:
            ok = bcrypt.checkpw(password.encode("utf-8"), hashed.encode("utf-8"))
        except ValueError:
            return False
        if ok:
            with self._lock:
                self._ok.add(token)
        return ok
