"""Give back the disk blocks of log lines already read and saved (``kvwatch run --release-read``).

In sidecar mode the engine tees its output into a file on a shared volume (an emptyDir with a size
limit) and nothing rotates it: it grows until the kubelet evicts the pod. Rotating under ``tee -a``
is not possible without losing lines (tee keeps its descriptor), so kvwatch punches holes instead:
``fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)`` frees the blocks of ``[0, end)`` while the
file keeps its size and its inode, the writer keeps appending, and every offset stays valid
(fallocate(2); supported by ext4, xfs, btrfs and tmpfs, the filesystems of emptyDir volumes). The
freed range reads back as zeros and counts for nothing in the volume's usage (``du``, which the
kubelet's sizeLimit measures).

Only bytes below the position of the last *saved* state are released, and never the fingerprint
bytes just before it, so a restarted kvwatch resumes at the saved position and finds its
fingerprint intact: no line is lost, and none is read twice.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from collections.abc import Callable, Mapping
from typing import cast

from kvwatch.sources.files import FINGERPRINT, FilePosition, Stream

_PUNCH_HOLE = 0x02  # FALLOC_FL_PUNCH_HOLE (linux/falloc.h), which must come with KEEP_SIZE
_KEEP_SIZE = 0x01  # FALLOC_FL_KEEP_SIZE


@functools.cache
def _fallocate() -> Callable[[int, int, int, int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6", use_errno=True)
        func = libc.fallocate
    except (OSError, AttributeError):
        return None
    func.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    func.restype = ctypes.c_int
    return cast(Callable[[int, int, int, int], int], func)


def release_end(saved_offset: int, block: int) -> int:
    """Where released bytes may end for a saved position: before its fingerprint, on a block boundary."""
    return max(0, (saved_offset - FINGERPRINT) // block * block)


def punch(read_fd: int, start: int, end: int) -> None:
    """Free the blocks of ``[start, end)`` of the file open as ``read_fd`` (OSError when the file,
    the filesystem or the platform cannot). A read-only descriptor cannot punch: the file is
    reopened for writing through /proc, which names the same inode even after a rename."""
    if end <= start:
        return
    func = _fallocate()
    if func is None:
        raise OSError("fallocate is not available on this platform")
    fd = os.open(f"/proc/self/fd/{read_fd}", os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        if func(fd, _PUNCH_HOLE | _KEEP_SIZE, start, end - start) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, os.strerror(errno))
    finally:
        os.close(fd)


def release_saved(
    streams: Mapping[str, Stream],
    saved: Mapping[str, FilePosition],
    report: Callable[[str, BaseException], None],
) -> int:
    """A tailer's release (LogTailer.release, under its lock): per followed path whose open file is
    the saved one, free what lies before the saved position; returns the bytes freed now."""
    freed = 0
    for path, pos in saved.items():
        stream = streams.get(path)
        reader = stream.reader if stream is not None else None
        if reader is None or (reader.dev, reader.ino) != (pos.dev, pos.inode):
            continue
        try:
            end = release_end(min(pos.offset, reader.offset), os.fstat(reader.fd).st_blksize)
            if end <= reader.released:
                continue
            punch(reader.fd, reader.released, end)
            freed, reader.released = freed + end - reader.released, end
            # The file's first bytes now read as zeros: the tailer's truncation check compares those.
            reader.head = os.pread(reader.fd, len(reader.head), 0)
        except OSError as exc:
            report(path, exc)
    return freed
