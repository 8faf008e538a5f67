"""Pure log-line parsers: prefix stripping, then one module per engine (see base.py for the contract)."""
