"""Replay's first stage: a block of raw lines without its access-log lines, here or in a helper process.

Access-log lines ('"POST /v1/completions HTTP/1.1" 200') are most of a busy server's output and
never carry a KV fact. ``drop_access_lines`` deletes them from a block of raw lines in bulk, in
sre's C loops, so they never become Python objects and no Python code runs per line; what is left
goes through the rest of the pipeline (kvwatch/sources/pipeline.py ``LinePipeline.feed_filtered``).

Deleting them is half of a busy log's replay time and needs nothing from the rest, so for a large
regular file ``filtered_blocks`` runs read + delete in a child interpreter (``python -I -S``, this
module alone) that streams the survivors through a pipe while this process parses them: the same
blocks and counts as the serial reading, on a second core. The pipe is the backpressure (memory
stays bounded); a child that fails is an OSError naming the file, never a silent short replay.
"""

from __future__ import annotations

import io
import os
import re
import stat
import struct
import sys
from collections.abc import Generator, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any, cast

from kvwatch.sources.lines import read_blocks

# Over a block of lines each preceded by b"\n": `subn` deletes every line with an access-log
# marker and counts them. The first pass deletes runs of four access lines per match (a busy log's
# access lines come in long runs), which saves three of every four matches' fixed cost; the second
# deletes the access lines left next to other lines. The line's tail is possessive (a match that
# fails at the next line never gives characters of this one back: none of them is a newline).
ACCESS_MARK = "HTTP/"
_ACCESS_LINE = rb"\n[^\n]*HTTP/[^\n]*+"
_ACCESS_RUN_LINES = 4
_ACCESS_RUN = re.compile(_ACCESS_LINE * _ACCESS_RUN_LINES)
_ACCESS_ONE = re.compile(_ACCESS_LINE)

# A file at least this large is filtered by a helper process (when two CPUs may be used): below
# it, starting an interpreter (~15 ms) costs more than the second core saves.
PARALLEL_MIN_BYTES = 64 << 20

# One frame per block: survivors' length, access lines dropped, bytes of the file read so far;
# then the survivors. A last header of all ones says the child finished.
_HEADER = struct.Struct("<QQQ")
_DONE = (2**64 - 1,) * 3

# (survivors, access lines dropped, bytes of the stream read so far).
Filtered = tuple[bytes, int, int]


def drop_access_lines(block: bytes | bytearray, pos: int = 0, endpos: int | None = None) -> tuple[bytes, int]:
    """``block[pos:endpos]`` (whole lines, each preceded by b"\\n"; read in place, not copied)
    without its access-log lines, and how many were dropped; the survivors keep their b"\\n"
    before each."""
    with memoryview(block)[pos : len(block) if endpos is None else endpos] as lines:
        rest, runs = _ACCESS_RUN.subn(b"", lines)
    rest, singles = _ACCESS_ONE.subn(b"", rest)
    return rest, _ACCESS_RUN_LINES * runs + singles


class _Counted(io.RawIOBase):
    """A stream that cannot tell where it stands (a pipe, a FIFO, a socket): its bytes counted as
    they are read, for the 'bytes read so far' a seekable file's ``tell`` gives."""

    def __init__(self, stream: io.BufferedIOBase) -> None:
        super().__init__()
        self._stream = stream
        self._read = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = self._stream.readinto(buffer) or 0
        self._read += n
        return n

    def tell(self) -> int:
        return self._read


def _tells(stream: io.BufferedIOBase) -> bool:
    try:
        stream.tell()
    except (OSError, io.UnsupportedOperation):  # ('Illegal seek': a pipe, a FIFO, a socket)
        return False
    return True


def _serial(stream: io.BufferedIOBase, max_line_chars: int) -> Iterator[Filtered]:
    if not _tells(stream):
        stream = cast(io.BufferedIOBase, _Counted(stream))
    for block, pos, endpos in read_blocks(stream, max_line_chars):
        rest, dropped = drop_access_lines(block, pos, endpos)
        yield rest, dropped, stream.tell()


# cgroup v2's CPU limit of this process's container ('max 100000', or '200000 100000': quota and
# period in microseconds); a container held to one CPU by quota may still see every core.
_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity, capped by a cgroup CPU quota."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # (not on Linux)
        cpus = os.cpu_count() or 1
    try:
        quota, period = _CPU_MAX.read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, int(quota) // int(period)))
    except (OSError, ValueError):
        pass  # no cgroup v2 limit readable: the affinity stands
    return cpus


