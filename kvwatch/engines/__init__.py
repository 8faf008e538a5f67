"""Everything one serving engine means, one package per engine; ``registry`` lists them.

An engine package holds its log line table and fast path, its /metrics map, its budget arithmetic
per release, the reconstruction of its observed budget, its defaults and its flag spelling. Code
outside kvwatch/engines reaches an engine only through its ``Engine`` object (base.py) found in
``registry.ENGINES``, looked up once and carried: adding an engine is adding a package and one
registry line. This module imports nothing, so the low layers (events, capacity) can import
``kinds`` without a cycle.
"""
