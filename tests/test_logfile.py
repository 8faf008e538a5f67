"""LogTailer against real files in tmp_path: appends, every rotation kind, globs, waiting, errors, resume.

Waits are bounded polls on what the callback received, never sleeps that assume a speed. Tests that
must prove an event (not the 1 s safety re-check) did the work set ``recheck_interval`` far above
the wait.
"""

from __future__ import annotations

import errno
import gzip
import os
import shutil
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from watchdog.events import FileSystemEvent

from kvwatch.sources.logfile import FilePosition, LogTailer
from kvwatch.sources.stdin import read_lines

WAIT = 10.0  # upper bound for anything to arrive; a healthy run needs milliseconds
NO_RECHECK = 3600.0  # the safety re-check never fires within a test


class Sink:
    """Thread-safe record of what a tailer delivered."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []
        self.rotated: list[str] = []
        self.errors: list[tuple[str, BaseException]] = []
        self._cond = threading.Condition()

    def on_line(self, path: str, line: str) -> None:
        with self._cond:
            self.lines.append((path, line))
            self._cond.notify_all()

    def on_rotate(self, path: str) -> None:
        with self._cond:
            self.rotated.append(path)
            self._cond.notify_all()

    def on_error(self, path: str, exc: BaseException) -> None:
        with self._cond:
            self.errors.append((path, exc))
            self._cond.notify_all()

    def texts(self) -> list[str]:
        with self._cond:
            return [line for _, line in self.lines]

    def wait(self, predicate: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + WAIT
        with self._cond:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    pytest.fail(f"timed out waiting for {what}; got lines {self.texts()[-10:]}")
                self._cond.wait(min(left, 0.05))

    def wait_lines(self, expected: list[str]) -> None:
        self.wait(lambda: len(self.lines) >= len(expected), f"{len(expected)} lines")
        assert self.texts() == expected


@pytest.fixture
def sink() -> Sink:
    return Sink()


@pytest.fixture
def tailers() -> Iterator[list[LogTailer]]:
    started: list[LogTailer] = []
    yield started
    for tailer in started:
        tailer.stop()


def start(tailers: list[LogTailer], sink: Sink, pattern: Path | str, **kwargs: object) -> LogTailer:
    tailer = LogTailer(
        str(pattern),
        sink.on_line,
        on_rotate=sink.on_rotate,
        on_error=sink.on_error,
        **kwargs,  # type: ignore[arg-type]
    )
    tailers.append(tailer)
    tailer.start()
    return tailer


def start_held(tailers: list[LogTailer], sink: Sink, log: Path) -> tuple[LogTailer, threading.Event]:
    """A tailer held inside on_line at the line starting "1 " until the returned event is set:
    what happens to the files meanwhile, it sees only when it looks again."""
    held = threading.Event()
    release = threading.Event()

    def on_line(path: str, line: str) -> None:
        sink.on_line(path, line)
        if line.startswith("1 "):
            held.set()
            assert release.wait(WAIT)

    tailer = LogTailer(str(log), on_line, on_rotate=sink.on_rotate, recheck_interval=NO_RECHECK)
    tailers.append(tailer)
    tailer.start()
    assert held.wait(WAIT)
    return tailer, release


def append(path: Path, data: str | bytes) -> None:
    with open(path, "ab") as fh:
        fh.write(data.encode() if isinstance(data, str) else data)


def wait_until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.mark.parametrize(
    ("polling", "append_interval"),
    [(False, 0.02), (False, 0.0), (True, 0.02)],
    ids=["inotify+append-polling", "inotify-modify-events", "polling"],
)
def test_reads_existing_content_then_follows_appends_with_partial_lines(
    tmp_path: Path, sink: Sink, tailers: list[LogTailer], polling: bool, append_interval: float
) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("startup\nKV cache: 100 blocks\nhalf")
    tailer = start(
        tailers, sink, log, polling=polling, recheck_interval=NO_RECHECK, append_interval=append_interval
    )
    sink.wait_lines(["startup", "KV cache: 100 blocks"])
    append(log, " a line\nnext\n")
    sink.wait_lines(["startup", "KV cache: 100 blocks", "half a line", "next"])
    assert sink.lines[0][0] == str(log)
    assert tailer.up
    assert tailer.observer_kind == ("polling" if polling else "native")
    assert (tailer.rotations, tailer.read_errors, sink.errors) == (0, 0, [])


def test_rename_and_create_finishes_the_old_file_including_late_writes(
    tmp_path: Path, sink: Sink, tailers: list[LogTailer]
) -> None:
    """logrotate 'create': rename, create, then signal; the app writes to the old file until it reopens."""
    log = tmp_path / "engine.log"
    app = open(log, "ab", buffering=0)  # noqa: SIM115 - the 'application' holds its log open
    try:
        app.write(b"1\n")
        tailer = start(tailers, sink, log, recheck_interval=0.1, retire_after=2.0)
        sink.wait_lines(["1"])
        os.rename(log, tmp_path / "engine.log.1")
        app.write(b"2\n")  # path missing: the tailer keeps reading the renamed file
        sink.wait_lines(["1", "2"])
        log.write_bytes(b"")  # logrotate creates the new file...
        sink.wait(lambda: tailer.rotations == 1, "the rotation")
        app.write(b"3 unterminated")  # ...but the app has not reopened yet
        sink.wait_lines(["1", "2", "3 unterminated"])  # the retired file's last line is flushed
    finally:
        app.close()
    append(log, "4\n")
    sink.wait(lambda: len(sink.lines) == 4, "the first line of the new file")
    assert sink.texts() == ["1", "2", "3 unterminated", "4"]
    assert sink.rotated == [str(log)]


def test_copytruncate_recovers_unread_lines_from_the_copy(
    tmp_path: Path, sink: Sink, tailers: list[LogTailer]
) -> None:
    """The tailer is held inside on_line while lines are appended, copied and truncated, so when
    it looks again the unread lines exist only in the copy."""
    log = tmp_path / "engine.log"
    log.write_text("1 first line of this generation\n")
    tailer, release = start_held(tailers, sink, log)
    append(log, "2 unread\n3 unread\n")
    shutil.copyfile(log, tmp_path / "engine.log.1")
    os.truncate(log, 0)
    append(log, "4 after truncate, a line longer than everything before it was read\n")
    release.set()
    sink.wait_lines(
        [
            "1 first line of this generation",
            "2 unread",
            "3 unread",
            "4 after truncate, a line longer than everything before it was read",
        ]
    )
    assert tailer.rotations == 1


def _kubelet_rotate(log: Path, stamp: str) -> None:
    """The kubelet's rotation (container_log_manager.go rotateLog): gzip the rotated generations,
    rename the live file aside with a timestamp, and the runtime opens a new one."""
    for old in sorted(log.parent.glob(log.name + ".*")):
        if old.suffix != ".gz":
            with old.open("rb") as src, gzip.open(f"{old}.gz", "wb") as dst:
                shutil.copyfileobj(src, dst)
            old.unlink()
    os.rename(log, log.parent / f"{log.name}.{stamp}")
    log.touch()


def test_a_stall_across_two_rotations_reads_the_generation_it_never_opened(
    tmp_path: Path, sink: Sink, tailers: list[LogTailer]
) -> None:
    """The tailer is held inside on_line while the kubelet rotates twice: the middle generation was
    never the path's file while the tailer looked, and is read from its start before the new file."""
    log = tmp_path / "0.log"
    log.write_text("1 first generation\n")
    tailer, release = start_held(tailers, sink, log)
    append(log, "2 first generation, unread\n")
    _kubelet_rotate(log, "20261201-100001")
    append(log, "3 second generation, never opened\n")
    _kubelet_rotate(log, "20261201-100002")  # the first generation is gzipped and unlinked
    append(log, "4 third generation\n")
    release.set()
    sink.wait_lines(
        [
            "1 first generation",
            "2 first generation, unread",
            "3 second generation, never opened",
            "4 third generation",
        ]
    )
    assert tailer.rotations == 2


