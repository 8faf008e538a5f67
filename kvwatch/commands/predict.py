"""``kvwatch predict``: the KV pool an engine will allocate, worked out before launching it."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass
from typing import cast

from kvwatch.analysis.predict import predict, predict_on_cards
from kvwatch.capacity import gpus
from kvwatch.capacity.deployment import (
    MAX_GPU_MEMORY_BYTES,
    MIN_GPU_MEMORY_BYTES,
    MIN_TERM_BYTES,
    Deployment,
    DeploymentValue,
)
from kvwatch.capacity.geometry import load_model
from kvwatch.capacity.model import ModelGeometry
from kvwatch.capacity.prediction import Prediction
from kvwatch.commands.render import stacked_bar, table
from kvwatch.core.errors import ConfigError
from kvwatch.core.kinds import DEFAULT_ENGINE, ENGINE_NAMES
from kvwatch.core.units import MAX_SIZE, format_bytes, parse_size
from kvwatch.engines import registry
from kvwatch.engines.base import Engine
from kvwatch.engines.flags import FlagReading
from kvwatch.sources.hub import resolve_model_config

HELP = "predict the KV-cache pool vLLM or SGLang will allocate for a model (config.json or Hub name)"

BAR_WIDTH = 60


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def _flag_size(flag: str, text: str, minimum: int, allow_zero: bool = False) -> int:
    # (the upper bound of a term, 16 TiB per GPU, is Deployment's own check: validate)
    maximum = MAX_GPU_MEMORY_BYTES if minimum == MIN_GPU_MEMORY_BYTES else MAX_SIZE
    try:
        return parse_size(text, allow_zero=allow_zero, minimum=minimum, maximum=maximum)
    except ConfigError as exc:
        raise ConfigError(f"{flag}: {exc}") from None


def gpu_memory_size(text: str) -> int:
    """A --gpu-memory value: between 256 MiB (no smaller card serves a model) and 16 TiB."""
    return _flag_size("--gpu-memory", text, MIN_GPU_MEMORY_BYTES)


def term_size(flag: str, text: str, allow_zero: bool = False) -> int:
    """A --weights-memory / --available-kv-memory / --activation-memory value: at least 1 MiB
    (0 where allowed), at most the largest card (Deployment's check)."""
    return _flag_size(flag, text, MIN_TERM_BYTES, allow_zero)


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model_config",
        metavar="MODEL_CONFIG",
        help="config.json, a model dir, a hub-cache dir, or a Hub name ORG/NAME[@REVISION]",
    )
    parser.add_argument(
        "--engine",
        choices=ENGINE_NAMES,
        default=DEFAULT_ENGINE,
        help=f"serving engine (default {DEFAULT_ENGINE})",
    )
    parser.add_argument("--engine-version", help="engine version whose defaults apply (default: newest)")
    gpu = parser.add_mutually_exclusive_group()
    gpu.add_argument("--gpu", help="GPU name from the catalogue (h100, H100-SXM-80GB, a6000-ecc-off, ...)")
    gpu.add_argument(
        "--gpu-memory", metavar="SIZE", help="GPU memory as the driver reports it (81559MiB, 80GB, bytes)"
    )
    parser.add_argument("--tp", type=_positive_int, default=1, help="tensor parallel size")
    parser.add_argument("--pp", type=_positive_int, default=1, help="pipeline parallel size")
    parser.add_argument("--dcp", type=_positive_int, default=1, help="decode context parallel size")
    parser.add_argument("--kv-cache-dtype", default="auto", help="auto, bf16, fp16, fp8, fp8_e4m3, fp8_e5m2")
    parser.add_argument(
        "--block-size", type=_positive_int, help="vLLM block size / SGLang page size (tokens)"
    )
    parser.add_argument(
        "--max-model-len", type=_positive_int, help="context length (default: from config.json)"
    )
    parser.add_argument("--max-num-batched-tokens", type=_positive_int, help="vLLM chunked-prefill budget")
    parser.add_argument("--gpu-memory-utilization", type=_fraction, help="vLLM fraction of GPU memory")
    parser.add_argument("--mem-fraction-static", type=_fraction, help="SGLang static memory fraction")
    parser.add_argument(
        "--weights-dtype", help="override the checkpoint: bf16, fp16, fp8, int8, int4, awq, gptq, mxfp4"
    )
    parser.add_argument(
        "--weights-memory", metavar="SIZE", help="measured weights per GPU (skips the estimate)"
    )
    parser.add_argument(
        "--activation-memory", metavar="SIZE", help="activation peak + non-torch + CUDA graphs per GPU"
    )
    parser.add_argument(
        "--available-kv-memory",
        metavar="SIZE",
        help="the engine's own KV budget per GPU ('Available KV cache memory'); skips the subtraction",
    )
    parser.add_argument(
        "--gpu-memory-in-use",
        metavar="SIZE",
        help="memory other processes hold on each GPU before launch (nvidia-smi's Memory-Usage): a desktop, another server",
    )
    parser.add_argument(
        "--disable-hybrid-kv-cache-manager", action="store_true", help="vLLM: treat sliding layers as full"
    )
    parser.add_argument(
        "--no-flashinfer",
        action="store_true",
        help="vLLM 0.8-0.11.0 without FlashInfer (the log's 'FlashInfer is not available'): the sampler sorts",
    )
    parser.add_argument(
        "--v0-engine",
        action="store_true",
        help="vLLM 0.8-0.10 started with VLLM_USE_V1=0: the V0 engine's scheduler defaults and profile run",
    )
    parser.add_argument(
        "--speculative-config",
        metavar="JSON",
        help='vLLM\'s --speculative-config as typed, e.g. \'{"method":"mtp","num_speculative_tokens":3}\': '
        "an MTP drafter's layers join the KV pool and its weights load with the model",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    # Everything after `--` (cli.main splits it off): the engine's own flags as users type them.
    parser.set_defaults(engine_flags=[], own_parser=parser)
    parser.epilog = (
        "After --, the engine's own flags as you type them (vllm serve: --tensor-parallel-size 4 "
        "--max-num-seqs 256 --enforce-eager ...; sglang.launch_server: --tp-size 8 --mem-fraction-static "
        "0.85 --context-length 65536 ...). They win over kvwatch's own flags; flags kvwatch does not "
        "model are listed as ignored."
    )


@dataclass(frozen=True)
class Request:
    """What a ``predict`` or ``plan`` command line asks: the engine, resolved once and carried down,
    the deployment, and the engine's own flags after ``--`` as read (once)."""

    engine: Engine
    deployment: Deployment
    flags: FlagReading


def engine_flags(args: argparse.Namespace, engine: Engine) -> FlagReading:
    """The engine's own flags given after ``--``, read by the engine's flag table.

    One of kvwatch's own flags there that the engine does not take (``-- ... --json``) is refused:
    read as an ignored engine flag it would do nothing, silently.
    """
    reading = engine.flags.read(getattr(args, "engine_flags", None) or [])
    parser = getattr(args, "own_parser", None)
    own = {o for a in parser._actions for o in a.option_strings} if parser is not None else set()
    for token in reading.ignored:
        name = token.split(" ", 1)[0].partition("=")[0]
        if name in own:
            raise ConfigError(
                f"{name} after '--' is read as a {engine.name} flag, which {engine.name} does not take: "
                f"put kvwatch's own flags before '--'"
            )
    return reading


def read_request(args: argparse.Namespace) -> Request:
    """Flags -> the engine, its Deployment (sizes parsed, GPU looked up, release checked) and its own
    flags after ``--``, which win over kvwatch's."""
    engine = registry.get(args.engine)
    gpu_name = None
    gpu_memory = None
    if args.gpu:
        spec = gpus.lookup(args.gpu)
        gpu_name, gpu_memory = spec.name, spec.total_bytes
    elif args.gpu_memory:
        gpu_memory = gpu_memory_size(args.gpu_memory)
    engine.check_version(args.engine_version)
    fraction_flags = engine.flags.deployment_fields(
        args.gpu_memory_utilization, args.mem_fraction_static, args.block_size
    )
    if getattr(args, "speculative_config", None) is not None:
        read_speculative = engine.flags.speculative_fields
        if read_speculative is None:
            raise ConfigError(f"--speculative-config: {engine.name}'s speculative decoding is not modelled")
        fraction_flags = {**fraction_flags, **read_speculative(args.speculative_config)}
    deployment = Deployment(
        engine=engine.name,
        engine_version=args.engine_version,
        gpu_memory_bytes=gpu_memory,
        gpu_name=gpu_name,
        tp=args.tp,
        pp=args.pp,
        dcp=args.dcp,
        kv_cache_dtype=args.kv_cache_dtype,
        max_model_len=args.max_model_len,
        weights_dtype=args.weights_dtype,
        weights_bytes=term_size("--weights-memory", args.weights_memory) if args.weights_memory else None,
        activation_bytes=(
            term_size("--activation-memory", args.activation_memory, allow_zero=True)
            if args.activation_memory
            else None
        ),
        available_kv_bytes=(
            term_size("--available-kv-memory", args.available_kv_memory) if args.available_kv_memory else None
        ),
        max_num_batched_tokens=args.max_num_batched_tokens,
        memory_in_use_bytes=(
            term_size("--gpu-memory-in-use", args.gpu_memory_in_use, allow_zero=True)
            if args.gpu_memory_in_use
            else None
        ),
        hybrid_kv_cache_manager=not args.disable_hybrid_kv_cache_manager,
        flashinfer_sampler=False if args.no_flashinfer else None,
        v0_engine=args.v0_engine,
    )
    reading = engine_flags(args, engine)
    own = {k: cast(DeploymentValue, v) for k, v in reading.fields.items()}
    return Request(engine, deployment.with_(**{**fraction_flags, **own}), reading)


def budget_bar(p: Prediction, width: int = BAR_WIDTH) -> str | None:
    """weights | activations+graphs | margin | KV pool, one character per 1/width of the card."""
    if not p.total_bytes or p.weights_bytes is None:
        return None
    overhead = (p.activation_bytes or 0) + (p.non_torch_bytes or 0) + (p.cuda_graph_bytes or 0)
    kv = max(p.available_kv_bytes, 0)
    parts = [
        ("W", p.weights_bytes),
        ("A", overhead),
        (".", max(p.total_bytes - p.weights_bytes - overhead - kv, 0)),
        ("K", kv),
    ]
    return (
        f"[{stacked_bar(parts, p.total_bytes, width)}]  W weights  A activations+graphs  . margin  K KV pool"
    )


def render(p: Prediction, engine: Engine) -> str:
    """The human table (``engine``: the prediction's, for the names of its terms)."""
    rows: list[tuple[str, str]] = [
        ("model", f"{p.model} ({p.param_count / 1e9:.2f}B params)"),
        ("engine", f"{p.engine} {p.engine_version or '(newest defaults)'}"),
        ("gpu", f"{p.gpu_name or '-'}  {format_bytes(p.total_bytes)}"),
        ("parallelism", f"tp={p.tp} pp={p.pp}" + (f" dcp={p.dcp}" if p.dcp > 1 else "")),
        ("kv cache dtype", f"{p.kv_cache_dtype} ({p.kv_elem_bytes} B/elem)"),
        (
            "bytes per token",
            f"{p.bytes_per_token:,} B per GPU ({format_bytes(p.bytes_per_token)}); "
            f"{p.bytes_per_token_all_ranks:,} B all GPUs",
        ),
    ]
    if p.usable_bytes is not None:
        # SGLang's vision factor leaves a float's tail on the fraction (0.7721792968749999): 4 places.
        shown = "" if p.fraction is None else f"{round(p.fraction, 4):g}"
        rows.append((engine.labels.fraction_label, f"{format_bytes(p.usable_bytes)} ({shown})"))
    if p.weights_bytes is not None:
        rows.append(("weights", f"{format_bytes(p.weights_bytes)} per GPU ({p.weights_scheme})"))
    if p.activation_bytes is not None:
        rows.append((engine.labels.overhead_label, format_bytes(p.activation_bytes)))
    if p.cuda_graph_bytes:
        graphs = format_bytes(p.cuda_graph_bytes)
        if p.cuda_graphs_subtracted is False:
            graphs += " (estimated; this release does not subtract it)"
        rows.append(("CUDA graphs", graphs))
    if p.non_torch_bytes:
        rows.append(("non-torch", format_bytes(p.non_torch_bytes)))
    kv = format_bytes(p.available_kv_bytes)
    if p.available_kv_band_bytes is not None:
        kv += f" ± {format_bytes(p.available_kv_band_bytes)} (modelled before launch)"
    rows.append(("available KV", kv))
    if p.not_calibrated:
        # Conditions no real startup of the calibration set covers: each widened the band.
        rows.append(("not calibrated", ", ".join(p.not_calibrated)))
    if p.kv_pool_blocks is not None:
        rows.append(
            (
                "KV blocks",
                f"{p.kv_pool_blocks:,} x {p.block_size} tokens"
                + (f" ({p.kv_groups} groups)" if p.kv_groups and p.kv_groups > 1 else ""),
            )
        )
    else:
        rows.append(("page size", f"{p.block_size} token" + ("s" if p.block_size > 1 else "")))
    rows.append(("KV pool", f"{p.kv_pool_tokens:,} tokens" + ("" if p.exact else " (estimate)")))
    if p.swa_pool_tokens is not None:
        rows.append(("sliding-window pool", f"{p.swa_pool_tokens:,} tokens"))
    rows.append(("max concurrency", f"{p.max_concurrency:.2f}x at {p.max_model_len:,} tokens"))
    verdict = "yes" if p.fits else "NO"
    if p.fits_at_band_low is False and p.available_kv_band_bytes is not None and p.needed_kv_bytes:
        low = max(p.available_kv_bytes - p.available_kv_band_bytes, 0)
        verdict += (
            f", but not at the band's low end ({format_bytes(low)} against the "
            f"{format_bytes(p.needed_kv_bytes)} one request needs): measure before relying on it"
        )
    if not p.fits and p.estimated_max_model_len:
        verdict += f" (longest that fits: {p.estimated_max_model_len:,} tokens)"
    rows.append(("fits max_model_len", verdict))
    if p.others_limit_bytes is not None:
        # A desktop, another server or a vGPU reserve on the card: how much of it this start survives.
        rows.append(
            (
                "other processes",
                f"start fails if they hold more than {format_bytes(p.others_limit_bytes)} per GPU at launch: "
                f"{p.others_limit_note}",
            )
        )
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    bar = budget_bar(p)
    if bar:
        lines += ["", bar]
    if p.failure:
        lines += ["", f"engine would fail: {p.failure}"]
    if p.assumptions:
        lines += ["", "assumptions:"] + [f"  - {a}" for a in p.assumptions]
    given = sorted(k for k, v in p.inputs.items() if v == "given")
    other = sorted(f"{k} ({v.replace('_', ' ')})" for k, v in p.inputs.items() if v != "given")
    lines.append(f"inputs given: {', '.join(given) or '-'}; not given: {', '.join(other) or '-'}")
    return "\n".join(lines)


def _flag_notes(reading: FlagReading, model_config: str) -> list[str]:
    notes = []
    if reading.ignored:
        notes.append(f"engine flags kvwatch does not model, ignored: {' '.join(reading.ignored)}")
    if reading.model is not None and reading.model != model_config:
        notes.append(f"the engine flags name the model {reading.model}; sized from {model_config}")
    return notes


def _with_flag_notes(p: Prediction, reading: FlagReading, model_config: str) -> Prediction:
    notes = _flag_notes(reading, model_config)
    return dataclasses.replace(p, assumptions=(*p.assumptions, *notes)) if notes else p


def card_table(model: ModelGeometry, base: Deployment, engine: Engine) -> list[Prediction]:
    """The prediction on every NVIDIA card of the catalogue that holds the weights, smallest first;
    ConfigError for what the engine refuses on any card (TP split, dtypes)."""
    cards = sorted((g for g in gpus.CATALOGUE if g.vendor == "nvidia"), key=lambda g: g.total_bytes)
    return predict_on_cards(model, base, cards, engine)


def render_cards(model: ModelGeometry, preds: list[Prediction]) -> str:
    """Bytes per token, weights, and the pool on each card (``predict`` without a card)."""
    if not preds:
        return "no catalogue card fits this deployment"
    first = preds[0]
    lines = [
        f"model               {first.model} ({first.param_count / 1e9:.2f}B params)",
        f"engine              {first.engine} {first.engine_version or '(newest defaults)'}",
        f"bytes per token     {first.bytes_per_token:,} B per GPU ({format_bytes(first.bytes_per_token)})",
        f"weights             {format_bytes(first.weights_bytes)} per GPU ({first.weights_scheme})",
        f"max_model_len       {first.max_model_len:,}",
        "",
        "no card given (--gpu / --gpu-memory): the pool on each card of the catalogue",
    ]
    headers = ("card", "total", "available KV", "KV pool tokens", "concurrency", "fits")
    rows = []
    for p in preds:
        kv = format_bytes(p.available_kv_bytes)
        if p.available_kv_band_bytes is not None:
            kv += f" ± {format_bytes(p.available_kv_band_bytes)}"
        rows.append(
            (
                p.gpu_name or "-",
                format_bytes(p.total_bytes),
                kv,
                f"{p.kv_pool_tokens:,}",
                f"{p.max_concurrency:.2f}x",
                "yes" if p.fits else "NO",
            )
        )
    lines.append(table(headers, rows, right=range(1, len(headers))))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    model = load_model(resolve_model_config(args.model_config))
    request = read_request(args)
    engine, deployment, reading = request.engine, request.deployment, request.flags
    if deployment.gpu_memory_bytes is None and engine.capacity.needs_gpu_memory(deployment):
        preds = [
            _with_flag_notes(p, reading, args.model_config) for p in card_table(model, deployment, engine)
        ]
        if args.json:
            json.dump({"cards": [p.to_json_dict() for p in preds]}, sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            print(render_cards(model, preds))
            # What --help promises: the engine flags kvwatch ignored, listed once for every card.
            notes = _flag_notes(reading, args.model_config)
            if notes:
                print("\n".join(["", "assumptions:", *(f"  - {n}" for n in notes)]))
        return 0
    prediction = _with_flag_notes(predict(model, deployment, engine), reading, args.model_config)
    if args.json:
        json.dump(prediction.to_json_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(render(prediction, engine))
    return 0