def filtered_blocks(
    path: str, stream: io.BufferedIOBase, max_line_chars: int, parallel: bool | None = None
) -> Generator[Filtered, None, None]:
    """``stream`` (``path`` opened for binary reading) read to EOF from where it stands, as
    filtered blocks.

    ``parallel``: None chooses (a regular file with at least PARALLEL_MIN_BYTES left to read, and
    two CPUs), True and False force it (tests). Either way the blocks and counts are the same. The
    helper reads the stream's own open file (the same file even if ``path`` is renamed meanwhile)
    with positioned reads from the stream's position, so the stream itself is never moved; where
    the helper cannot start (or dies before its first frame) this process reads. A stream that
    cannot seek (a pipe, a FIFO, a socket) is always read here, its bytes counted as read.
    """
    try:
        fd = stream.fileno()
        st = os.fstat(fd)
        start = stream.tell()
    except (OSError, io.UnsupportedOperation):
        parallel = False
    else:
        if parallel is None:
            parallel = (
                stat.S_ISREG(st.st_mode) and st.st_size - start >= PARALLEL_MIN_BYTES and usable_cpus() >= 2
            )
    if not parallel:
        yield from _serial(stream, max_line_chars)
        return
    frames = _from_child(fd, start, path, max_line_chars)
    with closing(frames):
        try:
            first = next(frames, None)
        except _NoStart:
            # The helper reads with pread and moves no offset; a real seek all the same (past the
            # stream's buffer, which a seek within it would keep) costs nothing here.
            stream.seek(0, io.SEEK_END)
            stream.seek(start)
            yield from _serial(stream, max_line_chars)
            return
        if first is not None:
            yield first
            yield from frames


class _NoStart(Exception):
    """The helper gave nothing: it could not start, or died before its first frame."""


# The child: this module's _child_main in an isolated interpreter (no site, no environment), with
# the directory holding the kvwatch package last on its path (after the standard library, which
# nothing installed beside kvwatch may shadow).
_CHILD = (
    "import sys; sys.path.append(sys.argv[1]); from kvwatch.sources.access import _child_main; "
    "sys.exit(_child_main(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])))"
)
_PACKAGE_PARENT = str(Path(__file__).resolve().parent.parent.parent)
# The file's descriptor in the child: above stdin, stdout and stderr, which the child's own pipes
# take (the parent's file may be its fd 0, as in 'kvwatch parse - < big.log').
_LOWEST_CHILD_FD = 3


def _child_argv(fd: int, start: int, max_line_chars: int) -> list[str]:
    return [
        sys.executable,
        "-I",
        "-S",
        "-c",
        _CHILD,
        _PACKAGE_PARENT,
        str(fd),
        str(start),
        str(max_line_chars),
    ]


def _from_child(fd: int, start: int, path: str, max_line_chars: int) -> Generator[Filtered, None, None]:
    import fcntl  # (here: the sidecar, which never replays, does not pay for importing these)
    import subprocess

    try:
        child_fd = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, _LOWEST_CHILD_FD)
        try:
            proc = subprocess.Popen(
                _child_argv(child_fd, start, max_line_chars),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(child_fd,),
            )
        finally:
            os.close(child_fd)
    except (OSError, ValueError) as exc:  # (no interpreter to run; pass_fds where unsupported)
        raise _NoStart from exc
    assert proc.stdout is not None and proc.stderr is not None
    done = False
    frames = 0
    try:
        out = proc.stdout
        while header := out.read(_HEADER.size):
            if len(header) < _HEADER.size:
                break
            fields = _HEADER.unpack(header)
            if fields == _DONE:
                done = True
                break
            size, dropped, read = fields
            rest = out.read(size)
            if len(rest) < size:
                break
            frames += 1
            yield rest, dropped, read
    finally:
        if not done:
            proc.kill()  # (the consumer stopped early, or the child broke off)
        proc.stdout.close()
        said = proc.stderr.read().decode("utf-8", "replace").split("\n")
        err = next((line.strip() for line in reversed(said) if line.strip()), "")  # its last line
        proc.stderr.close()
        rc = proc.wait()
    if done and rc == 0:
        return
    if not frames:
        raise _NoStart(rc, err)
    raise OSError(0, f"the filter process broke off (exit {rc}{': ' + err[-300:] if err else ''})", path)


class _PositionedReader(io.RawIOBase):
    """An open file read with positioned reads from ``start``: its shared offset is never moved."""

    def __init__(self, fd: int, start: int) -> None:
        super().__init__()
        self._fd = fd
        self._pos = start

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = os.preadv(self._fd, [buffer], self._pos)
        self._pos += n
        return n

    def tell(self) -> int:
        return self._pos


def _child_main(fd: int, start: int, max_line_chars: int) -> int:
    """Read the open file ``fd`` from byte ``start``, write its filtered blocks to stdout as
    frames; 0 when all were written."""
    out = sys.stdout.buffer
    try:
        stream = cast(io.BufferedIOBase, _PositionedReader(fd, start))  # (read_blocks: readinto, tell)
        for rest, dropped, read in _serial(stream, max_line_chars):
            out.write(_HEADER.pack(len(rest), dropped, read))
            out.write(rest)
        out.write(_HEADER.pack(*_DONE))
        out.flush()
    except BrokenPipeError:
        return 1  # the reader went away: nothing left to do
    except Exception as exc:  # one line for the parent's message, never a traceback
        sys.stderr.write(f"{getattr(exc, 'strerror', None) or exc}\n")
        return 1
    return 0
