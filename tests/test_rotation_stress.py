"""1,000 rotations of mixed kinds under steady writing: no line lost, none duplicated, none mangled.

The followed path is a Kubernetes-style symlink (``containers/app.log``) to a container log file
(``pods/<n>.log``), and each rotation is done the way the real tool does it:

* rename-and-create (logrotate ``create``, kubelet's own rotation): older copies shifted, the file
  renamed to ``.1``, a new empty file created, and the application keeps appending to the renamed
  file until it is "signalled" and reopens;
* copytruncate (logrotate ``copytruncate``): copy to ``.1``, truncate in place. In real life lines
  written between the copy and the truncate are lost whatever the reader does, so the writer pauses
  across copy+truncate like a cooperative logrotate whose postrotate signals the application.
  Lines written *before* the copy that the tailer had not read yet must be recovered from the copy;
* delete-and-recreate: the file is unlinked, the application writes once more into the open
  (deleted) file, then reopens, creating a new one;
* symlink swap (container restart): a new ``pods/<n+1>.log`` is created and written, the link is
  atomically replaced, and target files older than the previous container are deleted.

Lines are written whole or split across two writes. Two rotations within the tailer's reaction time
(milliseconds) would rotate away a generation it never opened — unrecoverable for any tailer, and
impossible with real rotation periods of minutes — so the writer rotates a generation only after
the tailer has delivered its first line; everything else (lag behind the writer, late writes to
renamed and deleted files, unread data at copytruncate) is left to chance and must be survived.
"""

from __future__ import annotations

import os
import random
import shutil
import threading
import time
from pathlib import Path

import pytest

from kvwatch.sources.logfile import LogTailer

ROTATIONS = 1000
KINDS = ("rename", "copytruncate", "delete", "symlink")
KEEP = 3  # rotated copies kept, like logrotate's 'rotate 3'
WAIT = 30.0


def expected_line(seq: int) -> str:
    """Every line is known from its number, so a glued or cut line cannot pass."""
    return f"seq={seq:08d} " + "x" * (seq * 7919 % 150)


class Writer:
    """The application and its log rotator, in one thread so that the order is the real one."""

    def __init__(self, root: Path, seen: set[int], seen_cond: threading.Condition, rotations: int) -> None:
        self.rotations = rotations
        self.pods = root / "pods" / "default_vllm-0_uid" / "vllm"
        self.pods.mkdir(parents=True)
        self.link = root / "containers" / "vllm-0_default_vllm-abc.log"
        self.link.parent.mkdir()
        self.container = 0
        self.fh = open(self.target, "ab", buffering=0)  # noqa: SIM115 - the application's log handle
        os.symlink(self.target, self.link)
        self.seq = 0
        self.rng = random.Random(7)
        self.seen = seen
        self.seen_cond = seen_cond
        self.kinds: dict[str, int] = dict.fromkeys(KINDS, 0)
        self.error: BaseException | None = None

    @property
    def target(self) -> Path:
        return self.pods / f"{self.container}.log"

    def write_line(self) -> int:
        out = self.fh
        data = (expected_line(self.seq) + "\n").encode()
        if self.rng.random() < 0.2:
            cut = self.rng.randrange(1, len(data))
            out.write(data[:cut])
            time.sleep(0)
            out.write(data[cut:])
        else:
            out.write(data)
        self.seq += 1
        return self.seq - 1

    def wait_seen(self, seq: int) -> None:
        deadline = time.monotonic() + WAIT
        with self.seen_cond:
            while seq not in self.seen:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"tailer never delivered line {seq}")
                self.seen_cond.wait(min(left, 0.05))

    def shift(self, path: Path) -> None:
        """logrotate's numbered copies: drop the oldest, move .1 -> .2 ..."""
        oldest = path.with_name(f"{path.name}.{KEEP}")
        if oldest.exists():
            oldest.unlink()
        for n in range(KEEP - 1, 0, -1):
            src = path.with_name(f"{path.name}.{n}")
            if src.exists():
                os.rename(src, path.with_name(f"{path.name}.{n + 1}"))

    def rotate(self, kind: str) -> None:
        target = self.target
        if kind == "rename":
            self.shift(target)
            os.rename(target, target.with_name(target.name + ".1"))
            self.write_line()  # not signalled yet: still appending to the renamed file
            target.touch()  # logrotate 'create'
            self.write_line()
            self.fh.close()  # postrotate signal: the application reopens
            self.fh = open(target, "ab", buffering=0)  # noqa: SIM115
        elif kind == "copytruncate":
            self.shift(target)
            shutil.copyfile(target, target.with_name(target.name + ".1"))
            os.truncate(target, 0)  # the writer is paused between copy and truncate
        elif kind == "delete":
            os.unlink(target)
            self.write_line()  # into the deleted file, still open
            self.fh.close()
            self.fh = open(target, "ab", buffering=0)  # noqa: SIM115
        else:
            self.fh.close()  # the old container exited
            self.container += 1
            self.fh = open(self.target, "ab", buffering=0)  # noqa: SIM115
            self.write_line()  # the new container starts before the kubelet swaps the link
            tmp = self.link.with_name(self.link.name + ".tmp")
            os.symlink(self.target, tmp)
            os.replace(tmp, self.link)
            for old in self.pods.glob(f"{self.container - 2}.log*"):
                old.unlink()
        self.kinds[kind] += 1

    def run(self) -> None:
        try:
            for _ in range(self.rotations):
                first = self.write_line()
                for _ in range(self.rng.randrange(0, 12)):
                    self.write_line()
                    if self.rng.random() < 0.3:
                        time.sleep(0.0005)
                self.wait_seen(first)
                self.rotate(self.rng.choice(KINDS))
            self.write_line()
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            self.fh.close()


