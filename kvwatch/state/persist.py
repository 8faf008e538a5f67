"""The sidecar's state file: what a restarted kvwatch must not forget.

An engine prints its settings, memory budget and pool once per start; after the log rotates those
lines are gone. The state file keeps them, the monotonic counters (preemptions, restarts, failures)
and the tailer positions that go with them, so a kvwatch restarted -- even by ``kill -9`` -- resumes
reading where the saved state ends: the pool is known again and no preemption is counted twice.

The file is replaced atomically (temporary file in the same folder, fsync, ``os.replace``), so a
crash leaves either the old or the new file, never half of one; temporary files a crash left behind
are removed at start.

The file is read as untrusted input: anyone who can write the state folder can write it, and a
value kvwatch would not produce itself (a string for a counter, -5 or 1e308 preemptions, bytes that
are not UTF-8, nesting thousands deep) must not break /metrics or startup. It is validated against
``_schema()`` (types and ranges of every field of ``InstanceState``), then built into the typed
fact groups (kvwatch/state/facts.py: each value must fit its field); a file that fails -- or is
of another format version -- is moved aside as ``kvwatch-state.json.corrupt-<time>`` for a person
to look at, one warning is logged and counted, and kvwatch starts fresh: always safe, only less
informed. The instance cap is applied when the records are restored (``Fleet.restore``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import logging
import os
import stat
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from kvwatch.core.errors import ConfigError
from kvwatch.core.events import Origin, PoolKind
from kvwatch.core.jsontypes import JsonObject, JsonValue
from kvwatch.core.kinds import EngineName
from kvwatch.state.facts import (
    Failure,
    MemoryFacts,
    PoolFacts,
    SettingsFacts,
    UsageFacts,
    disagreement_from_json,
    from_json,
)
from kvwatch.state.fleet import Fleet, InstanceState

log = logging.getLogger(__name__)

STATE_FILE = "kvwatch-state.json"
# Held (flock) by the one sidecar that owns a state dir, with its PID inside for the next one's error.
LOCK_FILE = "kvwatch-state.lock"
FORMAT_VERSION = 1
# A file kvwatch writes for 256 instances is well under 1 MiB; larger is not ours.
MAX_STATE_BYTES = 32 * 1024 * 1024
_TMP_GLOB = ".kvwatch-state.*.tmp"

# --- What a valid state file holds ----------------------------------------------------------------
# The pydantic models are built inside _schema(), at each load, and dropped after it: their
# validators cost a few hundred KiB that a running sidecar (RSS budget 40 MiB) does not need again.
# Every number must survive float() in the collector: ints within 64 bits, floats finite.
_Int = Annotated[StrictInt, Field(ge=-(2**63), le=2**63 - 1)]
_Float = Annotated[float, Field(strict=True, allow_inf_nan=False)]
_Text = Annotated[str, Field(max_length=4096)]
_Key = Annotated[str, Field(max_length=256)]
_Scalar = StrictBool | _Int | _Float | _Text | None
# The facts of one event group (settings, memory, a pool, usage): event field -> value.
_Facts = Annotated[dict[_Key, _Scalar], Field(max_length=256)]
_Counter = Annotated[StrictInt, Field(ge=0, le=2**63 - 1)]
_Time = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0)]
_Counts = Annotated[dict[_Key, _Counter], Field(max_length=256)]


def _schema() -> type[BaseModel]:
    """The model of a valid state file, built at each call (see above: not kept between loads)."""

    class _Strict(BaseModel):
        # Keys a newer kvwatch added are ignored, as before validation existed.
        model_config = ConfigDict(extra="ignore", frozen=True)

    class _SavedInstance(_Strict):
        """One ``InstanceState`` as saved; the field set is checked against the dataclass below."""

        source: Annotated[str, Field(min_length=1, max_length=256)]
        engine: EngineName
        instance: Annotated[str, Field(max_length=256)]
        epoch: Annotated[StrictInt, Field(ge=1, le=2**63 - 1)] = 1
        epoch_started: _Time = 0.0
        restarts: _Counter = 0
        settings: _Facts = {}
        memory: _Facts = {}
        pools: Annotated[dict[_Key, _Facts], Field(max_length=64)] = {}
        pools_by_origin: Annotated[dict[_Key, _Facts], Field(max_length=64)] = {}
        usage: _Facts = {}
        usage_by_origin: Annotated[dict[_Key, _Facts], Field(max_length=16)] = {}
        usage_seen: Annotated[dict[_Key, _Time], Field(max_length=16)] = {}
        preemptions_total: _Counter = 0
        preemption_marks: _Counts = {}
        preemption_epoch: _Counts = {}
        retractions: StrictBool = False
        startup_failures: _Counts = {}
        last_failure: _Facts | None = None
        disagreements: _Counts = {}
        last_disagreement: _Facts | None = None
        counter_resets: _Counter = 0
        last_update: Annotated[dict[_Key, _Time], Field(max_length=16)] = {}
        events: _Counter = 0
        # When each fact last arrived, per origin ('log:kv_usage_ratio'), and the values refused.
        fact_seen: Annotated[dict[_Key, _Time], Field(max_length=64)] = {}
        bad_values: _Counts = {}

    class _SavedFile(_Strict):
        version: Literal[1]
        instances: list[_SavedInstance]
        source_settings: dict[_Key, _Facts] = {}
        # Source -> path -> the tailer's own JSON form of a position (FilePosition checks its content).
        positions: dict[_Key, dict[_Text, _Facts]] = {}

    if set(_SavedInstance.model_fields) != _FIELDS:
        raise RuntimeError("persist._SavedInstance no longer matches state.InstanceState")
    return _SavedFile


_FIELDS = {f.name for f in dataclasses.fields(InstanceState)}


_POOL_KINDS: tuple[PoolKind, ...] = get_args(PoolKind)
_ORIGINS: tuple[Origin, ...] = get_args(Origin)


def _plain(value: Any) -> Any:
    return dict(value) if isinstance(value, dict) else value


def _obj(value: JsonValue) -> Mapping[str, JsonValue]:
    if not isinstance(value, dict):
        raise TypeError(f"expected an object, got {type(value).__name__}")
    return value


def _pool_kind(name: str) -> PoolKind:
    for kind in _POOL_KINDS:
        if kind == name:
            return kind
    raise ValueError(f"unknown pool kind {name!r}")


def _origin(name: str) -> Origin:
    for origin in _ORIGINS:
        if origin == name:
            return origin
    raise ValueError(f"unknown origin {name!r}")


def _pools_by_origin_from_json(value: JsonValue) -> dict[tuple[Origin, PoolKind], PoolFacts]:
    out: dict[tuple[Origin, PoolKind], PoolFacts] = {}
    for key, facts in _obj(value).items():
        origin, _, kind = key.partition(":")
        out[(_origin(origin), _pool_kind(kind))] = from_json(PoolFacts, _obj(facts))
    return out


# --- The typed record and its saved form ----------------------------------------------------------
# State-file form per InstanceState field, where it is not the value itself. The form is the one
# kvwatch wrote when facts were dicts: fact groups as objects of their known facts, per-origin
# pools keyed 'origin:kind'; 'origin:fact' keys of fact_seen stay strings.
_encoders: dict[str, Callable[[Any], JsonValue]] = {
    "settings": SettingsFacts.to_json,
    "memory": MemoryFacts.to_json,
    "usage": UsageFacts.to_json,
    "pools": lambda v: {k: p.to_json() for k, p in v.items()},
    "pools_by_origin": lambda v: {f"{o}:{k}": p.to_json() for (o, k), p in v.items()},
    "usage_by_origin": lambda v: {o: u.to_json() for o, u in v.items()},
    "last_failure": lambda v: None if v is None else v.to_json(),
    "last_disagreement": lambda v: None if v is None else v.to_json(),
}
_decoders: dict[str, Callable[[JsonValue], Any]] = {
    "settings": lambda v: from_json(SettingsFacts, _obj(v)),
    "memory": lambda v: from_json(MemoryFacts, _obj(v)),
    "usage": lambda v: from_json(UsageFacts, _obj(v)),
    "pools": lambda v: {_pool_kind(k): from_json(PoolFacts, _obj(p)) for k, p in _obj(v).items()},
    "pools_by_origin": _pools_by_origin_from_json,
    "usage_by_origin": lambda v: {_origin(o): from_json(UsageFacts, _obj(u)) for o, u in _obj(v).items()},
    "usage_seen": lambda v: {_origin(o): t for o, t in _obj(v).items()},
    "preemption_marks": lambda v: {_origin(o): n for o, n in _obj(v).items()},
    "preemption_epoch": lambda v: {_origin(o): n for o, n in _obj(v).items()},
    "last_failure": lambda v: None if v is None else from_json(Failure, _obj(v)),
    "last_disagreement": lambda v: None if v is None else disagreement_from_json(_obj(v)),
}


def _encode_instance(st: InstanceState) -> JsonObject:
    """The state file's form of one record (fact groups as their known facts)."""
    out: JsonObject = {}
    for f in dataclasses.fields(st):
        encode: Callable[[Any], JsonValue] = _encoders.get(f.name, _plain)
        out[f.name] = encode(getattr(st, f.name))
    return out


