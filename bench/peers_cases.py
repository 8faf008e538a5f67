"""The real startups bench/peers.py runs every tool on, each as a user would state it.

The sets: tests/apriori/cases.json ("main": llm-d's vLLM 0.19 sweep on H100 and llm-d-benchmark
rows) and every tests/apriori/public/*/cases.json (public vLLM, SGLang, ... startups: other cards
and releases). A case keeps what a user gives before launch -- the config.json, the card, the
release, the settings -- and what the log printed. Every tool gets the same config.json; only the
card is named in each tool's own terms.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.accuracy_cases import checkpoint_quant, typed_speculative, user_setting
from kvwatch.capacity import gpus

ROOT = Path(__file__).resolve().parent.parent / "tests"
MAIN = ROOT / "apriori" / "cases.json"
CONFIG_DIRS = (ROOT / "apriori" / "configs", ROOT / "model_configs")
# The llm-d-benchmark rows name no release; bench/bench_accuracy.py reads them as 0.15.
UNNAMED_RELEASE = "0.15.0"
_VERSION = re.compile(r"(\d+\.\d+(?:\.\d+)?)")
_ID_VERSION = re.compile(r"-v(0\d{1,2}|0\.\d+(?:\.\d+)?)(?=[-.a-z]|$)")
_CONFIG_NAME = re.compile(r"[\w.\-]+\.json")
_NOMINAL_GB = re.compile(r"(\d+)\s*GB")
_KV_DTYPES = ("auto", "bf16", "bfloat16", "fp16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2")
_DTYPES = ("auto", "bfloat16", "float16", "half", "float32")
# The card in llm-d-planner's gpu_catalog.json (its memory_gb is what its user types).
PLANNER_GPU = {
    "H100-SXM-80GB": "H100",
    "H100-PCIe-80GB": "H100",
    "H200-SXM-141GB": "H200",
    "H200-NVL-141GB": "H200",
    "A100-SXM-80GB": "A100-80",
    "A100-PCIe-80GB": "A100-80",
    "A100-SXM-40GB": "A100-40",
    "L4-24GB": "L4",
    "A10G-24GB": "A10G",
    "B200-180GB": "B200",
    "MI300X-192GB": "MI300X",
    "L40-48GB": "L40",
}
# aiconfigurator's systems with a perf database for vLLM/SGLang (aiconfigurator_core/systems/).
AIC_SYSTEM = {
    "H100-SXM-80GB": "h100_sxm",
    "H200-SXM-141GB": "h200_sxm",
    "A100-SXM-80GB": "a100_sxm",
    "B200-180GB": "b200_sxm",
    "L40S-48GB": "l40s",
    "RTX-PRO-6000-96GB": "rtx_pro_6000_server",
}


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _word(v: object, allowed: tuple[str, ...]) -> str | None:
    w = str(v or "").split(" ")[0].strip("'\",").lower()
    return w if w in allowed else None


@dataclass
class Case:
    """One startup as a user would state it, and what its log printed."""

    id: str
    case_set: str
    engine: str
    model: str
    config: dict[str, Any] | None
    engine_version: str | None
    card_text: str
    card: str | None  # kvwatch's catalogue name
    total_gib: float | None  # the log's total, for a card outside kvwatch's catalogue
    tp: int
    pp: int
    settings: dict[str, Any]
    observed_kv_gib: float | None
    observed_tokens: float | None
    observed_weights_gib: float | None
    started: bool
    skip: str | None
    observed_terms: dict[str, float]

    def implied_utilisation(self) -> float | None:
        """The utilisation the log's own vLLM terms add up to (weights + activation + non-torch + KV,
        + the CUDA-graph estimate from 0.20, over the card's total), where the log has them all."""
        o = self.observed_terms
        total = self.total_gib or (gpus.lookup(self.card).total_bytes / (1 << 30) if self.card else None)
        if self.engine != "vllm" or total is None or not all(k in o for k in ("weights", "activation", "kv")):
            return None
        used = o["weights"] + o["activation"] + o.get("non_torch", 0.0) + o["kv"]
        if _release(self.engine_version) >= (0, 20):
            used += o.get("cuda_graphs", 0.0)
        return used / total

    @property
    def consistent(self) -> bool:
        """False where the recorded utilisation is not the run's: the log's terms add up to another
        (a transcription's recipe value; bench/bench_accuracy.py leaves these out of its headline)."""
        implied, util = self.implied_utilisation(), _num(self.settings.get("gpu_memory_utilization"))
        return implied is None or util is None or abs(implied - util) < 0.005

    @property
    def fraction(self) -> float | None:
        """vLLM's utilisation (the recorded one, else the release's default: 0.90 up to 0.19, 0.92
        from 0.20, docs/predict.md) or SGLang's mem_fraction_static where the case records it."""
        s = self.settings
        if self.engine == "sglang":
            return _num(s.get("mem_fraction_static"))
        util = _num(s.get("gpu_memory_utilization"))
        if util is None:
            util = 0.92 if _release(self.engine_version) >= (0, 20) else 0.9
        return util

    @property
    def slug(self) -> str:
        return re.sub(r"[^\w.-]", "_", f"{self.case_set}-{self.id}")

    def write_config(self, workdir: Path) -> Path:
        folder = workdir / self.slug
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "config.json"
        path.write_text(json.dumps(self.config), encoding="utf-8")
        return path

    def kvwatch_args(self) -> list[str]:
        s = self.settings
        args = ["--engine", self.engine, "--tp", str(self.tp), "--pp", str(self.pp)]
        if self.engine_version:
            args += ["--engine-version", self.engine_version]
        if self.card:
            args += ["--gpu", self.card]
        elif self.total_gib:
            args += ["--gpu-memory", f"{int(self.total_gib * (1 << 30))}"]
        if self.engine == "vllm":
            if (n := _int(s.get("max_model_len"))) is not None:
                args += ["--max-model-len", str(n)]
            if (u := _num(s.get("gpu_memory_utilization"))) is not None:
                args += ["--gpu-memory-utilization", str(u)]
            # kvwatch's own --speculative-config, read from the record as make accuracy reads it.
            typed = typed_speculative(s)
            if typed and typed.get("method"):
                args += ["--speculative-config", json.dumps(typed)]
            # An install without FlashInfer, as the case records it and make accuracy passes it.
            if s.get("flashinfer_sampler") is False:
                args.append("--no-flashinfer")
        return args

    def engine_flags(self) -> list[str]:
        """The engine's own flags for what the user set (``kvwatch predict ... -- FLAGS``)."""
        s, out = self.settings, []
        kv = _word(s.get("kv_cache_dtype"), _KV_DTYPES)
        if kv and kv != "auto":
            out += ["--kv-cache-dtype", kv]
        if self.engine == "vllm":
            for key in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
                if (n := _int(user_setting(s, key))) is not None:
                    out += [f"--{key.replace('_', '-')}", str(n)]
            if s.get("enforce_eager") is True:
                out.append("--enforce-eager")
            if self.runtime_fp8:
                out += ["--quantization", "fp8"]
            if (d := _word(s.get("dtype"), _DTYPES)) is not None and d != "auto":
                out += ["--dtype", d]
            # What the user typed that serves a VL checkpoint as text or as a pooler, and the drafter.
            if s.get("language_model_only") is True:
                out.append("--language-model-only")
            if isinstance(s.get("limit_mm_per_prompt"), dict):
                out += ["--limit-mm-per-prompt", json.dumps(s["limit_mm_per_prompt"])]
            if s.get("runner") in ("pooling", "generate"):
                out += ["--runner", str(s["runner"])]
            return out
        if (f := _num(user_setting(s, "mem_fraction_static"))) is not None:
            out += ["--mem-fraction-static", str(f)]
        for key in ("context_length", "chunked_prefill_size", "cuda_graph_max_bs", "page_size"):
            if (n := _int(user_setting(s, key))) is not None:
                out += [f"--{key.replace('_', '-')}", str(n)]
        if s.get("disable_cuda_graph") is True:
            out.append("--disable-cuda-graph")
        # DP attention as the peers get it (peer_request's dp_attention): attention at TP / DP.
        if s.get("enable_dp_attention") is True and (n := _int(s.get("dp_size"))) is not None:
            out += ["--enable-dp-attention", "--dp-size", str(n)]
        return out

    @property
    def runtime_fp8(self) -> bool:
        q = str(user_setting(self.settings, "quantization") or "").lower()
        return q.startswith("fp8") and "checkpoint" not in q

    @property
    def nominal_gb(self) -> int | None:
        """The card's size as its user names it (the '80GB' of 'H100-SXM-80GB')."""
        for text in (self.card or "", self.card_text):
            if m := _NOMINAL_GB.search(text):
                return int(m.group(1))
        return None

    def peer_request(self, workdir: Path) -> dict[str, Any]:
        """What the peers' drivers get: the same config.json and settings, the card in their terms."""
        s = self.settings
        path = self.write_config(workdir)
        batched = _int(s.get("max_num_batched_tokens")) or _int(s.get("chunked_prefill_size"))
        nominal = self.nominal_gb
        if batched is None and self.engine == "vllm":
            # vLLM's own default (arg_utils.py): 8192 on cards of 70 GiB and more, else 2048.
            batched = 8192 if (nominal or 0) >= 70 else 2048
        weights_total = None
        if self.engine == "vllm" and self.observed_weights_gib is not None:
            weights_total = self.observed_weights_gib * self.tp * self.pp
        return {
            "id": self.id,
            "engine": self.engine,
            "config_dir": str(path.parent),
            "config": self.config,
            "tp": self.tp,
            "pp": self.pp,
            "dp_attention": _int(s.get("dp_size")) if s.get("enable_dp_attention") is True else None,
            "max_model_len": _int(s.get("max_model_len")) or _int(s.get("context_length")),
            "fraction": self.fraction,
            "max_num_tokens": batched or 8192,
            "max_num_seqs": _int(s.get("max_num_seqs")) or _int(s.get("max_running_requests")) or 256,
            "kv_fp8": (_word(s.get("kv_cache_dtype"), _KV_DTYPES) or "auto").startswith("fp8"),
            "runtime_fp8": self.runtime_fp8,
            "planner_gpu": PLANNER_GPU.get(self.card or ""),
            "nominal_gb": nominal,
            "aic_system": AIC_SYSTEM.get(self.card or ""),
            "weights_total_gib": weights_total,
        }


