"""GPU catalogue: each card's memory as the engines see it (the driver's total), and as nvidia-smi shows it.

Both engines size their budgets from ``torch.cuda.mem_get_info()``'s total, which is nvidia-smi's
figure less a driver/firmware reservation of 430-620 MiB: an H100 80GB HBM3 reports 81,559 MiB in
nvidia-smi and 79.19 GiB (81,091 MiB) to torch, as every vLLM 0.19 startup in the calibration set
prints (``total_memory=79.19GiB``; vllm/utils/mem_utils.py:103). ``total_bytes`` is that figure --
measured where a public log printed it (``total_source`` says where), else nvidia-smi's less
``DEFAULT_RESERVED_MIB`` -- and is what predictions use; ``memory_bytes`` is nvidia-smi's, which
SGLang's default memory fraction reads and the seeds' card tables quote. Names are matched
case-insensitively, ignoring spaces, dashes and underscores; ``--gpu-memory`` overrides the
catalogue for any card not listed or measured differently.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvwatch.core.errors import ConfigError
from kvwatch.core.units import GiB, MiB

# nvidia-smi MiB less the driver total, for a card no log has measured: 468 MiB on the H100,
# 430-620 MiB on the cards below (it moves with the driver).
DEFAULT_RESERVED_MIB = 480


@dataclass(frozen=True)
class GpuSpec:
    """One card: its canonical name, its memory (driver total and nvidia-smi), SMs, and aliases."""

    name: str
    memory_bytes: int  # as nvidia-smi shows it
    aliases: tuple[str, ...] = ()
    vendor: str = "nvidia"
    note: str = ""
    # As torch.cuda.mem_get_info() reports it; None = nvidia-smi less DEFAULT_RESERVED_MIB.
    measured_total_bytes: int | None = None
    total_source: str = ""
    sm_count: int | None = None
    # Compute capability major (9 = Hopper): sets cuBLAS's default workspace and Hopper-only layouts.
    sm_major: int = 8
    # How the cards of one server reach each other: "nvswitch" (an SXM/HGX board, every GPU on an
    # NVSwitch fabric), "pcie" (a PCIe card: PCIe, at most NVLink bridges, no switch), "" (not
    # stated: the form factor varies under one name). The engines' communication buffers differ:
    # vLLM's custom all-reduce is off on more than two GPUs not all NVLink-connected (0.19.0
    # distributed/device_communicators/custom_all_reduce.py:152-160) and NVLink SHARP needs the switch.
    interconnect: str = ""
    # Whether NVML reports the card's memory (nvmlDeviceGetMemoryInfo). A unified-memory device
    # answers NOT_SUPPORTED (GB10: NVIDIA's DGX Spark known issues, 'nvidia-smi reports memory usage
    # Not Supported'), and an engine that sizes its defaults from NVML sees no memory at all.
    nvml_memory: bool = True
    # Whether the CPU and the GPU share one physical memory (torch's device property is_integrated):
    # what the OS and every process take on the host comes out of the card's free memory.
    unified_memory: bool = False

    @property
    def memory_mib(self) -> int:
        return self.memory_bytes // MiB

    @property
    def total_bytes(self) -> int:
        """The card's total as the engines' budgets see it."""
        if self.measured_total_bytes is not None:
            return self.measured_total_bytes
        return self.memory_bytes - DEFAULT_RESERVED_MIB * MiB

    @property
    def total_measured(self) -> bool:
        return self.measured_total_bytes is not None


def _mib(n: int) -> int:
    return n * MiB


def _gib(x: float) -> int:
    return round(x * GiB)


_APRIORI = "total_memory=79.19GiB in the 50 vLLM 0.19 startups of tests/apriori"
_OOM_48 = "torch OOM messages 'total capacity of 44.52 GiB' on 48 GB L40S/A6000 cards"
_OOM_24 = "torch OOM messages 21.96-21.99 GiB and a vLLM log 22.06 GiB on 24 GB datacenter cards"

CATALOGUE: tuple[GpuSpec, ...] = (
    GpuSpec(
        "H100-SXM-80GB",
        _mib(81559),
        ("h100", "h100-sxm", "h100-sxm5", "h100-80gb", "h100-hbm3", "h100-80gb-hbm3"),
        measured_total_bytes=_gib(79.19),
        total_source=_APRIORI,
        sm_count=132,
        sm_major=9,
        interconnect="nvswitch",
    ),
    GpuSpec(
        "H100-PCIe-80GB",
        _mib(81559),
        ("h100-pcie",),
        measured_total_bytes=_gib(79.19),
        total_source="as the SXM card (the same nvidia-smi figure)",
        sm_count=114,
        sm_major=9,
        interconnect="pcie",
    ),
    GpuSpec(
        "H100-NVL-94GB", _mib(95830), ("h100-nvl", "h100nvl"), sm_count=132, sm_major=9, interconnect="pcie"
    ),
    GpuSpec(
        "H200-SXM-141GB",
        _mib(143771),
        ("h200", "h200-sxm", "h200-141gb"),
        measured_total_bytes=_gib(139.80),
        total_source="torch OOM messages 'total capacity of 139.80 GiB' (public logs)",
        sm_count=132,
        sm_major=9,
        interconnect="nvswitch",
    ),
    GpuSpec(
        "H200-NVL-141GB",
        _mib(143771),
        ("h200-nvl",),
        measured_total_bytes=_gib(139.80),
        total_source="as the SXM card",
        sm_count=132,
        sm_major=9,
        interconnect="pcie",
    ),
    GpuSpec("H20-96GB", _mib(97871), ("h20",), sm_count=78, sm_major=9, interconnect="nvswitch"),
    # China-market Hopper/Ampere parts: the H100 / A100 memory, fewer NVLink lanes.
    GpuSpec(
        "H800-SXM-80GB", _mib(81559), ("h800", "h800-80gb"), sm_count=132, sm_major=9, interconnect="nvswitch"
    ),
    GpuSpec("A800-SXM-80GB", _mib(81920), ("a800", "a800-80gb"), sm_count=108, interconnect="nvswitch"),
    GpuSpec("GH200-96GB", _mib(97871), ("gh200",), sm_count=132, sm_major=9),
    GpuSpec("B200-180GB", _mib(183359), ("b200",), sm_count=148, sm_major=10, interconnect="nvswitch"),
    # nvidia-smi '0MiB / 275040MiB' on 'NVIDIA B300 SXM6 AC' (public nvidia-smi captures); sm_103.
    GpuSpec(
        "B300-288GB",
        _mib(275040),
        ("b300", "b300-sxm6", "b300-sxm6-ac"),
        sm_major=10,
        interconnect="nvswitch",
    ),
    # GB10 (DGX Spark) shares 128 GB of LPDDR5x with the CPU; nvidia-smi prints no memory figure
    # (rossumai/nvgpu#37), so both figures are CUDA's total: 121.69 GiB
    # (MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks#47: 'CUDA free caps at ~102/121.69 GiB', and vLLM's
    # check at utilisation 0.87 'wants 105.87 GiB' = 0.87 x 121.69). 48 SMs, sm_121.
    GpuSpec(
        "GB10-128GB",
        _gib(121.69),
        ("gb10", "dgx-spark", "spark-gb10", "dgx-spark-gb10"),
        note="unified memory: the OS and page cache share it",
        measured_total_bytes=_gib(121.69),
        total_source="CUDA total 121.69 GiB on DGX Spark (MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks#47)",
        sm_count=48,
        sm_major=12,
        # nvmlDeviceGetMemoryInfo -> NVML_ERROR_NOT_SUPPORTED on a DGX Spark (XuehaiPan/nvitop#208,
        # driver 580.173.02; kubernetes-sigs/dra-driver-nvidia-gpu#1073; snowflakedb/ArcticTraining#345
        # citing docs.nvidia.com/dgx/dgx-spark/known-issues.html).
        nvml_memory=False,
        unified_memory=True,
    ),
    GpuSpec(
        "A100-SXM-80GB",
        _mib(81920),
        ("a100", "a100-80gb", "a100-sxm", "a100-sxm4-80gb"),
        measured_total_bytes=_gib(79.25),
        total_source=(
            "vLLM 0.26.1 'Free memory on device (78.84/79.25 GiB)' on a card its fused-MoE config lookup "
            "names NVIDIA_A100-SXM4-80GB (LukeJYK/AutoScientists, tests/apriori)"
        ),
        sm_count=108,
        interconnect="nvswitch",
    ),
    GpuSpec(
        "A100-PCIe-80GB",
        _mib(81920),
        ("a100-pcie", "a100-pcie-80gb"),
        measured_total_bytes=_gib(79.15),
        total_source="deviceQuery 'Total global mem: 81049 MB' (A100 80GB PCIe)",
        sm_count=108,
        interconnect="pcie",
    ),
    GpuSpec(
        "A100-SXM-40GB",
        _mib(40960),
        ("a100-40gb", "a100-sxm4-40gb", "a100-pcie-40gb"),
        measured_total_bytes=42298834944,
        total_source="deviceQuery 42,298,834,944 bytes (A100 40GB)",
        sm_count=108,
    ),
    GpuSpec(
        "L40S-48GB",
        _mib(46068),
        ("l40s",),
        note="ECC on (default)",
        measured_total_bytes=_gib(44.52),
        total_source=_OOM_48,
        sm_count=142,
        interconnect="pcie",
    ),
    GpuSpec(
        "L40-48GB",
        _mib(46068),
        ("l40",),
        note="ECC on (default)",
        measured_total_bytes=_gib(44.52),
        total_source=_OOM_48,
        sm_count=142,
        interconnect="pcie",
    ),
    GpuSpec(
        "RTX-A6000-48GB",
        _mib(46068),
        ("a6000", "rtx-a6000", "a6000-ecc-on"),
        note="ECC on",
        measured_total_bytes=_gib(44.52),
        total_source=_OOM_48,
        sm_count=84,
        interconnect="pcie",
    ),
    GpuSpec(
        "RTX-A6000-48GB-ECC-off",
        _mib(49140),
        ("a6000-ecc-off", "rtx-a6000-ecc-off"),
        note="ECC off",
        sm_count=84,
        interconnect="pcie",
    ),
    GpuSpec("A40-48GB", _mib(46068), ("a40",), note="ECC on", sm_count=84, interconnect="pcie"),
    GpuSpec("RTX-A5000-24GB", _mib(24564), ("a5000", "rtx-a5000"), sm_count=64, interconnect="pcie"),
    GpuSpec(
        "RTX-6000-Ada-48GB",
        _mib(49140),
        ("rtx6000-ada", "6000-ada"),
        note="ECC off",
        sm_count=142,
        interconnect="pcie",
    ),
    GpuSpec(
        "RTX-PRO-6000-96GB",
        _mib(97887),
        ("rtx-pro-6000", "pro6000"),
        sm_count=188,
        sm_major=12,
        interconnect="pcie",
    ),
    GpuSpec(
        "L4-24GB",
        _mib(23034),
        ("l4",),
        measured_total_bytes=_gib(21.98),
        total_source=_OOM_24,
        sm_count=58,
        interconnect="pcie",
    ),
    GpuSpec(
        "A10G-24GB",
        _mib(23028),
        ("a10g",),
        measured_total_bytes=_gib(21.98),
        total_source=_OOM_24,
        sm_count=80,
        interconnect="pcie",
    ),
    GpuSpec(
        "A10-24GB",
        _mib(23028),
        ("a10",),
        measured_total_bytes=_gib(21.98),
        total_source=_OOM_24,
        sm_count=72,
        interconnect="pcie",
    ),
    GpuSpec(
        "RTX-4090-24GB",
        _mib(24564),
        ("4090", "rtx4090"),
        measured_total_bytes=_gib(23.55),
        total_source="vLLM log 'total_gpu_memory (23.55GiB)' on an RTX 4090",
        sm_count=128,
        interconnect="pcie",
    ),
    # AD103, 76 SMs; nvidia-smi prints 16,376 MiB. The total is the one a vLLM 0.10.2 log prints on
    # one (mrpid12org/imageworks nohup.out, 'Free memory on device (14.66/15.99 GiB)').
    GpuSpec(
        "RTX-4080-16GB",
        _mib(16376),
        ("4080", "rtx4080"),
        measured_total_bytes=_gib(15.99),
        total_source="vLLM log 'Free memory on device (14.66/15.99 GiB)' on an RTX 4080",
        sm_count=76,
        interconnect="pcie",
    ),
    GpuSpec(
        "RTX-3090-24GB",
        _mib(24576),
        ("3090", "rtx3090"),
        measured_total_bytes=_gib(23.58),
        total_source="vLLM log 'total_gpu_memory=23.58GiB' on an RTX 3090 (tests/log_samples/vllm/001)",
        sm_count=82,
        interconnect="pcie",
    ),
    GpuSpec(
        "RTX-5090-32GB", _mib(32607), ("5090", "rtx5090"), sm_count=170, sm_major=12, interconnect="pcie"
    ),
    GpuSpec(
        "T4-16GB",
        _mib(15360),
        ("t4",),
        measured_total_bytes=_gib(14.56),
        total_source="vLLM log 'total_gpu_memory (14.56GiB)' on a T4",
        sm_count=40,
        sm_major=7,
        interconnect="pcie",
    ),
    GpuSpec("V100-32GB", _mib(32768), ("v100", "v100-32gb"), sm_count=80, sm_major=7),
    GpuSpec("MI300X-192GB", 206141652992, ("mi300x", "mi300"), vendor="amd", sm_count=304),
    # AMD's '288 GB HBM3E' counts GiB as the MI300X's 192 GB does (rocm-smi 'VRAM Total Memory (B):
    # 206141652992' = 192 GiB, ROCm/legacy-rocm-build#4750); SGLang logs 287.18 GiB free before the
    # weights on one (sglang#18263), more than 288e9 B holds. 256 CUs.
    GpuSpec(
        "MI355X-288GB", 288 * GiB, ("mi355x", "mi355", "amd-instinct-mi355x"), vendor="amd", sm_count=256
    ),
    # RDNA4 gfx1201: rocminfo's GPU pool 'Size: 16695296(0xfec000) KB' (ROCm/legacy-rocm-build#6625,
    # an RX 9070 XT) is the total HIP reports, 15.92 GiB. 64 CUs.
    GpuSpec(
        "RX-9070-XT-16GB",
        _mib(16384),
        ("rx-9070-xt", "9070xt", "radeon-rx-9070-xt", "amd-radeon-rx-9070-xt"),
        vendor="amd",
        measured_total_bytes=16695296 * 1024,
        total_source="rocminfo GPU pool 16,695,296 KB on an RX 9070 XT (ROCm/legacy-rocm-build#6625)",
        sm_count=64,
        interconnect="pcie",
    ),
)


def _key(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


_INDEX: dict[str, GpuSpec] = {}
for _spec in CATALOGUE:
    for _n in (_spec.name, *_spec.aliases):
        _INDEX.setdefault(_key(_n), _spec)


def find(name: str | None) -> GpuSpec | None:
    """The catalogue entry for a name or alias, or None (no error: a card kvwatch does not list)."""
    return None if name is None else _INDEX.get(_key(name))


def tp_over_fabric(tp: int, name: str | None) -> bool:
    """Whether tensor-parallel ranks on this card talk over an NVLink / NVSwitch / xGMI fabric: TP >= 2
    on a card not known to be PCIe-only (an unlisted card counts as one: the class the engines'
    startups on such cards measured). On PCIe-only cards there are no NVLink SHARP buffers and the
    engines turn custom all-reduce off beyond two GPUs, so both engines' communication memory
    follows this (engines/vllm/memory.fabric_non_torch, engines/sglang/calibration.fabric_communication).
    """
    if tp < 2:
        return False
    card = find(name)
    return card is None or card.interconnect != "pcie"


def lookup(name: str) -> GpuSpec:
    """The catalogue entry for a name or alias (case, spaces and dashes ignored)."""
    spec = _INDEX.get(_key(name))
    if spec is None:
        known = ", ".join(s.name for s in CATALOGUE)
        raise ConfigError(f"unknown GPU {name!r}; known: {known} (or pass --gpu-memory SIZE)")
    return spec
