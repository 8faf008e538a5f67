"""The real startups of tests/apriori, read into one shape for both engines.

Sources: ``cases.json`` and ``version-sweep/`` (vLLM, H100; the calibration set kvwatch began with)
and ``public/{vllm,sglang}/cases.json`` (startups pasted in public threads, other cards, releases,
classes; public/README.md has the provenance). Each case keeps what a user would give before launch
(the model's config.json, the card, the release, the settings the user set -- never a figure the log
printed) and the figures the log printed, and names its source: the leave-one-source-out report
holds out every case of one source at a time.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvwatch.capacity import gpus
from kvwatch.capacity.deployment import Deployment
from kvwatch.capacity.dtypes import KV_DTYPE_BYTES
from kvwatch.capacity.geometry import geometry_from_config
from kvwatch.capacity.model import ModelGeometry
from kvwatch.commands.predict import gpu_memory_size
from kvwatch.core.errors import KvwatchError
from kvwatch.core.units import GiB
from kvwatch.engines.vllm.multimodal import limits_flag

ROOT = Path(__file__).resolve().parent.parent / "tests"
APRIORI = ROOT / "apriori"
PUBLIC = APRIORI / "public"
CONFIG_DIRS = (APRIORI / "configs", PUBLIC / "configs", ROOT / "model_configs")
# The llm-d-benchmark rows name no release; their doc revision says vllm/vllm-openai:latest of
# Jan-Feb 2026, and their sampler and non-torch figures match the 0.15/0.16 sweep exactly.
UNNAMED_RELEASE = "0.15.0"

# compressed-tensors quantization_config of the RedHatAI checkpoints named in the cases.
_CT = {
    "fp8": {"num_bits": 8, "type": "float"},
    "w8a8": {"num_bits": 8, "type": "int"},
    "w4a16": {"num_bits": 4, "type": "int", "group_size": 128},
}
_VERSION = re.compile(r"(\d+\.\d+(?:\.\d+)?)")
_ID_VERSION = re.compile(r"-v(0\d{1,2}|0\.\d+(?:\.\d+)?)(?=[-.a-z]|$)")
_CONFIG_NAME = re.compile(r"[\w.\-]+\.json")


@dataclass(frozen=True)
class Case:
    """One startup: what the user set, what the log printed, where it comes from."""

    id: str
    source: str
    engine: str
    model: str
    config: dict[str, Any] | None
    engine_version: str | None
    release_named: bool
    gpu: str
    gpu_name: str | None
    gpu_total_bytes: int | None
    tp: int
    pp: int
    dp: int
    dp_attention: bool
    settings: dict[str, Any]
    # GiB (vLLM: weights, activation, non_torch, cuda_graphs, kv; SGLang: weights, pre_load) and tokens.
    observed: dict[str, float]
    started: bool
    kv_connector: str | None = None
    skip: str | None = None  # why the case cannot be predicted (no config, card unknown, ...)
    # A failed start whose recorded error is not a memory failure (a kernel's TypeError): nothing
    # kvwatch sizes can predict it; the report names it instead of counting it.
    other_failure: str | None = None
    # The tokens observed are the figure V0's error prints ('maximum number of tokens that can be
    # stored in KV cache'): its own check's, one PP virtual engine's blocks from 0.8, not the pool.
    kv_tokens_from_v0_error: bool = False

    def geometry(self) -> ModelGeometry:
        """The model's geometry, read from the config once per case (every fold of the
        leave-one-source-out run asks again; the case and the geometry are frozen)."""
        known = self.__dict__.get("_geometry")
        if known is None:
            assert self.config is not None
            known = geometry_from_config(self.config, name=self.model)
            self.__dict__["_geometry"] = known  # not a field: equality, repr and fields() skip it
        assert isinstance(known, ModelGeometry)
        return known


def checkpoint_quant(model: str, setting: str) -> dict[str, Any] | None:
    """The quantization_config a quantised checkpoint's own config.json carries, from the case's
    checkpoint name and the quantisation its settings record, for a case whose config.json is the
    base model's (what a user predicting from the checkpoint's config gets)."""
    name, text = model.lower(), setting.lower()
    if "runtime" in text or "online" in text:
        return None
    ct = "redhat" in name or "compressed-tensors" in text or "wna16" in text
    if "nvfp4" in name or "nvfp4" in text or "modelopt" in text:
        if ct:
            return {
                "quant_method": "compressed-tensors",
                "config_groups": {"g": {"weights": {"num_bits": 4, "type": "float", "group_size": 16}}},
            }
        return {"quant_method": "modelopt", "quant_algo": "NVFP4"}
    for key in ("w4a16", "w8a8", "fp8"):
        if ct and (key in name or (key == "w4a16" and ("int4" in name or "wna16" in text))):
            return {"quant_method": "compressed-tensors", "config_groups": {"group_0": {"weights": _CT[key]}}}
    if "gptq" in name or "gptq" in text:
        return {"quant_method": "gptq", "bits": 8 if "int8" in name else 4, "group_size": 128}
    if "awq" in name or "awq" in text:
        return {"quant_method": "awq", "bits": 4, "group_size": 128}
    if "autoround" in name or "auto_round" in text or "auto-round" in text:
        return {"quant_method": "auto-round", "bits": 4, "group_size": 128}
    if "bnb-4bit" in name or "bitsandbytes" in text:
        return {"quant_method": "bitsandbytes", "load_in_4bit": True}
    if "mxfp4" in name or "mxfp4" in text:
        return {"quant_method": "mxfp4"}
    if "fp8" in name or ("fp8" in text and "checkpoint" in text):
        return {"quant_method": "fp8"}
    return None


def find_config(name: str) -> Path | None:
    for folder in CONFIG_DIRS:
        if (folder / name).is_file():
            return folder / name
    return None


def load_config(name: str, model: str, quantization: str = "", kv_algo: str | None = None) -> dict[str, Any]:
    """The config a user predicting the checkpoint reads; ``kv_algo`` is the checkpoint's own ModelOpt
    KV quantisation where the case records it (settings' checkpoint_kv_cache_quant_algo, from its
    hf_quant_config.json), added to the quantization_config built for the checkpoint."""
    path = find_config(name)
    if path is None:
        raise FileNotFoundError(name)
    raw: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    has_quant = "quantization_config" in raw or "quantization_config" in (raw.get("text_config") or {})
    quant = None if has_quant else checkpoint_quant(model, quantization)
    if quant is not None and kv_algo and quant.get("quant_method") == "modelopt":
        quant["kv_cache_quant_algo"] = kv_algo
    if quant is not None:
        # The base model's config stands in for the checkpoint's, which carries this.
        raw = copy.deepcopy(raw)
        raw["quantization_config"] = quant
    return raw


def user_setting(settings: dict[str, Any], key: str) -> Any:
    """A setting the user gave (not one the case records as the engine's default). A source that
    opens with 'user' is the user's, whatever it quotes ('Shared defaults for every sweep')."""
    source = str(settings.get(f"{key}_source", ""))
    if "default" in source and not source.lower().startswith("user"):
        return None
    return settings.get(key)


def _version(raw: object, case_id: str) -> tuple[str | None, bool]:
    """The release a case names (its field, else its id's '-v0.6.4'), and whether it was named."""
    if isinstance(raw, str) and (m := _VERSION.search(raw)):
        return m.group(1), True
    m = _ID_VERSION.search(case_id)
    if m:
        text = m.group(1)
        if "." not in text:  # 'v047' -> 0.4.7
            text = ".".join(text)
        return text, True
    return None, False


def _card(text: str, total_gib: float | None) -> tuple[str | None, int | None, str | None]:
    """(catalogue name, total bytes, why not) for a case's card text ('RTX 3090 (24GB) x1')."""
    head = re.sub(r"\(.*?\)", " ", text.rsplit(" x", 1)[0] if " x" in text else text)
    words = [
        w for w in re.split(r"[\s,]+", head) if w and w.lower() not in ("nvidia", "tesla", "geforce", "dgx")
    ]
    card = None
    for n in range(len(words), 0, -1):
        card = gpus.find("-".join(words[:n])) or gpus.find("".join(words[:n]))
        if card is not None:
            break
    if card is not None:
        return card.name, card.total_bytes, None
    if total_gib:
        return None, int(total_gib * GiB), None
    return None, None, f"card {text!r} not in the catalogue and no total printed"


def source_of(url: str) -> str:
    """The thread or repository a case comes from: cases of one thread are one source."""
    m = re.search(r"github\.com/([\w.\-]+/[\w.\-]+)/(?:issues|pull|discussions)/(\d+)", url)
    if m:
        return f"{m.group(1)}#{m.group(2)}"
    m = re.search(r"github\.com/([\w.\-]+/[\w.\-]+)", url)
    if m:
        return m.group(1)
    m = re.search(r"https?://([^/\s]+)(/[^\s#?]*)?", url)
    return (m.group(1) + (m.group(2) or "")).rstrip("/") if m else url


# The memory failures the engines print: vLLM's two KV checks and its free-memory check, SGLang's
# 'Not enough memory' and its negative profiled pool, and a CUDA/HIP out-of-memory anywhere.
_MEMORY_FAILURE = re.compile(r"max seq len|KV cache|memory|profiled value|OOM", re.IGNORECASE)


def other_failure(error: object) -> str | None:
    """The recorded error of a failed start when it is an exception other than a memory failure;
    None for a memory failure or an error the excerpt does not show."""
    text = str(error or "")
    if not re.search(r"\w+(?:Error|Exception)\b", text) or _MEMORY_FAILURE.search(text):
        return None
    return text[:100]


def _failure_not_sizing(c: dict[str, Any]) -> str | None:
    """Why a failed start is not a sizing failure kvwatch must call, or None when it is one.

    A recorded exception other than a memory failure is one reason; the SGLang scoring's
    ``failed_unknown`` is the other: the source shows no error at all, so nothing says the start
    failed for memory (sglang#3416: the maintainer calls it environmental and the same deployment
    started from the docker image; sglang#14700: the error after weight loading is not in the
    excerpt). Both reports then judge one set of failures. A third: the source says the same
    deployment fails only some of the time (``scoring.intermittent``, its words quoted): the outcome
    is not a function of anything kvwatch is given (sglang PR#39713's CI workers, whose prefill-graph
    capture ran out of memory on some runs and started on others)."""
    scoring = c.get("scoring") or {}
    if scoring.get("outcome") == "failed_unknown":
        return f"cause not recorded: {str(scoring.get('outcome_note') or 'the error is not in the source')[:100]}"
    if isinstance(scoring.get("intermittent"), str) and scoring["intermittent"].strip():
        return f"intermittent per the source: {scoring['intermittent'][:100]}"
    return other_failure(c.get("error"))


def _int(value: object, default: int = 1) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default


def _started(outcome: str) -> bool:
    text = outcome.lower()
    return text.startswith(("started", "pool allocated")) or "failed later" in text


def _pre_load(o: dict[str, Any]) -> float | None:
    """SGLang's free memory before weights: 'Load weight begin. avail mem', else 'Load weight end'
    avail + its mem usage, which SGLang prints as the difference of the two probes (0.4.3.post4
    model_executor/model_runner.py:319-395)."""
    begin = o.get("load_weight_begin_avail_gib")
    if isinstance(begin, int | float):
        return float(begin)
    end, usage = o.get("load_weight_end_avail_gib"), o.get("weight_mem_usage_gib")
    if isinstance(end, int | float) and isinstance(usage, int | float):
        return round(float(end) + float(usage), 2)
    return None


def _from_record(c: dict[str, Any], source: str) -> Case:
    o = c.get("observed") or {}
    s = c.get("settings") or {}
    engine = str(c.get("engine") or "vllm")
    version, named = _version(c.get("engine_version"), str(c["id"]))
    if not named and source == "llm-d/llm-d-benchmark":
        version = UNNAMED_RELEASE
    scored = (c.get("scoring") or {}).get("engine_version")
    if not named and isinstance(scored, str) and (m := _VERSION.search(scored)):
        # The SGLang scoring's release, resolved with its source (a PR branch, a matched file:line):
        # both reports predict one release for the case.
        version = m.group(1)
    elif not named and (m := _VERSION.search(str(c.get("release_bucket_inferred") or ""))):
        # The gatherer's reading of the log's wording or date: what the user would know.
        version = m.group(1)
    skip = None
    config = None
    name_match = _CONFIG_NAME.search(str(c.get("model_config") or ""))
    excluded = (c.get("scoring") or {}).get("excluded")
    if name_match is None:
        skip = "no config.json"
    elif "sibling" in str(c.get("model_config")):
        # The gatherer's note names the file a sibling of another size (gpt-oss-120b's for a 20b):
        # not this model's layers or experts.
        skip = "config.json is a sibling model's, not this one's"
    elif excluded:
        # SGLang's scoring (bench/accuracy_sglang.py) leaves the case out for this reason; both
        # reports judge one set.
        skip = f"excluded by the SGLang scoring: {str(excluded)[:80]}"
    if skip is None and name_match is not None:
        try:
            config = load_config(
                name_match.group(0),
                str(c["model"]),
                str(s.get("quantization") or ""),
                s.get("checkpoint_kv_cache_quant_algo"),
            )
        except FileNotFoundError:
            skip = f"config {name_match.group(0)} not at hand"
    gpu_name, total, why = _card(str(c.get("gpu") or ""), o.get("total_gpu_gib"))
    if gpu_name is None and c.get("card_class"):
        # The gatherer's normalised card ('H200 (inferred)', 'MI300X-class'): what the user knows.
        alt = _card(str(c["card_class"]).replace("-class", " "), None)
        if alt[0] is not None:
            gpu_name, total, why = alt
    scoring = c.get("scoring") or {}
    if gpu_name is None and total is None and not scoring.get("excluded"):
        # The card the SGLang scoring block gives the user (a catalogue name, or the size the log
        # printed, with its source): both reports predict one card for the case.
        if scoring.get("gpu") and (spec := gpus.find(str(scoring["gpu"]))) is not None:
            gpu_name, total, why = spec.name, spec.total_bytes, None
        elif scoring.get("gpu_memory"):
            gpu_name, total, why = None, gpu_memory_size(str(scoring["gpu_memory"])), None
    skip = skip or why
    tp = c.get("tp")
    if not isinstance(tp, int):
        skip = skip or "TP not stated"
    if engine == "vllm":
        observed = {
            "weights": o.get("weights_gib"),
            "activation": o.get("activation_peak_gib"),
            "non_torch": o.get("non_torch_gib"),
            "cuda_graphs": o.get("cuda_graph_estimated_gib"),
            "kv": o.get("available_kv_gib"),
            # The pool in tokens where the log printed no budget (V0's error, 'GPU KV cache size').
            "kv_tokens": None
            if o.get("available_kv_gib") is not None
            else (o.get("kv_cache_tokens") or o.get("kv_capacity_tokens_in_error")),
        }

    else:
        # The full-attention pool of a hybrid SWA model is the one kvwatch sizes in tokens.
        tokens = o.get("swa_full_layer_tokens") or o.get("kv_tokens") or o.get("max_total_num_tokens")
        observed = {
            "weights": o.get("weight_mem_usage_gib"),
            "kv_tokens": tokens,
            "pre_load": _pre_load(o),
        }
        if s.get("max_total_tokens") and _started(str(c.get("outcome") or "")):
            # A cap hides the pool a start sized; a failed start is judged on whether the sized
            # pool holds anything, which the cap does not change (bench/accuracy_sglang.py counts
            # it too: both reports judge one set).
            skip = skip or "pool capped by --max-total-tokens"
        if any(str(k).startswith("kt_") for k in s) or "kt-cpu-offload" in (c.get("classes") or []):
            skip = skip or "routed experts on the CPU (ktransformers): not modelled"
    transfer = s.get("kv_transfer_config") or s.get("kv_connector") or s.get("disaggregation_mode")
    return Case(
        id=str(c["id"]),
        source=source,
        engine=engine,
        model=str(c["model"]),
        config=config,
        engine_version=version,
        release_named=named,
        gpu=str(c.get("gpu") or ""),
        gpu_name=gpu_name,
        gpu_total_bytes=total,
        tp=_int(tp),
        pp=_int(c.get("pp")),
        dp=_int(c.get("dp") or s.get("dp_size") or s.get("data_parallel_size")),
        dp_attention=bool(s.get("enable_dp_attention")),
        settings=s,
        observed={
            k: float(v) for k, v in observed.items() if isinstance(v, int | float) and not isinstance(v, bool)
        },
        started=_started(str(c.get("outcome") or "")),
        other_failure=None if _started(str(c.get("outcome") or "")) else _failure_not_sizing(c),
        kv_connector=str(transfer) if transfer else None,
        skip=skip,
        kv_tokens_from_v0_error=engine == "vllm"
        and o.get("available_kv_gib") is None
        and not o.get("kv_cache_tokens")
        and bool(o.get("kv_capacity_tokens_in_error")),
    )


def load_cases() -> list[Case]:
    """Every case of tests/apriori, both engines (a case that cannot be predicted says why in ``skip``)."""
    cases: list[Case] = []
    for c in json.loads((APRIORI / "cases.json").read_text(encoding="utf-8")):
        url = str(c["source_url"])
        source = "llm-d-incubation/llm-d-planner" if "llm-d-planner" in url else source_of(url)
        cases.append(_from_record(c, source))
    for path in sorted((APRIORI / "version-sweep").glob("*.json")):
        d = json.loads(path.read_text(encoding="utf-8"))
        args = d["vllm_args"]
        release = path.name.split("vllm-v0-")[1].split("--")[0].replace("-", ".")
        cases.append(
            Case(
                id=f"sweep-{path.stem}",
                source="release-sweep",
                engine="vllm",
                model=d["model"],
                config=load_config("Qwen--Qwen3-14B.json", d["model"]),
                engine_version=f"0.{release}",
                release_named=True,
                gpu=d["gpu"],
                gpu_name=gpus.lookup(d["gpu"]).name,
                gpu_total_bytes=gpus.lookup(d["gpu"]).total_bytes,
                tp=args["tensor_parallel_size"],
                pp=args["pipeline_parallel_size"],
                dp=1,
                dp_attention=False,
                settings={k: args[k] for k in ("gpu_memory_utilization", "max_model_len")},
                observed={
                    "weights": d["weight_memory_gib"],
                    "activation": d["activation_memory_gib"],
                    "non_torch": d["non_torch_forward_memory_gib"],
                    "kv": d["kv_cache_memory_gib"],
                },
                started=True,
            )
        )
    for path in public_case_files():
        for c in json.loads(path.read_text(encoding="utf-8")):
            # A folder named after its engine (vllm/, sglang/) holds that engine's startups; any other
            # folder (sglang-repos/) names the engine in each case.
            engine = path.parent.name if path.parent.name in ENGINE_FOLDERS else str(c["engine"])
            cases.append(
                _from_record({**c, "engine": engine}, source_of(str(c.get("source_url") or c["id"])))
            )
    return cases


# The public folders named after the engine whose startups they hold.
ENGINE_FOLDERS = ("vllm", "sglang")


def public_case_files() -> list[Path]:
    """Every tests/apriori/public/*/cases.json, engine folders first (their order fixes the reports')."""
    named = [PUBLIC / e / "cases.json" for e in ENGINE_FOLDERS]
    others = sorted(p for p in PUBLIC.glob("*/cases.json") if p not in named)
    return [p for p in named if p.is_file()] + others


def deployment(case: Case) -> Deployment:
    """The case as a user would give it to ``kvwatch predict``."""
    s = case.settings
    quantization = str(user_setting(s, "quantization") or "")
    # Free text in the public cases ('auto (log: torch.bfloat16)'): the value the user gave.
    kv_dtype = str(s.get("kv_cache_dtype") or "auto").split(" ")[0].strip("'\",").lower() or "auto"
    if kv_dtype not in KV_DTYPE_BYTES:
        kv_dtype = "auto"
    common: dict[str, Any] = {
        "engine_version": case.engine_version,
        "gpu_memory_bytes": case.gpu_total_bytes,
        "gpu_name": case.gpu_name,
        "tp": case.tp,
        "pp": case.pp,
        "dp": case.dp,
        "dp_attention": case.dp_attention,
        "kv_connector": case.kv_connector,
        "kv_cache_dtype": kv_dtype,
        "memory_in_use_bytes": _memory_in_use(s),
    }
    if case.engine == "sglang":
        return Deployment(
            engine="sglang",
            max_model_len=user_setting(s, "context_length"),
            mem_fraction_static=user_setting(s, "mem_fraction_static"),
            chunked_prefill_size=user_setting(s, "chunked_prefill_size"),
            cuda_graph_max_bs=user_setting(s, "cuda_graph_max_bs"),
            page_size=user_setting(s, "page_size"),
            **common,
        )
    return Deployment(
        engine="vllm",
        max_model_len=s.get("max_model_len"),
        gpu_memory_utilization=s.get("gpu_memory_utilization"),
        max_num_seqs=user_setting(s, "max_num_seqs"),
        max_num_batched_tokens=user_setting(s, "max_num_batched_tokens"),
        enforce_eager=s.get("enforce_eager"),
        enable_prefix_caching=s.get("enable_prefix_caching")
        if isinstance(s.get("enable_prefix_caching"), bool)
        else None,
        language_model_only=s.get("language_model_only") is True or None,
        # --limit-mm-per-prompt as the args line printed it (every modality at 0: served as text).
        mm_limits=limits_flag(json.dumps(s["limit_mm_per_prompt"]))
        if isinstance(s.get("limit_mm_per_prompt"), dict)
        else None,
        skip_mm_profiling=s.get("skip_mm_profiling") is True or None,
        runner="pooling" if s.get("runner") == "pooling" else None,
        dtype=s.get("dtype") if isinstance(s.get("dtype"), str) else None,
        # --quantization fp8 on a 16-bit checkpoint (online); a checkpoint's own scheme is in its config.
        quantization="fp8" if quantization.startswith("fp8") and "checkpoint" not in quantization else None,
        block_size=user_setting(s, "block_size"),
        # The log's 'FlashInfer is not available' (vLLM 0.8-0.11.0): the profile's sampler sorts.
        flashinfer_sampler=False if s.get("flashinfer_sampler") is False else None,
        # VLLM_USE_V1=0 in the engine's environment (a launcher's or the user's): the V0 engine.
        v0_engine=s.get("vllm_use_v1") == 0,
        # The checkpoint's preprocessor_config.json max_pixels, where the case quotes it.
        image_max_pixels=s.get("image_max_pixels") if isinstance(s.get("image_max_pixels"), int) else None,
        **_speculative(s),
        **common,
    )


def _memory_in_use(settings: dict[str, Any]) -> int | None:
    """What other processes held on the card before launch, as ``--gpu-memory-in-use`` takes it:
    only a figure the source states (nvidia-smi before starting, the user's own words), so only with
    its ``gpu_memory_in_use_source`` quote. Never the engine's own free-memory line: that is the
    outcome being predicted, not something the user knew."""
    gib = settings.get("gpu_memory_in_use_gib")
    source = settings.get("gpu_memory_in_use_source")
    if isinstance(gib, bool) or not isinstance(gib, int | float) or gib < 0:
        return None
    if not isinstance(source, str) or not source.strip():
        return None
    return int(gib * GiB)


def typed_speculative(settings: dict[str, Any]) -> dict[str, Any] | None:
    """The --speculative-config the user typed, as kvwatch reads it: its method and, where the record
    gives a number, its token count (as recorded from the log's non-default args); None where the
    case records none. Both benches pass it on from here."""
    spec = settings.get("speculative_config")
    if not isinstance(spec, dict):
        return None
    method, tokens = spec.get("method"), spec.get("num_speculative_tokens")
    typed: dict[str, Any] = {"method": str(method)} if method else {}
    if isinstance(tokens, int) and not isinstance(tokens, bool):
        typed["num_speculative_tokens"] = tokens
    return typed


def _speculative(settings: dict[str, Any]) -> dict[str, Any]:
    """The typed --speculative-config as Deployment fields; nothing where the case records none."""
    typed = typed_speculative(settings)
    if typed is None:
        return {}
    return {
        "speculative_method": typed.get("method"),
        "num_speculative_tokens": typed.get("num_speculative_tokens"),
    }


def predictable(case: Case) -> bool:
    """Whether kvwatch can predict the case (a config, a card, and a layout it models)."""
    if case.skip is not None:
        return False
    try:
        case.geometry()
    except KvwatchError:
        return False
    return True