def _release(version: str | None) -> tuple[int, int]:
    """(major, minor) of a release; the newest when none is named (kvwatch's own default)."""
    if version is None:
        return (99, 0)
    major, minor = version.split(".")[:2]
    return (int(major), int(minor))


def _version(c: dict[str, Any]) -> str | None:
    raw = c.get("engine_version")
    if isinstance(raw, str) and (m := _VERSION.search(raw)):
        return m.group(1)
    if m := _ID_VERSION.search(str(c["id"])):
        text = m.group(1)
        return text if "." in text else ".".join(text)
    if m := _VERSION.search(str(c.get("release_bucket_inferred") or "")):
        return m.group(1)
    return UNNAMED_RELEASE if "llm-d-benchmark" in str(c.get("source_url")) else None


def _card(text: str) -> str | None:
    head = re.sub(r"\(.*?\)", " ", text.rsplit(" x", 1)[0] if " x" in text else text)
    words = [
        w for w in re.split(r"[\s,]+", head) if w and w.lower() not in ("nvidia", "tesla", "geforce", "dgx")
    ]
    for n in range(len(words), 0, -1):
        spec = gpus.find("-".join(words[:n])) or gpus.find("".join(words[:n]))
        if spec is not None:
            return spec.name
    return None


def _record(c: dict[str, Any], case_set: str, config_dirs: tuple[Path, ...]) -> Case:
    o, s = c.get("observed") or {}, c.get("settings") or {}
    engine = str(c.get("engine") or "vllm")
    skip, config = None, None
    m = _CONFIG_NAME.search(str(c.get("model_config") or ""))
    path = next((d / m.group(0) for d in config_dirs if m and (d / m.group(0)).is_file()), None)
    if m is None:
        skip = "no config.json"
    elif path is None:
        skip = f"config {m.group(0)} not at hand"
    else:
        config = json.loads(path.read_text(encoding="utf-8"))
        inner = config.get("text_config") or {}
        if "quantization_config" not in config and "quantization_config" not in inner:
            quant = checkpoint_quant(str(c["model"]), str(s.get("quantization") or ""))
            if quant is not None:
                config = copy.deepcopy(config)
                config["quantization_config"] = quant
    card = _card(str(c.get("gpu") or ""))
    if card is None and c.get("card_class"):
        card = _card(str(c["card_class"]).replace("-class", " "))
    total = _num(o.get("total_gpu_gib"))
    if card is None and total is None:
        skip = skip or "card not in kvwatch's catalogue and no total printed"
    if _int(c.get("tp")) is None:
        skip = skip or "TP not stated"
    if engine == "sglang":
        tokens = _num(o.get("kv_tokens")) or _num(o.get("max_total_num_tokens"))
        weights, kv = _num(o.get("weight_mem_usage_gib")), None
        if s.get("max_total_tokens"):
            skip = skip or "pool capped by --max-total-tokens"
        if any(str(k).startswith("kt_") for k in s):
            skip = skip or "routed experts on the CPU (ktransformers)"
    else:
        tokens, weights, kv = (
            _num(o.get("kv_cache_tokens")),
            _num(o.get("weights_gib")),
            _num(o.get("available_kv_gib")),
        )
    outcome = str(c.get("outcome") or "").lower()
    return Case(
        id=str(c["id"]),
        case_set=case_set,
        engine=engine,
        model=str(c["model"]),
        config=config,
        engine_version=_version(c),
        card_text=str(c.get("gpu") or ""),
        card=card,
        total_gib=total,
        tp=_int(c.get("tp")) or 1,
        pp=_int(c.get("pp")) or 1,
        settings=s,
        observed_kv_gib=kv,
        observed_tokens=tokens,
        observed_weights_gib=weights,
        started=outcome.startswith(("started", "pool allocated")) or "failed later" in outcome,
        skip=skip,
        observed_terms={
            k: v
            for k, key in (
                ("weights", "weights_gib"),
                ("activation", "activation_peak_gib"),
                ("non_torch", "non_torch_gib"),
                ("cuda_graphs", "cuda_graph_estimated_gib"),
                ("kv", "available_kv_gib"),
            )
            if (v := _num(o.get(key))) is not None
        },
    )


def load_all(public: Path) -> list[Case]:
    """Main and every public folder (``public/*/cases.json``, so a folder added later is run too),
    each as set ``public-FOLDER``; a case no tool can be given (no config, no card, no TP) says why
    in ``skip``. A case's engine is its own ``engine`` field, else its folder's name."""
    dirs = (*CONFIG_DIRS, public / "configs")
    cases = [_record(c, "main", dirs) for c in json.loads(MAIN.read_text(encoding="utf-8"))]
    for path in sorted(public.glob("*/cases.json")):
        folder = path.parent.name
        for c in json.loads(path.read_text(encoding="utf-8")):
            cases.append(_record({**c, "engine": c.get("engine") or folder}, f"public-{folder}", dirs))
    return cases
