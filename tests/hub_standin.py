"""A stand-in Hugging Face Hub on 127.0.0.1, for the resolver's tests (tests/test_resolve.py).

It answers the two requests huggingface_hub's ``hf_hub_download`` makes for a file (read from the
installed client, file_download.py): ``HEAD /{repo}/resolve/{revision}/{file}``, whose
``X-Repo-Commit`` and ``ETag`` headers name the commit and the blob, then ``GET`` of the same URL
for the bytes. Refusals carry the ``X-Error-Code`` the client maps to its error classes
(RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo). Every request is recorded, so a test
can check that no weights were ever asked for. The server runs in a thread until ``close()``.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote


@dataclass
class Repo:
    """One model repository: revision (branch or tag) -> commit, commit -> {filename: bytes}."""

    refs: dict[str, str]
    commits: dict[str, dict[str, bytes]]
    gated: bool = False


@dataclass
class StandInHub:
    repos: dict[str, Repo]
    token: str = "hf_standin_token"
    requests: list[tuple[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def do_HEAD(self) -> None:  # noqa: N802 - http.server's spelling
                self._answer(body=False)

            def do_GET(self) -> None:  # noqa: N802
                self._answer(body=True)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

            def _refuse(self, status: int, code: str, commit: str | None = None) -> None:
                self.send_response(status)
                self.send_header("X-Error-Code", code)
                self.send_header("X-Error-Message", f"{code} (stand-in Hub)")
                if commit:
                    self.send_header("X-Repo-Commit", commit)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def _answer(self, body: bool) -> None:
                hub.requests.append((self.command, self.path))
                parts = unquote(self.path.split("?", 1)[0]).lstrip("/").split("/")
                if len(parts) < 5 or parts[2] != "resolve":
                    self._refuse(404, "RepoNotFound")
                    return
                repo_id, revision, filename = f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:])
                repo = hub.repos.get(repo_id)
                if repo is None:
                    self._refuse(401, "RepoNotFound")
                    return
                if repo.gated and self.headers.get("authorization") != f"Bearer {hub.token}":
                    self._refuse(403 if self.headers.get("authorization") else 401, "GatedRepo")
                    return
                commit = repo.refs.get(revision, revision if revision in repo.commits else None)
                if commit is None:
                    self._refuse(404, "RevisionNotFound")
                    return
                content = repo.commits[commit].get(filename)
                if content is None:
                    self._refuse(404, "EntryNotFound", commit)
                    return
                self.send_response(200)
                self.send_header("X-Repo-Commit", commit)
                self.send_header("ETag", f'"{hashlib.sha1(content).hexdigest()}"')
                self.send_header("Content-Length", str(len(content)))
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                if body:
                    self.wfile.write(content)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05})
        self._thread.daemon = True
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