def test_generations_read_before_or_older_than_the_file_held_are_not_read_again(
    tmp_path: Path, sink: Sink, tailers: list[LogTailer]
) -> None:
    """logrotate's numbered scheme without compression: at each rotation every older generation
    is renamed beside the path, and none of them is new to the tailer."""
    log = tmp_path / "engine.log"
    older = tmp_path / "engine.log.1"
    older.write_text("0 written before kvwatch started\n")
    hour_ago = time.time() - 3600
    os.utime(older, (hour_ago, hour_ago))
    log.write_text("1\n")
    tailer = start(tailers, sink, log, recheck_interval=NO_RECHECK)
    sink.wait_lines(["1"])
    for n in (1, 2):
        for k in range(n, 0, -1):  # engine.log.k -> engine.log.(k+1), oldest first
            os.rename(tmp_path / f"engine.log.{k}", tmp_path / f"engine.log.{k + 1}")
        os.rename(log, older)
        log.write_text(f"{n + 1}\n")
        sink.wait(lambda n=n: tailer.rotations == n and len(sink.lines) == n + 1, f"rotation {n}")  # type: ignore[misc]
    time.sleep(0.2)  # anything read twice would arrive by now
    assert sink.texts() == ["1", "2", "3"]
    assert tailer.rotations == 2


