"""``kvwatch explain --html FILE``: the status page the sidecar serves at /, for one replayed log.

The same renderer (kvwatch/export/status.py) and the same predictor as the sidecar, so the file
shows what `kvwatch run` would show for this startup; the command's --tp/--pp/--kv-cache-dtype/
--max-model-len/--engine-version fill what the log did not print, as they do for the text report.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from pathlib import Path

from kvwatch.analysis.explain import Explanation, Overrides
from kvwatch.analysis.predictor import Predictor
from kvwatch.core.errors import ConfigError
from kvwatch.export import status
from kvwatch.state.instance import InstanceSnapshot


def write(
    path: str,
    snapshots: Iterable[InstanceSnapshot],
    explained: Sequence[Explanation],
    model_config: Path | None,
    gpu_memory: int | None,
    overrides: Overrides,
    logs: Sequence[str],
) -> None:
    """Write the page for the instances ``explained`` covers (those with a memory budget or pool)."""
    keep = {(e.source, e.instance) for e in explained}
    snaps = [
        dataclasses.replace(s, settings=overrides.filled(s.settings))
        for s in snapshots
        if (s.source, s.instance) in keep
    ]
    predictor = Predictor(model_config=lambda source: model_config, gpu_memory_bytes=gpu_memory)
    page = status.render(snaps, predictor.predict, title="kvwatch explain: " + ", ".join(logs))
    try:
        Path(path).write_text(page, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror}") from None
