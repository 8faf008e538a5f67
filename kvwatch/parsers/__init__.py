"""Engine-neutral parsing: prefix peeling (prefix.py), the parser contract (base.py), the generic
/metrics reader (prom_text.py, samples.py). Each engine's own line table and /metrics map live in
kvwatch/engines; this package imports nothing itself."""
