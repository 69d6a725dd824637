"""The new flags parse as documented: CLI, environment, YAML config (vLLM's CORS forms)."""

from __future__ import annotations

from streamproxy.cli import build


def test_flags_from_the_command_line():
    settings, _ = build([
        "--engine", "fake",
        "--allowed-origins", '["https://a.example", "https://b.example"]',
        "--allowed-origins", "https://c.example",
        "--allow-credentials",
        "--health-requires-api-key",
        "--api-key", "k1",
        "--max-header-bytes", "4096",
        "--access-log", "off",
        "--deprecated", "/v1/completions@2025-06-30",
        "--deprecated", "/v1/chat/completions#max_tokens",
        "--deprecation-link", "https://example.com/d",
        "--drain-timeout", "2.5",
    ])
    assert settings.allowed_origins == ["https://a.example", "https://b.example", "https://c.example"]
    assert settings.allowed_methods == ["*"] and settings.allowed_headers == ["*"]
    assert settings.allow_credentials is True
    assert settings.health_requires_api_key is True and settings.metrics_requires_api_key is False
    assert settings.api_key == ["k1"]
    assert settings.max_header_bytes == 4096 and settings.access_log == "off"
    assert settings.deprecated == ["/v1/completions@2025-06-30", "/v1/chat/completions#max_tokens"]
    assert settings.deprecation_link == "https://example.com/d"
    assert settings.drain_timeout == 2.5


def test_defaults():
    settings, _ = build(["--engine", "fake"])
    assert settings.allowed_origins == [] and settings.allow_credentials is False
    assert settings.health_requires_api_key is False and settings.metrics_requires_api_key is False
    assert settings.access_log == "stdout" and settings.deprecated == [] and settings.deprecation_link is None
    assert settings.max_header_bytes == 16384


def test_environment_and_yaml(tmp_path, monkeypatch):
    monkeypatch.setenv("STREAMPROXY_ALLOWED_ORIGINS", "https://env.example")
    monkeypatch.setenv("STREAMPROXY_METRICS_REQUIRES_API_KEY", "true")
    monkeypatch.setenv("VLLM_API_KEY", "from-vllm-env")
    settings, _ = build(["--engine", "fake"])
    assert settings.allowed_origins == ["https://env.example"]
    assert settings.metrics_requires_api_key is True
    assert "from-vllm-env" in settings.api_key
    monkeypatch.delenv("STREAMPROXY_ALLOWED_ORIGINS")
    conf = tmp_path / "c.yaml"
    conf.write_text(
        "engine: fake\nallowed-origins: [https://y1.example, https://y2.example]\n"
        "health-requires-api-key: true\ndeprecated: [/v1/completions]\n"
    )
    settings, _ = build(["--config", str(conf)])
    assert settings.allowed_origins == ["https://y1.example", "https://y2.example"]
    assert settings.health_requires_api_key is True and settings.deprecated == ["/v1/completions"]


def test_client_timeouts_and_connection_cap(monkeypatch):
    from streamproxy.http.client_clock import Limits, default_max_connections

    settings, _ = build(["--engine", "fake"])
    assert (settings.client_header_timeout, settings.client_body_timeout, settings.keepalive_timeout) == (60.0, 60.0, 75.0)
    assert settings.max_connections is None
    assert Limits.from_settings(settings).max_connections == default_max_connections() >= 1
    monkeypatch.setenv("STREAMPROXY_CLIENT_BODY_TIMEOUT", "7.5")
    settings, _ = build([
        "--engine", "fake", "--client-header-timeout", "5", "--keepalive-timeout", "0", "--max-connections", "100",
    ])
    assert (settings.client_header_timeout, settings.client_body_timeout, settings.keepalive_timeout) == (5.0, 7.5, 0.0)
    assert Limits.from_settings(settings).max_connections == 100
