"""Node mode: follow every engine container's log in the kubelet's tree (``--node-logs /var/log/pods``).

The kubelet writes each container's output to ``ROOT/<namespace>_<pod>_<uid>/<container>/<N>.log``
in CRI format, where N counts the container's restarts; it rotates by renaming ``N.log`` to
``N.log.<timestamp>`` (older generations are gzipped) and asking the runtime to reopen, and it
deletes the pod's directory when the pod is gone (kubelet ``container_log_manager.go``,
``kuberuntime_manager.go``). So one container directory is one source, followed as the glob
``<dir>/*.log``: the tailer keeps a renamed file open and reads it to its end, and reads a new
``N.log`` (a restart, or the file after a rotation) from its start. Nothing is written into the
serving pods and nothing asks the API server: the path names the pod.

A source is named ``<namespace>.<pod>.<container>`` (shortened with a hash past 63 characters) and
its series carry the pod's namespace, pod and container (``names.WORKLOAD_LABELS``). A container's
states (``kvwatch_node_containers{state}``): *probing* (followed, no engine line yet), *followed*
(an engine line seen: vLLM or SGLang, told from the content), *ignored* (no engine line in its first
``probe_lines`` lines: its tailer stops, and it is not looked at again while its directory lives),
*gone* (the pod's directory was deleted: its tailer stops and its instances are forgotten once
``grace`` seconds have passed). At most ``max_containers`` are probing or followed; the others are
counted as dropped, once each.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

from kvwatch.core.jsontypes import JsonValue
from kvwatch.core.labels import NodeContainerState
from kvwatch.export.collector import NodeStats
from kvwatch.sidecar.config import Settings
from kvwatch.sidecar.sources import LogSource
from kvwatch.sources.logfile import LogTailer
from kvwatch.sources.pipeline import LinePipeline
from kvwatch.state.fleet import Fleet

log = logging.getLogger("kvwatch.node")

# <namespace>_<pod>_<uid>: a namespace is a DNS label and a pod name a DNS subdomain, neither with
# '_', so the split is unambiguous; a container name is a DNS label.
_POD_DIR = re.compile(r"([a-z0-9][a-z0-9-]{0,62})_([a-z0-9][a-z0-9.-]{0,252})_([0-9A-Za-z-]{1,64})")
_CONTAINER_DIR = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
_MAX_NAME = 63


@dataclasses.dataclass(frozen=True)
class Container:
    """One container's log directory and the pod it belongs to, read from the path."""

    directory: str
    namespace: str
    pod: str
    uid: str
    container: str

    @property
    def key(self) -> str:
        """``namespace/pod/container``: what --include and --exclude globs match."""
        return f"{self.namespace}/{self.pod}/{self.container}"

    @property
    def source_name(self) -> str:
        """The ``source`` label: ``namespace.pod.container``, or its head and a hash when too long
        (the uid is in the hash, so a pod recreated under its old name is a new source)."""
        full = f"{self.namespace}.{self.pod}.{self.container}"
        if len(full) <= _MAX_NAME:
            return full
        digest = hashlib.sha256(f"{full}/{self.uid}".encode()).hexdigest()[:10]
        return f"{full[: _MAX_NAME - 11]}-{digest}"


def scan(root: str) -> list[Container]:
    """Every container directory under a kubelet log root, sorted; unreadable parts are skipped
    (the next scan looks again)."""
    found: list[Container] = []
    try:
        pods = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError:
        return found
    for pod_entry in pods:
        m = _POD_DIR.fullmatch(pod_entry.name)
        if m is None or not _is_dir(pod_entry):
            continue
        try:
            containers = sorted(os.scandir(pod_entry.path), key=lambda e: e.name)
        except OSError:
            continue
        for entry in containers:
            if _CONTAINER_DIR.fullmatch(entry.name) and _is_dir(entry):
                found.append(Container(entry.path, m.group(1), m.group(2), m.group(3), entry.name))
    return found


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def selected(container: Container, include: Sequence[str], exclude: Sequence[str]) -> bool:
    """Whether --include/--exclude (``NAMESPACE/POD/CONTAINER`` globs) let a container in."""
    key = container.key
    return any(fnmatch.fnmatchcase(key, g) for g in include) and not any(
        fnmatch.fnmatchcase(key, g) for g in exclude
    )


