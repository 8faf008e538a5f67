"""Engine-neutral, pure parsing: prefix peeling (prefix.py), the parser contract (base.py), the
exposition-text stream and sample groups behind the /metrics reader (prom_stream.py, samples.py).
Each engine's own line table and /metrics map live in kvwatch/engines, the reader that applies them
in kvwatch/sources/metrics_reader.py; this package imports nothing itself."""
