"""The sidecar's state file: what a restarted kvwatch must not forget.

An engine prints its settings, memory budget and pool once per start; after the log rotates those
lines are gone. The state file keeps them, the monotonic counters (preemptions, restarts, failures)
and the tailer positions that go with them, so a kvwatch restarted -- even by ``kill -9`` -- resumes
reading where the saved state ends: the pool is known again and no preemption is counted twice.

The file is replaced atomically (temporary file in the same folder, fsync, ``os.replace``), so a
crash leaves either the old or the new file, never half of one. A file kvwatch cannot read (corrupt,
other version) is reported and ignored: starting fresh is always safe, only less informed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from kvwatch.errors import ConfigError
from kvwatch.facts import SettingsFacts, from_json
from kvwatch.jsontypes import JsonObject
from kvwatch.state import Fleet, InstanceState

log = logging.getLogger(__name__)

STATE_FILE = "kvwatch-state.json"
FORMAT_VERSION = 1


@dataclass
class SavedState:
    """What one state file holds."""

    instances: list[InstanceState] = field(default_factory=list)
    source_settings: dict[str, SettingsFacts] = field(default_factory=dict)
    # Tailer positions per source name, in the tailer's own JSON form.
    positions: JsonObject = field(default_factory=dict)


class StateStore:
    """Reads and atomically writes ``<state_dir>/kvwatch-state.json``."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / STATE_FILE
        self.writes = 0
        self.write_errors = 0
        try:
            state_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot create state dir {state_dir}: {exc.strerror or exc}") from None
        if not os.access(state_dir, os.W_OK | os.X_OK):
            raise ConfigError(f"state dir {state_dir} is not writable by this user")

    def load(self) -> SavedState:
        """The saved state, or an empty one when there is none or it cannot be used."""
        try:
            raw = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return SavedState()
        except OSError as exc:
            log.warning("state file unreadable, starting fresh path=%s err=%s", self.path, exc)
            return SavedState()
        try:
            data = json.loads(raw)
            if data.get("version") != FORMAT_VERSION:
                raise ValueError(f"format version {data.get('version')!r}")
            instances = [InstanceState.from_json(d) for d in data["instances"]]
            return SavedState(
                instances=instances,
                source_settings={
                    k: from_json(SettingsFacts, v) for k, v in data.get("source_settings", {}).items()
                },
                positions=dict(data.get("positions", {})),
            )
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            log.warning("state file not usable, starting fresh path=%s err=%s", self.path, exc)
            return SavedState()

    def save(self, fleet: Fleet, positions: JsonObject) -> bool:
        """Write the fleet's records and the positions they correspond to; False (logged) on I/O error."""
        return self.write(self.encode(fleet, positions))

    @staticmethod
    def encode(fleet: Fleet, positions: JsonObject) -> str:
        """The state file's text. Separate from write() so a caller can take it at a consistent cut
        (sources paused) and do the slow part, the fsync, afterwards."""
        data = {
            "version": FORMAT_VERSION,
            "instances": [st.to_json() for st in fleet.instances()],
            "source_settings": {k: v.to_json() for k, v in fleet.source_settings().items()},
            "positions": positions,
        }
        return json.dumps(data, separators=(",", ":"), sort_keys=True)

    def write(self, text: str) -> bool:
        """Replace the state file atomically with ``text``; False (logged) on I/O error."""
        tmp_name = None
        try:
            fd, tmp_name = tempfile.mkstemp(prefix=".kvwatch-state.", suffix=".tmp", dir=self.path.parent)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp_name, self.path)
            tmp_name = None
        except OSError as exc:
            self.write_errors += 1
            log.warning("cannot write state file path=%s err=%s", self.path, exc)
            return False
        finally:
            if tmp_name is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp_name)
        self.writes += 1
        return True


def restore(fleet: Fleet, saved: SavedState) -> None:
    """Load saved instance records into a fresh fleet."""
    fleet.restore(saved.instances, saved.source_settings)
