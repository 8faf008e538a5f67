"""Where input comes from and how it becomes events: followed files (``logfile.LogTailer``), stdin
(``stdin.read_lines``), the one byte-to-line splitter both use (``lines.LineSplitter``), the
access-line stage (``access``), lines to events to state (``pipeline.LinePipeline``), an engine's
/metrics fetched (``scrape``) and read through its dialect (``metrics_reader.MetricsReader``), and
model configs found in the Hugging Face cache or on the Hub (``hub``). Imports nothing itself, so a
submodule never imports its siblings through the package."""
