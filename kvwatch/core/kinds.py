"""The names of the engines kvwatch knows: the one place they are spelled.

``EngineName`` is the type every event and deployment carries; ``ENGINE_NAMES`` is the same set at
run time (argparse choices, config validation). kvwatch.engines.registry checks that it has one
package per name.
"""

from __future__ import annotations

from typing import Literal, get_args

EngineName = Literal["vllm", "sglang"]
# An engine, or 'auto': detect it from the log or the exposition.
EngineChoice = Literal["auto"] | EngineName

ENGINE_NAMES: tuple[EngineName, ...] = get_args(EngineName)
# The engine a command assumes when none is named (predict, plan) and a Deployment's default.
DEFAULT_ENGINE: EngineName = "vllm"
ENGINE_CHOICES: tuple[str, ...] = ("auto", *ENGINE_NAMES)
