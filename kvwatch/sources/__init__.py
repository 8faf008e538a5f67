"""Where log lines come from: followed files (``LogTailer``) and stdin (``read_lines``)."""

from kvwatch.sources.lines import LineSplitter
from kvwatch.sources.logfile import FilePosition, LogTailer
from kvwatch.sources.stdin import read_lines

__all__ = ["FilePosition", "LineSplitter", "LogTailer", "read_lines"]
