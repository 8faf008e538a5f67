"""GPU catalogue: the memory each card reports to the driver (nvidia-smi / rocm-smi), by name.

Capacity starts from this figure, not from the marketing size: an "80 GB" H100 SXM reports
81,559 MiB, an RTX A6000 48 GB reports 46,068 MiB with ECC on and 49,140 MiB with it off. Names are
matched case-insensitively, ignoring spaces, dashes and underscores; ``--gpu-memory`` overrides
the catalogue for any card not listed or measured differently.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvwatch.errors import ConfigError
from kvwatch.units import MiB


@dataclass(frozen=True)
class GpuSpec:
    """One card: its canonical name, the memory it reports, and the names users type for it."""

    name: str
    memory_bytes: int
    aliases: tuple[str, ...] = ()
    vendor: str = "nvidia"
    note: str = ""

    @property
    def memory_mib(self) -> int:
        return self.memory_bytes // MiB


def _mib(n: int) -> int:
    return n * MiB


CATALOGUE: tuple[GpuSpec, ...] = (
    GpuSpec("H100-SXM-80GB", _mib(81559), ("h100", "h100-sxm", "h100-sxm5", "h100-80gb", "h100-hbm3")),
    GpuSpec("H100-PCIe-80GB", _mib(81559), ("h100-pcie",)),
    GpuSpec("H100-NVL-94GB", _mib(95830), ("h100-nvl", "h100nvl")),
    GpuSpec("H200-SXM-141GB", _mib(143771), ("h200", "h200-sxm", "h200-141gb")),
    GpuSpec("H200-NVL-141GB", _mib(143771), ("h200-nvl",)),
    GpuSpec("H20-96GB", _mib(97871), ("h20",)),
    GpuSpec("GH200-96GB", _mib(97871), ("gh200",)),
    GpuSpec("B200-180GB", _mib(183359), ("b200",)),
    GpuSpec("A100-SXM-80GB", _mib(81920), ("a100", "a100-80gb", "a100-sxm", "a100-sxm4-80gb")),
    GpuSpec("A100-PCIe-80GB", _mib(81920), ("a100-pcie", "a100-pcie-80gb")),
    GpuSpec("A100-SXM-40GB", _mib(40960), ("a100-40gb", "a100-sxm4-40gb", "a100-pcie-40gb")),
    GpuSpec("L40S-48GB", _mib(46068), ("l40s",), note="ECC on (default)"),
    GpuSpec("L40-48GB", _mib(46068), ("l40",), note="ECC on (default)"),
    GpuSpec("RTX-A6000-48GB", _mib(46068), ("a6000", "rtx-a6000", "a6000-ecc-on"), note="ECC on"),
    GpuSpec("RTX-A6000-48GB-ECC-off", _mib(49140), ("a6000-ecc-off", "rtx-a6000-ecc-off"), note="ECC off"),
    GpuSpec("RTX-6000-Ada-48GB", _mib(49140), ("rtx6000-ada", "6000-ada"), note="ECC off"),
    GpuSpec("RTX-PRO-6000-96GB", _mib(97887), ("rtx-pro-6000", "pro6000")),
    GpuSpec("L4-24GB", _mib(23034), ("l4",)),
    GpuSpec("A10G-24GB", _mib(23028), ("a10g",)),
    GpuSpec("A10-24GB", _mib(23028), ("a10",)),
    GpuSpec("RTX-4090-24GB", _mib(24564), ("4090", "rtx4090")),
    GpuSpec("RTX-3090-24GB", _mib(24576), ("3090", "rtx3090")),
    GpuSpec("RTX-5090-32GB", _mib(32607), ("5090", "rtx5090")),
    GpuSpec("T4-16GB", _mib(15360), ("t4",)),
    GpuSpec("V100-32GB", _mib(32768), ("v100", "v100-32gb")),
    GpuSpec("MI300X-192GB", 206141652992, ("mi300x", "mi300"), vendor="amd"),
)


def _key(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


_INDEX: dict[str, GpuSpec] = {}
for _spec in CATALOGUE:
    for _n in (_spec.name, *_spec.aliases):
        _INDEX.setdefault(_key(_n), _spec)


def lookup(name: str) -> GpuSpec:
    """The catalogue entry for a name or alias (case, spaces and dashes ignored)."""
    spec = _INDEX.get(_key(name))
    if spec is None:
        known = ", ".join(s.name for s in CATALOGUE)
        raise ConfigError(f"unknown GPU {name!r}; known: {known} (or pass --gpu-memory SIZE)")
    return spec