def test_a_link_or_pipe_beside_the_log_is_never_taken_for_a_skipped_generation(
    tmp_path: Path, sink: Sink, tailers: list[LogTailer]
) -> None:
    """Only plain files are generations: a symlink named like one (to a file kvwatch must not
    read) and a FIFO (which would block a reader) are passed over."""
    secret = tmp_path / "secret"
    secret.write_text("not a log line\n")
    log = tmp_path / "engine.log"
    log.write_text("1\n")
    tailer = start(tailers, sink, log, recheck_interval=NO_RECHECK)
    sink.wait_lines(["1"])
    secret.write_text("not a log line, written after the log\n")  # newer than the held file
    os.symlink(secret, tmp_path / "engine.log.link")
    os.mkfifo(tmp_path / "engine.log.fifo")
    os.rename(log, tmp_path / "engine.log.1")
    log.write_text("2\n")
    sink.wait(lambda: tailer.rotations == 1 and len(sink.lines) == 2, "the rotation")
    time.sleep(0.2)
    assert sink.texts() == ["1", "2"]
    assert tailer.rotations == 1


def test_copytruncate_without_a_copy_reads_the_new_content_from_the_start(
    tmp_path: Path, sink: Sink, tailers: list[LogTailer]
) -> None:
    log = tmp_path / "engine.log"
    log.write_text("old 1\nold 2\nunfinished")
    tailer = start(tailers, sink, log, recheck_interval=NO_RECHECK)
    sink.wait_lines(["old 1", "old 2"])
    os.truncate(log, 0)
    append(log, "new 1\n")
    sink.wait(lambda: len(sink.lines) >= 3, "the new line")
    # The unfinished line's continuation went with the truncated data: it is not glued to 'new 1'.
    assert sink.texts() == ["old 1", "old 2", "new 1"]
    assert tailer.rotations == 1


def test_truncation_is_seen_when_the_refilled_file_repeats_the_bytes_before_the_offset(
    tmp_path: Path, sink: Sink, tailers: list[LogTailer]
) -> None:
    """A separator line made of one repeated character makes the 64 bytes before the offset
    identical in the old and the refilled file; the file's first bytes still tell them apart."""
    log = tmp_path / "engine.log"
    rule = "=" * 100
    log.write_text(f"run A\n{rule}\n")
    held = threading.Event()
    release = threading.Event()

    def on_line(path: str, line: str) -> None:
        sink.on_line(path, line)
        if line == rule and not held.is_set():
            held.set()
            assert release.wait(WAIT)

    tailer = LogTailer(str(log), on_line, recheck_interval=NO_RECHECK)
    tailers.append(tailer)
    tailer.start()
    assert held.wait(WAIT)
    with open(log, "r+b") as fh:  # truncate and refill in place, same inode, same length prefix
        fh.truncate(0)
        fh.write(f"run B\n{rule}\nrun B more\n".encode())
    release.set()
    sink.wait(lambda: len(sink.lines) >= 5, "the refilled file")
    assert sink.texts() == ["run A", rule, "run B", rule, "run B more"]
    assert tailer.rotations == 1


def test_delete_and_recreate(tmp_path: Path, sink: Sink, tailers: list[LogTailer]) -> None:
    log = tmp_path / "engine.log"
    old = open(log, "ab", buffering=0)  # noqa: SIM115
    try:
        old.write(b"a\n")
        tailer = start(tailers, sink, log, recheck_interval=NO_RECHECK)
        sink.wait_lines(["a"])
        os.unlink(log)
        old.write(b"b\n")  # still readable through the tailer's open descriptor
        sink.wait_lines(["a", "b"])
    finally:
        old.close()
    assert tailer.read_errors == 0  # missing while the old file is still open is not an error
    log.write_text("c\n")
    sink.wait_lines(["a", "b", "c"])
    assert tailer.rotations == 1
    assert tailer.up


def _swap_link(link: Path, target: str) -> None:
    """Atomic symlink replacement, the way kubelet points a container log at a new file."""
    tmp = link.with_name(link.name + ".tmp")
    os.symlink(target, tmp)
    os.replace(tmp, link)