def _decode_instance(data: Mapping[str, JsonValue]) -> InstanceState:
    """A record from its state-file form (validated by _schema()); unknown names are ignored.
    TypeError, ValueError or KeyError for a record the typed facts cannot hold."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(InstanceState):
        if f.name in data:
            decode: Callable[[JsonValue], Any] = _decoders.get(f.name, _plain)
            values[f.name] = decode(data[f.name])
    return InstanceState(**values)


_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFDIR: "a directory",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


class _Unusable(ValueError):
    """The state file exists but cannot be used."""


def _no_constants(name: str) -> Any:
    raise _Unusable(f"{name} is not a number kvwatch writes")


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
        # State files found unusable and moved aside (exported as kvwatch_state_file_invalid_total).
        self.invalid_files = 0
        self._lock_fd: int | None = None
        try:
            state_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot create state dir {state_dir}: {exc.strerror or exc}") from None
        if not os.access(state_dir, os.W_OK | os.X_OK):
            raise ConfigError(f"state dir {state_dir} is not writable by this user")
        self._remove_stale_temp_files()

    def _remove_stale_temp_files(self) -> None:
        """Temporary files of saves a crash (kill -9, power loss) interrupted: never read, remove."""
        with contextlib.suppress(OSError):
            for tmp in self.path.parent.glob(_TMP_GLOB):
                with contextlib.suppress(OSError):
                    tmp.unlink()
                    log.info("removed temporary state file of an interrupted save path=%s", tmp)

    def own(self) -> None:
        """Take the state dir for this process (until ``release`` or exit): two sidecars saving into
        one dir would overwrite each other's state. ConfigError, naming the holder, when taken."""
        lock_path = self.path.with_name(LOCK_FILE)
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise ConfigError(f"cannot open lock file {lock_path}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise ConfigError(f"cannot lock {lock_path}: {exc.strerror or exc}") from None
            who = f"pid {holder}" if holder.isdigit() else "a process whose pid it does not say"
            raise ConfigError(f"state dir {self.path.parent} is in use by another kvwatch ({who})") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def own_and_load(self) -> SavedState:
        """``own`` the dir, then ``load``; the dir is given up again when the load refuses the file."""
        self.own()
        try:
            return self.load()
        except ConfigError:
            self.release()
            raise

    def release(self) -> None:
        """Give the state dir up (the lock file stays: removing it would race the next owner)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _read(self) -> bytes:
        """The file's bytes. ConfigError when the path is not a regular file: a FIFO would block
        start-up for ever (and deaf to SIGTERM), a device or directory is no state kvwatch wrote."""
        kind = stat.S_IFMT(os.stat(self.path).st_mode)
        if kind != stat.S_IFREG:
            raise ConfigError(
                f"state file {self.path} is {_KINDS.get(kind, 'not a regular file')}, not a regular file"
            )
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # (replaced between the two looks)
                raise ConfigError(f"state file {self.path} is not a regular file")
            with os.fdopen(fd, "rb") as fh:
                fd = -1
                return fh.read(MAX_STATE_BYTES + 1)
        finally:
            if fd >= 0:
                os.close(fd)

    def load(self) -> SavedState:
        """The saved state, or an empty one when there is none or it cannot be used (moved aside)."""
        try:
            raw = self._read()
        except FileNotFoundError:
            return SavedState()
        except OSError as exc:
            log.warning("state file unreadable, starting fresh path=%s err=%s", self.path, exc)
            return SavedState()
        try:
            return self._decode(raw)
        except _Unusable as exc:
            self._set_aside(str(exc))
            return SavedState()

    @staticmethod
    def _decode(raw: bytes) -> SavedState:
        """Parse and validate a state file's bytes; raises _Unusable with a one-line reason."""
        if len(raw) > MAX_STATE_BYTES:
            raise _Unusable(f"larger than {MAX_STATE_BYTES} bytes")
        try:
            data = json.loads(raw.decode("utf-8"), parse_constant=_no_constants)
        except UnicodeDecodeError as exc:
            raise _Unusable(f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
        except RecursionError:
            raise _Unusable("nested too deeply") from None
        except ValueError as exc:  # JSONDecodeError, too-long integers
            raise _Unusable(f"not JSON ({exc})") from None
        if not isinstance(data, dict) or data.get("version") != FORMAT_VERSION:
            version = data.get("version") if isinstance(data, dict) else None
            raise _Unusable(f"format version {version!r}, not {FORMAT_VERSION}")
        try:
            saved: Any = _schema().model_validate(data)
        except (ValidationError, RecursionError) as exc:
            errors = exc.errors() if isinstance(exc, ValidationError) else []
            where = ".".join(str(p) for p in errors[0]["loc"]) if errors else "?"
            what = errors[0]["msg"] if errors else "nested too deeply"
            raise _Unusable(f"invalid at {where}: {what}") from None
        # Types and ranges are checked; what the typed facts add (a count is an int, a pool kind or an
        # origin is one kvwatch knows, a failure has its reason) is checked while they are built.
        try:
            instances = [_decode_instance(inst.model_dump()) for inst in saved.instances]
            source_settings = {k: from_json(SettingsFacts, v) for k, v in saved.source_settings.items()}
        except (TypeError, ValueError, KeyError) as exc:
            raise _Unusable(f"invalid instance record: {exc}") from None
        return SavedState(
            instances=instances,
            source_settings=source_settings,
            positions={
                name: {path: dict(pos) for path, pos in by_path.items()}
                for name, by_path in saved.positions.items()
            },
        )

    def _set_aside(self, reason: str) -> None:
        """Keep an unusable file for a person (renamed), warn once, count it; the caller starts fresh."""
        self.invalid_files += 1
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        for n in range(1, 100):
            if not target.exists():
                break
            target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{n}")
        try:
            os.replace(self.path, target)
        except OSError as exc:
            log.warning(
                "state file not usable (%s), starting fresh; could not move it aside path=%s err=%s",
                reason,
                self.path,
                exc.strerror or exc,
            )
            return
        log.warning("state file not usable (%s), moved to %s, starting fresh", reason, target)

    def save(self, fleet: Fleet, positions: JsonObject) -> bool:
        """Write the fleet's records and the positions they correspond to; False (logged) on I/O error."""
        return self.write(self.encode(fleet, positions))

    @staticmethod
    def encode(fleet: Fleet, positions: JsonObject) -> str:
        """The state file's text. Separate from write() so a caller can take it at a consistent cut
        (sources paused) and do the slow part, the fsync, afterwards."""
        data = {
            "version": FORMAT_VERSION,
            "instances": [_encode_instance(st) for st in fleet.instances()],
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


def restore(fleet: Fleet, saved: SavedState) -> int:
    """Load saved instance records into a fresh fleet; returns how many the instance cap left out."""
    return fleet.restore(saved.instances, saved.source_settings)