@dataclasses.dataclass
class _Tracked:
    container: Container
    state: NodeContainerState
    source: LogSource | None = None
    gone_at: float | None = None


class NodeWatcher:
    """Finds containers under the root, starts and stops their sources, expires deleted pods.

    ``start_source(container, name)`` builds and starts a LogSource (the sidecar's tailer and
    pipeline); ``stop_source`` stops its tailer; ``forget(name)`` drops its instances. The scan runs
    in the watcher's thread (``run``) or in the caller's (``scan_now``), under one lock.
    """

    def __init__(
        self,
        root: str,
        *,
        start_source: Callable[[Container, str], LogSource],
        stop_source: Callable[[LogSource], None],
        forget: Callable[[str], object],
        include: Sequence[str] = ("*/*/*",),
        exclude: Sequence[str] = (),
        max_containers: int = 128,
        probe_lines: int = 5000,
        grace: float = 30.0,
        interval: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root = os.path.abspath(root)
        self._start_source = start_source
        self._stop_source = stop_source
        self._forget = forget
        self.include, self.exclude = tuple(include), tuple(exclude)
        self.max_containers = max_containers
        self.probe_lines = probe_lines
        self.grace = grace
        self.interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._tracked: dict[str, _Tracked] = {}  # by source name
        self._dropped: set[str] = set()  # directories over the cap, counted once
        self.dropped = 0

    # --- views (any thread; each reads one dict copy) -----------------------------------------------
    def sources(self) -> list[LogSource]:
        """The running sources (probing or followed), for refresh, saving and self-metrics."""
        return [t.source for t in list(self._tracked.values()) if t.source is not None]

    def workload(self, source: str) -> tuple[str, str, str] | None:
        """The namespace, pod and container of a node source, None for any other source."""
        tracked = self._tracked.get(source)
        if tracked is None:
            return None
        c = tracked.container
        return (c.namespace, c.pod, c.container)

    def stats(self) -> NodeStats:
        counts: dict[str, int] = {}
        for tracked in list(self._tracked.values()):
            state = tracked.state
            src = tracked.source
            # A probe is judged at the next scan; an engine line already seen makes it followed now.
            if state == "probing" and src is not None and src.pipeline.lines_matched > 0:
                state = "followed"
            counts[state] = counts.get(state, 0) + 1
        return NodeStats(counts, self.dropped)

    def present(self) -> set[str]:
        """Source names of the containers under the root now, before any is started (restoring a
        state file keeps their instances)."""
        return {c.source_name for c in scan(self.root) if selected(c, self.include, self.exclude)}

    # --- the scan ------------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Scan every ``interval`` seconds until ``stop`` is set (the watcher's thread)."""
        while not stop.is_set():
            try:
                self.scan_now()
            except Exception:  # a scan must never end the watcher: the next one looks again
                log.exception("node scan failed root=%s", self.root)
            stop.wait(self.interval)

    def scan_now(self) -> None:
        """One pass: new containers started, probes judged, deleted pods stopped and expired."""
        with self._lock:
            present = {c.source_name: c for c in scan(self.root) if selected(c, self.include, self.exclude)}
            now = self._clock()
            self._judge_probes()
            self._mark_gone(present, now)
            self._expire(now)
            self._add(present)

    def _judge_probes(self) -> None:
        for tracked in self._tracked.values():
            src = tracked.source
            if tracked.state != "probing" or src is None:
                continue
            if src.pipeline.lines_matched > 0:
                tracked.state = "followed"
                log.info("node container followed source=%s dir=%s", src.name, tracked.container.directory)
            elif src.pipeline.lines_read >= self.probe_lines:
                tracked.state = "ignored"
                self._stop(tracked)
                log.info("node container ignored (no engine line) source=%s", src.name)

    def _mark_gone(self, present: dict[str, Container], now: float) -> None:
        for name, tracked in self._tracked.items():
            if tracked.state == "gone":
                continue
            if present.get(name) != tracked.container and not os.path.isdir(tracked.container.directory):
                tracked.state, tracked.gone_at = "gone", now
                self._stop(tracked)
                log.info("node container gone source=%s", name)

    def _expire(self, now: float) -> None:
        for name in [n for n, t in self._tracked.items() if t.state == "gone"]:
            gone_at = self._tracked[name].gone_at
            if gone_at is not None and now - gone_at >= self.grace:
                del self._tracked[name]
                self._forget(name)
        # A directory over the cap that went away is forgotten too (the set stays as big as the node).
        live = {c.directory for c in scan(self.root)} if self._dropped else set()
        self._dropped &= live

    def _add(self, present: dict[str, Container]) -> None:
        running = sum(1 for t in self._tracked.values() if t.state in ("probing", "followed"))
        for name, container in present.items():
            if name in self._tracked:
                continue
            if running >= self.max_containers:
                if container.directory not in self._dropped:
                    self._dropped.add(container.directory)
                    self.dropped += 1
                    log.warning(
                        "node container not followed: --max-containers %d reached source=%s",
                        self.max_containers,
                        name,
                    )
                continue
            self._dropped.discard(container.directory)
            tracked = _Tracked(container, "probing")
            self._tracked[name] = tracked
            tracked.source = self._start_source(container, name)
            running += 1

    def _stop(self, tracked: _Tracked) -> None:
        if tracked.source is not None:
            self._stop_source(tracked.source)
            tracked.source = None

    def stop_all(self) -> Iterable[LogSource]:
        """Stop every running source (sidecar stop); returns them, already stopped."""
        with self._lock:
            stopped = [t.source for t in self._tracked.values() if t.source is not None]
            for tracked in self._tracked.values():
                self._stop(tracked)
            return stopped


class LogSources:
    """Every log source of a sidecar, live: the configured ones, then node mode's running containers.

    Iterating takes a fresh view each time (the node watcher adds and stops containers in its own
    thread), so a save, a refresh or a scrape sees each running source once."""

    def __init__(self, configured: Sequence[LogSource], node: NodeWatcher | None) -> None:
        self.configured = list(configured)
        self.node = node

    def __iter__(self) -> Iterator[LogSource]:
        yield from self.configured
        if self.node is not None:
            yield from self.node.sources()


def node_watcher(
    settings: Settings,
    fleet: Fleet,
    tailer: Callable[[LogSource, JsonValue | None], LogTailer],
    saved_position: Callable[[str], JsonValue | None],
) -> NodeWatcher:
    """The sidecar's watcher for ``--node-logs``: each container found becomes a LogSource whose
    tailer (the sidecar's own, resumed from the state file's position) follows ``<dir>/*.log``."""
    assert settings.node_logs is not None

    def start_source(container: Container, name: str) -> LogSource:
        pattern = os.path.join(container.directory, "*.log")
        src = LogSource(name, pattern, LinePipeline(name, fleet, settings.engine))
        src.tailer = tailer(src, saved_position(name))
        src.tailer.start()
        return src

    def stop_source(src: LogSource) -> None:
        if src.tailer is not None:
            src.tailer.stop()

    return NodeWatcher(
        str(settings.node_logs),
        start_source=start_source,
        stop_source=stop_source,
        forget=fleet.forget,
        include=settings.include,
        exclude=settings.exclude,
        max_containers=settings.max_containers,
        grace=settings.pod_expiry,
    )
