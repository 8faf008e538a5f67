"""Where log lines come from: followed files (``logfile.LogTailer``), stdin (``stdin.read_lines``),
and the one byte-to-line splitter both use (``lines.LineSplitter``). Imports nothing itself, so a
submodule never imports its siblings through the package."""
