"""``--log -``: read an engine's output piped into kvwatch (``vllm serve ... 2>&1 | kvwatch run --log -``).

A pipe cannot rotate or be re-read, so this is only line splitting plus a way to stop: the read
waits with ``select`` in short slices so that ``stop`` is honoured even when the writer is silent.
"""

from __future__ import annotations

import os
import select
import sys
import threading
from collections.abc import Callable
from typing import BinaryIO

from kvwatch.sources.lines import LineSplitter

_CHUNK = 1 << 16


def read_lines(
    on_line: Callable[[str], None],
    *,
    stop: threading.Event,
    stream: BinaryIO | None = None,
    max_line_chars: int = 65536,
    wait_slice: float = 0.2,
    splitter: LineSplitter | None = None,
) -> LineSplitter:
    """Call ``on_line`` for every line of ``stream`` (stdin by default) until EOF or ``stop``.

    At EOF an unterminated last line is delivered too (the writer is gone, nothing will follow).
    Returns the splitter (``splitter``, when given: a caller that reads its ``truncated``, the
    lines cut at ``max_line_chars``, while this runs), whose ``truncated`` counts lines cut.
    """
    if splitter is None:
        splitter = LineSplitter(max_line_chars)
    try:
        fd = (stream if stream is not None else sys.stdin.buffer).fileno()
    except (AttributeError, OSError, ValueError):
        return splitter  # no usable stdin (None, closed, not a file): it has ended
    while not stop.is_set():
        try:
            ready, _, _ = select.select([fd], [], [], wait_slice)
            if not ready:
                continue
            data = os.read(fd, _CHUNK)
        except (InterruptedError, BlockingIOError):
            continue
        except OSError:
            data = b""  # stdin closed under us (EBADF, EIO on a hung-up terminal): it has ended
        if not data:
            last = splitter.flush()
            if last is not None:
                on_line(last)
            break
        for line in splitter.feed(data):
            on_line(line)
    return splitter
