"""Sidecar settings: one validated pydantic model built from flags, KVWATCH_* variables and a YAML file.

Precedence is flags > environment > file, key by key: a value given on the command line replaces the
same key from the environment, which replaces the file's. Everything is validated once, at startup;
any problem becomes a one-line ``ConfigError`` (the CLI turns it into exit code 2), never a traceback
from a running sidecar.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from kvwatch.capacity.deployment import MAX_GPU_MEMORY_BYTES, MIN_GPU_MEMORY_BYTES
from kvwatch.core.errors import ConfigError, KvwatchError
from kvwatch.core.kinds import EngineChoice
from kvwatch.core.units import parse_size
from kvwatch.sources.hub import parse_repo_spec, resolve_model_config

# 9477: not 9400 (DCGM exporter), not in the Prometheus default-port allocation list's busy range
# near 9100 (node), 9090 (Prometheus) or 9093/9094 (Alertmanager); deployment files use it too.
DEFAULT_PORT = 9477
ENV_PREFIX = "KVWATCH_"

# Source names become the `source` label: short, bounded, no free text.
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,62}$")
_NAME_PREFIX = re.compile(r"^(?P<name>[A-Za-z0-9_][A-Za-z0-9_.:-]{0,62})=(?P<rest>.+)$")
_SANITIZE = re.compile(r"[^A-Za-z0-9_.:-]+")


class LogSource(BaseModel):
    """A log to tail: a path, a glob of per-rank files, or '-' for standard input."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    path: str


class MetricsSource(BaseModel):
    """An engine /metrics endpoint to scrape."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    url: str


class ListenAddress(BaseModel):
    """HOST:PORT the sidecar serves /metrics on."""

    model_config = ConfigDict(frozen=True)

    host: str
    port: int = Field(ge=0, le=65535)

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def _split_named(text: str) -> tuple[str | None, str]:
    """'NAME=VALUE' -> (NAME, VALUE); a plain path or URL -> (None, text)."""
    m = _NAME_PREFIX.match(text)
    if m is None or "/" in m.group("name"):
        return None, text
    return m.group("name"), m.group("rest")


def _default_log_name(path: str) -> str:
    """A label-safe name from a log path: its stem, or its folder when the file part is a glob."""
    if path == "-":
        return "stdin"
    p = Path(path)
    part = p.stem if not any(c in p.name for c in "*?[") else p.parent.name
    while any(c in part for c in "*?[") and part:
        p = p.parent
        part = p.parent.name
    name = _SANITIZE.sub("_", part).strip("_.:-")
    return name[:63] or "log"


def _check_url(given: str, url: str) -> None:
    """Refuse at start what no scrape can reach: no host, a port that is no port, or a bare word
    ('notaurl': no port, no dot, not localhost), which is a typo far more often than a host."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"not a URL: {given!r} ({exc})") from None
    host = parts.hostname or ""
    if not host:
        raise ValueError(f"no host in {given!r} (give HOST:PORT or http://HOST:PORT/metrics)")
    bare = "." not in host and ":" not in host and host != "localhost"
    if port is None and bare:
        raise ValueError(
            f"{given!r} names no port and its host {host!r} no domain: give HOST:PORT "
            "(vllm:8000) or a full URL (http://vllm.ns.svc:8000/metrics)"
        )


def _default_url_name(url: str) -> str:
    """A label-safe name from a URL: its host and port."""
    rest = url.split("://", 1)[-1]
    host = rest.split("/", 1)[0].rsplit("@", 1)[-1]
    name = _SANITIZE.sub("_", host).strip("_.:-")
    return name[:63] or "metrics"


def _as_list(value: Any, key: str) -> list[Any]:
    """A YAML/env list: a list, a comma-separated string, or a NAME -> VALUE mapping."""
    if value is None:
        return []
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, Mapping):
        return [f"{k}={v}" for k, v in value.items()]
    if isinstance(value, list):
        return value
    raise ValueError(f"{key} must be a list, a mapping NAME: VALUE or a comma-separated string")


def _resolve_model(spec: str) -> str:
    """A Hub name (ORG/NAME[@REVISION]) that is not a local path -> its config.json, from the cache or
    the Hub (kvwatch.sources.hub); a path is kept as it is (the sidecar checks it exists)."""
    if Path(spec).expanduser().exists() or parse_repo_spec(spec) is None:
        return spec
    try:
        return str(resolve_model_config(spec))
    except KvwatchError as exc:
        raise ValueError(str(exc)) from None