def test_kubernetes_symlink_swap_follows_the_new_target(
    tmp_path: Path, sink: Sink, tailers: list[LogTailer]
) -> None:
    pods = tmp_path / "pods" / "default_vllm-0_uid" / "vllm"
    pods.mkdir(parents=True)
    containers = tmp_path / "containers"
    containers.mkdir()
    link = containers / "vllm-0_default_vllm-abc.log"
    (pods / "0.log").write_text("container 0 line 1\n")
    os.symlink(pods / "0.log", link)
    tailer = start(tailers, sink, link, recheck_interval=NO_RECHECK)
    sink.wait_lines(["container 0 line 1"])
    # Appends to the target (another directory) arrive through the target directory's watch.
    append(pods / "0.log", "container 0 line 2\n")
    sink.wait_lines(["container 0 line 1", "container 0 line 2"])
    # Container restart: a new file, then the link swapped to it.
    (pods / "1.log").write_text("container 1 line 1\n")
    _swap_link(link, str(pods / "1.log"))
    sink.wait(lambda: len(sink.lines) >= 3, "the new container's first line")
    append(pods / "1.log", "container 1 line 2\n")
    sink.wait(lambda: len(sink.lines) >= 4, "an append to the new target")
    # kubelet rotating the current target by rename, the runtime reopening a fresh file.
    os.rename(pods / "1.log", pods / "1.log.20260101-000000")
    (pods / "1.log").write_text("container 1 after rotation\n")
    sink.wait(lambda: len(sink.lines) >= 5, "the line after kubelet's rotation")
    assert sink.texts() == [
        "container 0 line 1",
        "container 0 line 2",
        "container 1 line 1",
        "container 1 line 2",
        "container 1 after rotation",
    ]
    assert {path for path, _ in sink.lines} == {str(link)}
    assert tailer.rotations == 2


def test_glob_follows_each_rank_and_picks_up_new_matches(
    tmp_path: Path, sink: Sink, tailers: list[LogTailer]
) -> None:
    for rank in (0, 1):
        (tmp_path / f"rank{rank}.log").write_text(f"rank {rank} startup\n")
    (tmp_path / "other.txt").write_text("not matched\n")
    tailer = start(tailers, sink, tmp_path / "rank*.log", recheck_interval=NO_RECHECK)
    sink.wait(lambda: len(sink.lines) >= 2, "both ranks")
    (tmp_path / "rank2.log").write_text("rank 2 startup\n")
    sink.wait(lambda: len(sink.lines) >= 3, "the new rank")
    append(tmp_path / "rank0.log", "rank 0 more\n")
    sink.wait(lambda: len(sink.lines) >= 4, "an append to rank 0")
    by_path = sorted(sink.lines)
    assert by_path == [
        (str(tmp_path / "rank0.log"), "rank 0 more"),
        (str(tmp_path / "rank0.log"), "rank 0 startup"),
        (str(tmp_path / "rank1.log"), "rank 1 startup"),
        (str(tmp_path / "rank2.log"), "rank 2 startup"),
    ]
    assert tailer.paths() == [str(tmp_path / f"rank{r}.log") for r in range(3)]
    assert set(tailer.positions()) == set(tailer.paths())


def test_a_glob_match_that_goes_away_is_finished_and_forgotten(
    tmp_path: Path, sink: Sink, tailers: list[LogTailer]
) -> None:
    for rank in (0, 1):
        (tmp_path / f"rank{rank}.log").write_text(f"rank {rank}\n")
    tailer = start(tailers, sink, tmp_path / "rank*.log", recheck_interval=0.05, retire_after=0.1)
    sink.wait(lambda: len(sink.lines) == 2, "both ranks")
    with open(tmp_path / "rank1.log", "ab", buffering=0) as old:
        os.unlink(tmp_path / "rank1.log")
        old.write(b"last words")
    sink.wait(lambda: len(sink.lines) == 3, "the deleted file's unterminated last line")
    assert sink.lines[-1] == (str(tmp_path / "rank1.log"), "last words")
    wait_until(lambda: tailer.paths() == [str(tmp_path / "rank0.log")], "rank 1 to be forgotten")
    assert list(tailer.positions()) == [str(tmp_path / "rank0.log")]
    # The same name appearing again is a new file, read from its start.
    (tmp_path / "rank1.log").write_text("rank 1 restarted\n")
    sink.wait(lambda: len(sink.lines) == 4, "the new rank 1 file")
    assert tailer.read_errors == 0


def test_waits_for_a_file_that_appears_later(tmp_path: Path, sink: Sink, tailers: list[LogTailer]) -> None:
    log = tmp_path / "engine.log"
    tailer = start(tailers, sink, log, recheck_interval=NO_RECHECK)
    sink.wait(lambda: len(sink.errors) == 1, "the missing file to be reported")
    assert tailer.read_errors == 1 and not tailer.up
    assert isinstance(sink.errors[0][1], FileNotFoundError)
    log.write_text("pool printed at startup\n")
    sink.wait_lines(["pool printed at startup"])
    assert tailer.up
    assert (tailer.read_errors, tailer.rotations) == (1, 0)