@pytest.mark.integration
@pytest.mark.parametrize(
    ("polling", "rotations"),
    # The polling observer wakes every 50 ms, so each rotation waits that long for its first line:
    # fewer rotations keep that variant within a few seconds too.
    [(False, ROTATIONS), (True, ROTATIONS // 4)],
    ids=["inotify", "polling"],
)
def test_mixed_rotations_lose_and_duplicate_nothing(tmp_path: Path, polling: bool, rotations: int) -> None:
    seen: set[int] = set()
    duplicates: list[int] = []
    mangled: list[str] = []
    cond = threading.Condition()

    def on_line(path: str, line: str) -> None:
        try:
            seq = int(line[4:12])
        except ValueError:
            seq = -1
        with cond:
            if seq < 0 or line != expected_line(seq):
                mangled.append(line)
            elif seq in seen:
                duplicates.append(seq)
            else:
                seen.add(seq)
            cond.notify_all()

    writer = Writer(tmp_path, seen, cond, rotations)
    tailer = LogTailer(str(writer.link), on_line, polling=polling, poll_interval=0.05, retire_after=1.0)
    tailer.start()
    try:
        thread = threading.Thread(target=writer.run, name="stress-writer")
        thread.start()
        thread.join(120)
        assert not thread.is_alive(), "writer did not finish"
        if writer.error is not None:
            pytest.fail(f"{writer.error!r}; mangled {mangled[:3]}, duplicates {duplicates[:3]}")
        total = writer.seq
        deadline = time.monotonic() + WAIT
        with cond:
            while len(seen) < total and time.monotonic() < deadline:
                cond.wait(0.1)
        # Retired files are re-read until idle for retire_after; let that pass so that a
        # duplicate delivered late would be caught too.
        time.sleep(tailer.retire_after + tailer.recheck_interval)
    finally:
        tailer.stop()
    assert sum(writer.kinds.values()) == rotations
    assert all(count > rotations // 8 for count in writer.kinds.values()), writer.kinds
    assert mangled == []
    assert duplicates == []
    missing = sorted(set(range(total)) - seen)
    assert missing == [], f"{len(missing)} of {total} lines lost, first {missing[:10]}"
    assert tailer.rotations >= rotations
    assert tailer.read_errors == 0
