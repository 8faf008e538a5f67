"""Errors that stop a command before it does anything.

KvwatchError
 ├── ConfigError       bad flags, environment or YAML settings
 └── ModelConfigError  a config.json kvwatch cannot size (names the missing field)

The CLI prints ``str(error)`` on one line and exits with code 2; nothing else is caught there, so a
real bug still shows its traceback.
"""

from __future__ import annotations


class KvwatchError(Exception):
    """A user-facing error: one line, exit code 2."""


class ConfigError(KvwatchError):
    """Invalid kvwatch configuration (flags, environment, settings file)."""


class ModelConfigError(KvwatchError):
    """A model config.json that cannot be read or sized."""
