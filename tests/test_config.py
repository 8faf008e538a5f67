"""Sidecar settings: layering (flags > env > file), parsing of NAME=VALUE lists, one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvwatch.core.errors import ConfigError
from kvwatch.sidecar.config import DEFAULT_PORT, load_settings, load_web_config


def test_defaults_and_named_sources() -> None:
    s = load_settings({"log": ["vllm=/var/log/vllm.log", "/var/log/sglang.log"]}, environ={})
    assert [(x.name, x.path) for x in s.log] == [
        ("vllm", "/var/log/vllm.log"),
        ("sglang", "/var/log/sglang.log"),
    ]
    assert s.listen.port == DEFAULT_PORT == 9477
    assert s.listen.host == "0.0.0.0"
    assert s.engine == "auto"


def test_default_port_is_not_dcgm() -> None:
    assert DEFAULT_PORT != 9400


def test_glob_and_stdin_names() -> None:
    s = load_settings({"log": ["/var/log/pods/ns_vllm-0_1/vllm/*.log", "-"]}, environ={})
    assert [x.name for x in s.log] == ["vllm", "stdin"]


def test_metrics_url_forms() -> None:
    s = load_settings({"metrics_url": ["localhost:8000", "eng=https://h:9/x/metrics?a=b"]}, environ={})
    assert s.metrics_url[0].url == "http://localhost:8000/metrics"
    assert s.metrics_url[0].name == "localhost:8000"
    assert (s.metrics_url[1].name, s.metrics_url[1].url) == ("eng", "https://h:9/x/metrics?a=b")


def test_flags_win_over_env_over_file(tmp_path: Path) -> None:
    cfg = tmp_path / "kvwatch.yaml"
    cfg.write_text(
        "log: {a: /a.log}\nlisten: 127.0.0.1:1000\nengine: sglang\ngpu: H100\nscrape-interval: 7\n",
        encoding="utf-8",
    )
    env = {"KVWATCH_LISTEN": "127.0.0.1:2000", "KVWATCH_ENGINE": "vllm"}
    s = load_settings({"engine": "sglang"}, environ=env, config_file=cfg)
    assert s.listen.port == 2000  # env beats file
    assert s.engine == "sglang"  # flag beats env
    assert s.gpu == "H100"  # file only
    assert s.scrape_interval == 7.0
    assert [x.name for x in s.log] == ["a"]


def test_config_file_from_env(tmp_path: Path) -> None:
    cfg = tmp_path / "k.yaml"
    cfg.write_text("metrics_url: [e=127.0.0.1:8000]\n", encoding="utf-8")
    s = load_settings({}, environ={"KVWATCH_CONFIG": str(cfg), "KVWATCH_GPU_MEMORY": "81559MiB"})
    assert s.metrics_url[0].name == "e"
    assert s.gpu_memory == 81559 * 2**20


def test_env_lists_are_comma_separated() -> None:
    s = load_settings({}, environ={"KVWATCH_LOG": "a=/x.log, b=/y.log"})
    assert [(x.name, x.path) for x in s.log] == [("a", "/x.log"), ("b", "/y.log")]


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        ({}, "nothing to watch"),
        ({"log": ["a.log"], "listen": "host:port"}, "listen"),
        ({"log": ["a.log"], "listen": "127.0.0.1:70000"}, "listen"),
        ({"log": ["x=/a.log", "x=/b.log"]}, "two log sources named 'x'"),
        ({"log": ["a.log"], "gpu": "H100", "gpu_memory": "80GB"}, "not both"),
        ({"log": ["a.log"], "gpu_memory": "eighty"}, "not a size"),
        ({"log": ["a.log"], "engine": "trt"}, "engine"),
        ({"log": ["a.log"], "scrape_interval": 0}, "scrape_interval"),
        ({"log": ["-", "-"]}, "two log sources named 'stdin'"),
        ({"metrics_url": ["ftp://h/x"]}, "not an http"),
    ],
)
def test_bad_settings_are_one_line_errors(flags: dict[str, object], fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(flags, environ={})
    assert fragment in str(err.value)
    assert "\n" not in str(err.value)


def test_unknown_file_key_and_bad_yaml(tmp_path: Path) -> None:
    cfg = tmp_path / "k.yaml"
    cfg.write_text("log: [a.log]\nlisen: 1\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="lisen"):
        load_settings({}, environ={}, config_file=cfg)
    cfg.write_text("log: [a.log\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_settings({}, environ={}, config_file=cfg)
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings({}, environ={}, config_file=tmp_path / "missing.yaml")


def test_web_config(tmp_path: Path) -> None:
    (tmp_path / "c.pem").write_text("x", encoding="utf-8")
    (tmp_path / "k.pem").write_text("x", encoding="utf-8")
    web = tmp_path / "web.yml"
    web.write_text(
        "tls_server_config: {cert_file: c.pem, key_file: k.pem}\n"
        "basic_auth_users: {prom: $2b$12$hNf2lSsxfm0.i4a.1kVpSOVyBCfIB51VRjgBUyv6kdnyTlgWj81Ay}\n",
        encoding="utf-8",
    )
    cfg = load_web_config(web)
    assert cfg.tls and cfg.cert_file == tmp_path / "c.pem"
    assert set(cfg.basic_auth_users) == {"prom"}
    web.write_text("basic_auth_users: {prom: plaintext}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="bcrypt"):
        load_web_config(web)
    web.write_text("tls_server_config: {cert_file: c.pem}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="both"):
        load_web_config(web)


def test_model_config_per_source() -> None:
    s = load_settings(
        {"log": ["a=/a.log", "b=/b.log"], "model_config": ["/m/all.json", "b=/m/b"]}, environ={}
    )
    assert s.model_config_for("a") == Path("/m/all.json")
    assert s.model_config_for("b") == Path("/m/b")
    with pytest.raises(ConfigError, match="unknown source 'c'"):
        load_settings({"log": ["a=/a.log"], "model_config": ["c=/m.json"]}, environ={})
    assert load_settings({"log": ["/a.log"]}, environ={}).model_config_for("a") is None
