"""The vocabulary every layer shares: engine kinds, units, errors, versions, JSON types and the typed
events. Imports nothing of kvwatch outside ``core``."""