def test_waits_for_a_directory_that_appears_later(
    tmp_path: Path, sink: Sink, tailers: list[LogTailer]
) -> None:
    log = tmp_path / "not-yet" / "engine.log"
    tailer = start(tailers, sink, log, recheck_interval=0.05)
    sink.wait(lambda: tailer.read_errors == 1, "the missing file to be counted")
    log.parent.mkdir()
    log.write_text("hello\n")
    sink.wait_lines(["hello"])
    append(log, "again\n")
    sink.wait_lines(["hello", "again"])
    # Missing for many re-checks is one error episode, not one per re-check.
    assert tailer.read_errors == 1


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file_is_counted_and_retried(tmp_path: Path, sink: Sink, tailers: list[LogTailer]) -> None:
    log = tmp_path / "engine.log"
    log.write_text("secret\n")
    log.chmod(0)
    tailer = start(tailers, sink, log, recheck_interval=0.05)
    sink.wait(lambda: tailer.read_errors == 1, "the permission error")
    assert isinstance(sink.errors[0][1], PermissionError)
    assert not tailer.up
    log.chmod(stat.S_IRUSR | stat.S_IWUSR)
    sink.wait_lines(["secret"])
    assert tailer.up and tailer.read_errors == 1


def test_permission_denied_is_counted_and_retried_even_as_root(
    tmp_path: Path, sink: Sink, tailers: list[LogTailer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same as above where root ignores file modes: open() itself is made to refuse."""
    log = tmp_path / "engine.log"
    log.write_text("secret\n")
    denied = threading.Event()
    denied.set()
    real_open = os.open

    def guarded_open(path: str | os.PathLike[str], flags: int, *args: int, **kwargs: object) -> int:
        if denied.is_set() and os.fspath(path) == str(log):
            raise PermissionError(errno.EACCES, "Permission denied", str(log))
        return real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", guarded_open)
    tailer = start(tailers, sink, log, recheck_interval=0.05)
    sink.wait(lambda: tailer.read_errors == 1, "the permission error")
    assert isinstance(sink.errors[0][1], PermissionError)
    assert not tailer.up
    denied.clear()
    sink.wait_lines(["secret"])
    assert tailer.up and tailer.read_errors == 1


def test_unreadable_new_file_after_rotation_is_one_error_episode(
    tmp_path: Path, sink: Sink, tailers: list[LogTailer], monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "engine.log"
    log.write_text("old\n")
    denied = threading.Event()
    real_open = os.open

    def guarded_open(path: str | os.PathLike[str], flags: int, *args: int, **kwargs: object) -> int:
        if denied.is_set() and os.fspath(path) == str(log):
            raise PermissionError(errno.EACCES, "Permission denied", str(log))
        return real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", guarded_open)
    tailer = start(tailers, sink, log, recheck_interval=0.02)
    sink.wait_lines(["old"])
    denied.set()
    os.rename(log, tmp_path / "engine.log.1")
    log.write_text("new\n")
    sink.wait(lambda: tailer.read_errors == 1, "the error")
    deadline = time.monotonic() + 0.5  # 25 re-checks: still one episode
    while time.monotonic() < deadline:
        assert tailer.read_errors == 1
        time.sleep(0.02)
    assert not tailer.up
    denied.clear()
    sink.wait_lines(["old", "new"])
    assert tailer.up and (tailer.read_errors, tailer.rotations) == (1, 1)


def test_path_that_is_not_a_regular_file_is_counted_and_retried(
    tmp_path: Path, sink: Sink, tailers: list[LogTailer]
) -> None:
    log = tmp_path / "engine.log"
    log.mkdir()  # e.g. a mis-mounted volume: exists, cannot be read as a log
    tailer = start(tailers, sink, log, recheck_interval=0.05)
    sink.wait(lambda: tailer.read_errors == 1, "the error")
    assert not tailer.up
    log.rmdir()
    log.write_text("ok\n")
    sink.wait_lines(["ok"])
    assert tailer.up and tailer.read_errors == 1


def test_resume_continues_at_the_saved_position_of_the_same_file(
    tmp_path: Path, sink: Sink, tailers: list[LogTailer]
) -> None:
    log = tmp_path / "engine.log"
    log.write_text("1\n2\nunfin")
    first = start(tailers, sink, log)
    sink.wait_lines(["1", "2"])
    saved = first.positions()
    first.stop()
    pos = saved[str(log)]
    assert (pos.offset, pos.inode) == (4, log.stat().st_ino)
    assert FilePosition.from_dict(pos.to_dict()) == pos
    append(log, "ished\n3\n")
    again = Sink()
    start(tailers, again, log, resume=saved)
    again.wait_lines(["unfinished", "3"])


def test_resume_reads_from_the_start_when_the_file_was_replaced(
    tmp_path: Path, sink: Sink, tailers: list[LogTailer]
) -> None:
    log = tmp_path / "engine.log"
    log.write_text("old content that is long enough\n")
    stale = FilePosition(str(log), log.stat().st_dev, log.stat().st_ino + 12345, 10)
    start(tailers, sink, log, resume={str(log): stale})
    sink.wait_lines(["old content that is long enough"])


def test_resume_rejects_a_same_inode_file_whose_bytes_differ(
    tmp_path: Path, sink: Sink, tailers: list[LogTailer]
) -> None:
    log = tmp_path / "engine.log"
    log.write_text("abc\ndef\n")
    st = log.stat()
    saved = FilePosition(str(log), st.st_dev, st.st_ino, 4, b"xyz\n".hex())
    start(tailers, sink, log, resume={str(log): saved})
    sink.wait_lines(["abc", "def"])


@pytest.mark.parametrize("rotations", [1, 2], ids=["one-rotation", "two-rotations"])
def test_resume_finishes_a_file_rotated_while_kvwatch_was_down(
    tmp_path: Path, sink: Sink, tailers: list[LogTailer], rotations: int
) -> None:
    """The saved file's rest, then (two rotations: logrotate's numbered scheme) the generation
    kvwatch never saw, then the live file."""
    log = tmp_path / "engine.log"
    log.write_text("1\n")
    first = start(tailers, sink, log)
    sink.wait_lines(["1"])
    saved = first.positions()
    first.stop()
    append(log, "2 written while kvwatch was down\n")
    os.rename(log, tmp_path / "engine.log.1")
    expected = ["2 written while kvwatch was down"]
    if rotations == 2:
        log.write_text("3 a generation kvwatch never saw\n")
        os.rename(tmp_path / "engine.log.1", tmp_path / "engine.log.2")
        os.rename(log, tmp_path / "engine.log.1")
        expected.append("3 a generation kvwatch never saw")
    log.write_text("4 new file\n")
    again = Sink()
    start(tailers, again, log, resume=saved)
    again.wait_lines([*expected, "4 new file"])


def test_positions_inside_on_line_include_that_line(tmp_path: Path, tailers: list[LogTailer]) -> None:
    """A consumer can store, with each line, the exact position to resume after it."""
    log = tmp_path / "engine.log"
    log.write_bytes(b"a\r\nbb\nccc\npartial")
    offsets: list[tuple[str, int]] = []
    tailer: LogTailer

    def on_line(path: str, line: str) -> None:
        offsets.append((line, tailer.positions()[path].offset))

    tailer = LogTailer(str(log), on_line)
    tailers.append(tailer)
    tailer.start()
    wait_until(lambda: len(offsets) == 3, "three lines")
    assert offsets == [("a", 3), ("bb", 6), ("ccc", 10)]
    pos = tailer.positions()[str(log)]
    assert bytes.fromhex(pos.fingerprint) == b"a\r\nbb\nccc\n"


def test_positions_match_the_lines_delivered_when_the_count_is_unchanged_around_the_call(
    tmp_path: Path, tailers: list[LogTailer]
) -> None:
    """The sidecar's save protocol: count delivered lines, call positions(), count again; equal
    counts must mean the positions are exactly after those lines, while lines stream in."""
    log = tmp_path / "engine.log"
    lines = 200_000
    log.write_bytes(b"".join(b"%09d\n" % i for i in range(lines)))
    received = [0]

    def on_line(path: str, line: str) -> None:
        received[0] += 1

    tailer = LogTailer(str(log), on_line, recheck_interval=NO_RECHECK)
    tailers.append(tailer)
    tailer.start()
    consistent = 0
    deadline = time.monotonic() + WAIT
    while received[0] < lines and time.monotonic() < deadline:
        before = received[0]
        pos = tailer.positions().get(str(log))
        if pos is not None and received[0] == before:
            assert pos.offset == before * 10
            consistent += 1
    assert received[0] == lines
    assert consistent > 10


def test_inotify_limit_falls_back_to_polling(
    tmp_path: Path, sink: Sink, tailers: list[LogTailer], monkeypatch: pytest.MonkeyPatch
) -> None:
    from watchdog.observers import Observer

    def no_watches(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "inotify watch limit reached")

    monkeypatch.setattr(Observer, "schedule", no_watches)
    log = tmp_path / "engine.log"
    log.write_text("before\n")
    tailer = start(tailers, sink, log, recheck_interval=NO_RECHECK, poll_interval=0.02)
    sink.wait_lines(["before"])
    append(log, "after\n")  # only the polling observer can report this
    sink.wait_lines(["before", "after"])
    assert tailer.observer_kind == "native+polling"


def test_a_log_larger_than_one_turn_of_reading_is_read_whole(
    tmp_path: Path, tailers: list[LogTailer]
) -> None:
    """One file is read at most 8 MiB per turn (so a fast writer cannot starve other files); the
    rest must follow without any filesystem event or re-check to prompt it."""
    log = tmp_path / "engine.log"
    lines = 100_000
    log.write_bytes(b"".join(b"%099d\n" % i for i in range(lines)))  # 10 MB
    count = [0]
    done = threading.Event()

    def on_line(path: str, line: str) -> None:
        assert int(line) == count[0]
        count[0] += 1
        if count[0] == lines:
            done.set()

    tailer = LogTailer(str(log), on_line, recheck_interval=NO_RECHECK)
    tailers.append(tailer)
    tailer.start()
    assert done.wait(60), f"only {count[0]} lines read"
    assert tailer.positions()[str(log)].offset == lines * 100


def test_crlf_long_lines_and_invalid_utf8_from_a_file(
    tmp_path: Path, sink: Sink, tailers: list[LogTailer]
) -> None:
    log = tmp_path / "engine.log"
    log.write_bytes(b"windows\r\n" + b"z" * 5000 + b"\nbad \xc3\x28 byte\r\n")
    tailer = start(tailers, sink, log, max_line_chars=100)
    sink.wait_lines(["windows", "z" * 100, "bad \ufffd( byte"])
    assert tailer.truncated_lines == 1


def test_a_failing_callback_does_not_stop_the_tailer(tmp_path: Path, tailers: list[LogTailer]) -> None:
    log = tmp_path / "engine.log"
    log.write_text("boom\nfine\n")
    seen: list[str] = []
    errors: list[BaseException] = []

    def on_line(path: str, line: str) -> None:
        if line == "boom":
            raise RuntimeError("pipeline bug")
        seen.append(line)

    tailer = LogTailer(str(log), on_line, on_error=lambda p, e: errors.append(e))
    tailers.append(tailer)
    tailer.start()
    wait_until(lambda: seen == ["fine"], "the line after the failure")
    assert tailer.callback_errors == 1 and isinstance(errors[0], RuntimeError)


def test_stop_closes_every_file(tmp_path: Path, sink: Sink) -> None:
    log = tmp_path / "engine.log"
    log.write_text("x\n")
    before = len(os.listdir("/proc/self/fd"))
    tailer = LogTailer(str(log), sink.on_line)
    tailer.start()
    sink.wait_lines(["x"])
    os.rename(log, tmp_path / "engine.log.1")
    log.write_text("y\n")
    sink.wait_lines(["x", "y"])  # now one retired and one current file are open
    saved = tailer.positions()
    tailer.stop()
    assert not tailer.up
    assert tailer.positions() == saved  # still there for the final state-file write
    wait_until(lambda: len(os.listdir("/proc/self/fd")) <= before, "descriptors to be released")


def test_stop_from_inside_on_line(tmp_path: Path, tailers: list[LogTailer]) -> None:
    log = tmp_path / "engine.log"
    log.write_text("stop here\nnever\n")
    seen: list[str] = []
    tailer: LogTailer

    def on_line(path: str, line: str) -> None:
        seen.append(line)
        tailer.stop()

    tailer = LogTailer(str(log), on_line)
    tailers.append(tailer)
    tailer.start()
    wait_until(lambda: not tailer.up and seen != [], "the tailer to stop")
    assert seen == ["stop here"]
    wait_until(lambda: tailer._thread is not None and not tailer._thread.is_alive(), "the thread to end")
    assert tailer.positions()[str(log)].offset == len("stop here\n")


def test_read_lines_from_a_pipe_until_eof(tmp_path: Path) -> None:
    r, w = os.pipe()
    os.write(w, b"one\r\ntwo\nthree")
    os.close(w)
    got: list[str] = []
    with os.fdopen(r, "rb") as stream:
        read_lines(got.append, stop=threading.Event(), stream=stream)
    assert got == ["one", "two", "three"]


def test_read_lines_with_a_closed_stdin_returns_at_once(tmp_path: Path) -> None:
    closed = open(tmp_path / "x", "wb")  # noqa: SIM115
    closed.close()
    got: list[str] = []
    read_lines(got.append, stop=threading.Event(), stream=closed)
    assert got == []


def test_read_lines_returns_on_stop_while_the_writer_is_silent() -> None:
    r, w = os.pipe()
    stop = threading.Event()
    got: list[str] = []
    with os.fdopen(r, "rb") as stream:
        reader = threading.Thread(
            target=read_lines, args=(got.append,), kwargs={"stop": stop, "stream": stream, "wait_slice": 0.02}
        )
        reader.start()
        os.write(w, b"hello\n")
        wait_until(lambda: got == ["hello"], "the line")
        stop.set()
        reader.join(WAIT)
        assert not reader.is_alive()
    os.close(w)


def test_appends_are_read_without_asking_watchdog_for_modify_events(
    tmp_path: Path, sink: Sink, tailers: list[LogTailer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With append polling on, the kernel is not asked for IN_MODIFY: one event per engine write
    through watchdog's threads is the sidecar's largest CPU cost at a steady line rate."""
    rung: list[str] = []
    log = tmp_path / "vllm.log"
    log.write_text("")
    tailer = start(tailers, sink, log, recheck_interval=NO_RECHECK)
    original = tailer._on_fs_event

    def ringing(event: FileSystemEvent) -> None:
        rung.append(event.event_type)
        original(event)

    monkeypatch.setattr(tailer, "_on_fs_event", ringing)
    for i in range(5):
        append(log, f"line {i}\n")
    sink.wait_lines([f"line {i}" for i in range(5)])
    assert "modified" not in rung


def test_refresh_reads_appends_in_the_calling_thread_however_long_the_interval(
    tmp_path: Path, sink: Sink, tailers: list[LogTailer]
) -> None:
    """A sidecar calls refresh() when /metrics is scraped: the scrape must not wait for the
    tailer's own (rare) timed read to see a line appended just before it."""
    log = tmp_path / "vllm.log"
    log.write_text("startup\n")
    tailer = start(tailers, sink, log, recheck_interval=NO_RECHECK, append_interval=NO_RECHECK)
    sink.wait_lines(["startup"])
    append(log, "appended\nhalf")
    time.sleep(0.2)
    assert sink.texts() == ["startup"]  # the tailer's thread is asleep for an hour
    assert tailer.refresh()
    assert sink.texts() == ["startup", "appended"]  # read by this call, in this thread
    assert sink.lines[-1][0] == str(log)
    assert tailer.positions()[str(log)].offset == len("startup\nappended\n")
    append(log, " line\n")
    assert tailer.refresh()
    assert sink.texts() == ["startup", "appended", "half line"]
    tailer.stop()
    assert not tailer.refresh()


def test_refresh_gives_up_while_the_tailer_thread_holds_the_files(
    tmp_path: Path, sink: Sink, tailers: list[LogTailer]
) -> None:
    """A scrape during a long first read of a big log renders what was read so far, not wait."""
    log = tmp_path / "vllm.log"
    log.write_text("a\n")
    tailer = start(tailers, sink, log, recheck_interval=NO_RECHECK, append_interval=NO_RECHECK)
    sink.wait_lines(["a"])
    append(log, "b\n")
    with tailer._lock:  # what the tailer's thread holds while it reads
        got: list[bool] = []
        other = threading.Thread(target=lambda: got.append(tailer.refresh(timeout=0.05)))
        other.start()
        other.join(5)
        assert got == [False]  # it gave up while the lock was still held
    assert sink.texts() == ["a"]
    assert tailer.refresh()
    assert sink.texts() == ["a", "b"]


def test_a_structural_event_wakes_a_tailer_with_a_long_interval(
    tmp_path: Path, sink: Sink, tailers: list[LogTailer]
) -> None:
    """With rare timed reads, inotify's doorbell still gets a rotation followed at once."""
    log = tmp_path / "vllm.log"
    log.write_text("old\n")
    tailer = start(tailers, sink, log, recheck_interval=NO_RECHECK, append_interval=NO_RECHECK)
    sink.wait_lines(["old"])
    log.rename(tmp_path / "vllm.log.1")
    # The new file appears with its line in it (written aside, moved in): a create followed by a
    # separate append would race the doorbell against the write, and appends wake no one here.
    fresh = tmp_path / "vllm.log.tmp"
    fresh.write_text("new\n")
    fresh.rename(log)
    sink.wait_lines(["old", "new"])
    assert tailer.rotations == 1