class Settings(BaseModel):
    """Everything `kvwatch run` needs, validated."""

    model_config = ConfigDict(frozen=True, extra="forbid", protected_namespaces=())

    log: tuple[LogSource, ...] = ()
    metrics_url: tuple[MetricsSource, ...] = ()
    # Source name ('' = every source without its own) -> model config.json, file or folder.
    model_config_path: dict[str, Path] = Field(default_factory=dict, alias="model_config")
    # Node mode: the kubelet's container log root (/var/log/pods), and which containers to follow
    # there, as NAMESPACE/POD/CONTAINER globs (kvwatch/sidecar/node.py).
    node_logs: Path | None = None
    include: tuple[str, ...] = ("*/*/*",)
    exclude: tuple[str, ...] = ()
    max_containers: int = Field(default=128, ge=1, le=4096)
    # Seconds a deleted pod's instances are still exported (their last figures), then forgotten.
    pod_expiry: float = Field(default=30.0, ge=0, le=86_400)
    engine: EngineChoice = "auto"
    gpu: str | None = None
    gpu_memory: int | None = None
    listen: ListenAddress = ListenAddress(host="0.0.0.0", port=DEFAULT_PORT)
    web_config: Path | None = None
    state_dir: Path | None = None
    scrape_interval: float = Field(default=5.0, gt=0, le=3600)
    scrape_timeout: float = Field(default=3.0, gt=0, le=600)
    max_instances: int = Field(default=256, ge=1, le=10_000)
    # Seconds after which a usage fact that stopped arriving is stale and no longer exported.
    fact_ttl: float = Field(default=60.0, gt=0, le=86_400)
    poll: bool = False
    # Let the sidecar fetch the config.json of a logged model that is not in the Hugging Face cache
    # from the Hub (HF_ENDPOINT, HF_TOKEN; never under HF_HUB_OFFLINE). Off: the cache only.
    fetch_model_configs: bool = False
    # Give back the disk blocks of log lines read and saved (kvwatch/sources/release.py), so a log
    # nothing rotates (the sidecar's tee'd file) never fills its volume; needs state_dir.
    release_read: bool = False
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @field_validator("log", mode="before")
    @classmethod
    def _logs(cls, value: Any) -> list[Any]:
        out: list[Any] = []
        for item in _as_list(value, "log"):
            if isinstance(item, str):
                if not item:
                    raise ValueError("empty log path")
                name, path = _split_named(item)
                out.append({"name": name or _default_log_name(path), "path": path})
            else:
                out.append(item)
        return out

    @field_validator("metrics_url", mode="before")
    @classmethod
    def _urls(cls, value: Any) -> list[Any]:
        out: list[Any] = []
        for item in _as_list(value, "metrics_url"):
            if isinstance(item, str):
                name, url = _split_named(item)
                if "://" not in url:
                    url = f"http://{url}"
                if not url.startswith(("http://", "https://")):
                    raise ValueError(f"not an http(s) URL: {url!r}")
                _check_url(item, url)
                if url.count("/") == 2:
                    url = f"{url}/metrics"
                out.append({"name": name or _default_url_name(url), "url": url})
            else:
                out.append(item)
        return out

    @field_validator("include", "exclude", mode="before")
    @classmethod
    def _globs(cls, value: Any, info: ValidationInfo) -> list[str]:
        out = [str(v) for v in _as_list(value, str(info.field_name))]
        for glob in out:
            if glob.count("/") != 2 or any(not part for part in glob.split("/")):
                raise ValueError(f"expected NAMESPACE/POD/CONTAINER globs, got {glob!r}")
        return out

    @field_validator("model_config_path", mode="before")
    @classmethod
    def _model_configs(cls, value: Any) -> Any:
        if isinstance(value, dict) and all(isinstance(v, Path) for v in value.values()):
            return value
        out: dict[str, str] = {}
        for item in _as_list(value if not isinstance(value, Path) else str(value), "model_config"):
            name, path = _split_named(str(item))
            key = name or ""
            if key in out:
                raise ValueError(f"two model configs for {key or 'all sources'!r}")
            out[key] = _resolve_model(path)
        return out

    @field_validator("gpu_memory", mode="before")
    @classmethod
    def _size(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)  # a YAML number: bytes, bounded as the flag is
        if isinstance(value, str):
            try:
                return parse_size(value, minimum=MIN_GPU_MEMORY_BYTES, maximum=MAX_GPU_MEMORY_BYTES)
            except ConfigError as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("listen", mode="before")
    @classmethod
    def _listen(cls, value: Any) -> Any:
        if isinstance(value, int):
            return {"host": "0.0.0.0", "port": value}
        if not isinstance(value, str):
            return value
        text = value.strip()
        if text.startswith("["):
            host, _, port = text[1:].partition("]:")
        elif text.isdigit():
            host, port = "", text
        else:
            host, sep, port = text.rpartition(":")
            if not sep:
                host, port = text, str(DEFAULT_PORT)
        if not port.isdigit():
            raise ValueError(f"expected HOST:PORT, got {value!r}")
        return {"host": host or "0.0.0.0", "port": int(port)}

    @field_validator("log_level", "engine", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if not self.log and not self.metrics_url and self.node_logs is None:
            raise ValueError("nothing to watch: give at least one --log, --metrics-url or --node-logs")
        if self.release_read and self.state_dir is None:
            raise ValueError(
                "--release-read needs --state-dir: only bytes a saved state covers are given back"
            )
        if self.node_logs is not None and not self.node_logs.is_dir():
            raise ValueError(f"--node-logs {self.node_logs} is not a directory")
        if self.gpu is not None and self.gpu_memory is not None:
            raise ValueError("give --gpu or --gpu-memory, not both")
        for kind, names in (
            ("log", [s.name for s in self.log]),
            ("metrics_url", [s.name for s in self.metrics_url]),
        ):
            for name in names:
                if not _NAME.match(name):
                    raise ValueError(f"bad source name {name!r} for {kind} (letters, digits, _ . : -)")
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                raise ValueError(f"two {kind} sources named {dup[0]!r}; give them names with NAME=")
        known = {s.name for s in self.log} | {s.name for s in self.metrics_url}
        for name in self.model_config_path:
            if name and name not in known:
                raise ValueError(f"model config for unknown source {name!r}")
        if sum(1 for s in self.log if s.path == "-") > 1:
            raise ValueError("standard input ('--log -') can be read only once")
        return self

    def model_config_for(self, source: str) -> Path | None:
        """The model config given for a source, or the one given for all sources."""
        return self.model_config_path.get(source, self.model_config_path.get(""))


def _env_layer(environ: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field_name, info in Settings.model_fields.items():
        key = (info.alias or field_name).upper()
        value = environ.get(ENV_PREFIX + key)
        if value is not None and value != "":
            out[info.alias or field_name] = value
    return out


def _file_layer(path: Path) -> dict[str, Any]:
    import yaml  # only when a file is given: the sidecar keeps its resident memory small

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read settings file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"settings file {path} is not UTF-8 text") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" line {where.line + 1}" if where is not None else ""
        raise ConfigError(f"settings file {path}{line}: not valid YAML") from None
    except RecursionError:
        raise ConfigError(f"settings file {path} nests too deeply") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"settings file {path}: expected a mapping of settings at the top level")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def _one_line(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"] if not isinstance(p, int))
    msg = str(err["msg"]).removeprefix("Value error, ")
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"invalid setting {loc}: {msg}{more}" if loc else f"invalid settings: {msg}{more}"


def load_settings(
    flags: Mapping[str, object],
    environ: Mapping[str, str] | None = None,
    config_file: Path | None = None,
) -> Settings:
    """Merge file < environment < flags (None flags are unset) and validate; ConfigError on any problem."""
    env = dict(os.environ if environ is None else environ)
    file_path = config_file
    if file_path is None and env.get(ENV_PREFIX + "CONFIG"):
        file_path = Path(env[ENV_PREFIX + "CONFIG"])
    merged: dict[str, Any] = _file_layer(file_path) if file_path is not None else {}
    merged.update(_env_layer(env))
    merged.update({k: v for k, v in flags.items() if v is not None and v != [] and v != ()})
    try:
        return Settings.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(_one_line(exc)) from None


class WebConfig(BaseModel):
    """The Prometheus exporter web-config file: TLS certificate and key, bcrypt basic-auth users."""

    model_config = ConfigDict(frozen=True)

    cert_file: Path | None = None
    key_file: Path | None = None
    client_ca_file: Path | None = None
    basic_auth_users: dict[str, str] = Field(default_factory=dict)

    @property
    def tls(self) -> bool:
        """True when /metrics is served over HTTPS."""
        return self.cert_file is not None


def load_web_config(path: Path) -> WebConfig:
    """Read a web-config YAML (same keys as Prometheus' exporter-toolkit); ConfigError when unusable."""
    data = _file_layer(path)
    unknown = set(data) - {"tls_server_config", "basic_auth_users", "http_server_config"}
    if unknown:
        raise ConfigError(f"web config {path}: unknown key {sorted(unknown)[0]!r}")
    tls = data.get("tls_server_config") or {}
    users = data.get("basic_auth_users") or {}
    if not isinstance(tls, dict) or not isinstance(users, dict):
        raise ConfigError(f"web config {path}: tls_server_config and basic_auth_users must be mappings")
    base = path.parent
    files: dict[str, Path | None] = {}
    for key in ("cert_file", "key_file", "client_ca_file"):
        value = tls.get(key)
        files[key] = None if value in (None, "") else (base / str(value))
    if (files["cert_file"] is None) != (files["key_file"] is None):
        raise ConfigError(f"web config {path}: tls_server_config needs both cert_file and key_file")
    for key, file in files.items():
        if file is not None and not file.is_file():
            raise ConfigError(f"web config {path}: {key} {file} does not exist")
    for user, hashed in users.items():
        if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")):
            raise ConfigError(f"web config {path}: password of user {user!r} is not a bcrypt hash")
    return WebConfig(
        cert_file=files["cert_file"],
        key_file=files["key_file"],
        client_ca_file=files["client_ca_file"],
        basic_auth_users={str(k): str(v) for k, v in users.items()},
    )
