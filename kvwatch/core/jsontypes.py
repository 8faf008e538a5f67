"""The one JSON type: what kvwatch writes as JSON (command output, the state file) or reads from it.

Facts cross module boundaries as typed dataclasses (kvwatch/state/facts.py); only a document that is
JSON by nature (an output object, a model's config.json, a saved file) is a ``JsonObject``.
"""

from __future__ import annotations

from typing import TypeAlias

JsonScalar: TypeAlias = str | int | float | bool | None
JsonValue: TypeAlias = JsonScalar | list["JsonValue"] | dict[str, "JsonValue"]
JsonObject: TypeAlias = dict[str, JsonValue]
