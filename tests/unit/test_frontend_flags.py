"""Every front-end flag of the installed vLLM's `vllm serve` parser, through `streamproxy serve`'s
argument parsing (no engine is built): accepted with the setting it maps to, or refused naming it.

The flags and a value other than vLLM's default for each come from vLLM's own
parser (`make_arg_parser`, minus the engine's flags): a boolean flag is given
alone (or as `--no-...` where vLLM's default is on), a flag with choices gets
one that is not the default, a number 7; only values a flag cannot take from
its type (a file, a JSON list) are written here. A flag that a newer vLLM
adds and `streamproxy/frontend_flags.py` has not decided about fails
`test_every_flag_is_decided`. A decision names the releases its flag exists
in (`since`/`until`): on the others it is skipped here, and it is no stale
decision. `make check-vllm` runs this module over each supported release's
own sources (marker `vllm_sources`).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import tempfile
import typing
from pathlib import Path
from typing import Any

import pytest

from engine_adapter import vllm_cli, vllm_compat
from streamproxy import cli, frontend_flags
from streamproxy.config import Settings
from tests.support.tls import make_certs

# vLLM is imported when the tests run, not when they are collected: its import is most of a
# collection's time, and pytest-xdist's workers each collect every module (tests/README.md).
if importlib.util.find_spec("vllm") is None:
    pytest.skip("vllm is not installed", allow_module_level=True)

pytestmark = pytest.mark.vllm_sources

CERTS = make_certs(Path(tempfile.mkdtemp(prefix="sp-flags-")))
# The flags `test_flag` walks: every decision, which `test_every_flag_is_decided` holds equal to vLLM's own.
DECIDED = sorted(d for d in frontend_flags.FLAGS if d != "model_tag")


@functools.cache
def actions() -> dict[str, argparse.Action]:
    """vLLM's `vllm serve` front-end options by dest."""
    return {a.dest: a for a in vllm_cli.frontend_actions() if a.dest != "help"}


@functools.cache
def hints() -> dict[str, Any]:
    """The type vLLM declares for each (its parser wraps `int | None` in a converter that does not say it)."""
    return typing.get_type_hints(vllm_compat.cli_args().FrontendArgs)


def in_this_release(dest: str) -> bool:
    flag = frontend_flags.FLAGS[dest]
    return vllm_compat.in_release(flag.since, flag.until)

TEMPLATE = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"

# Values a flag's type cannot make up.
VALUES: dict[str, Any] = {
    "allowed_origins": '["https://a.example"]',
    "allowed_methods": '["GET"]',
    "allowed_headers": '["x-a"]',
    "api_key": "k1",
    "lora_modules": "ada=/tmp/ada",
    "default_chat_template_kwargs": '{"enable_thinking": false}',
    "chat_template": TEMPLATE,
    "tool_call_parser": "hermes",
    "root_path": "/proxy",
    "host": "127.0.0.1",
    "disable_access_log_for_endpoints": "/health,/metrics",
    "tool_parser_plugin": "",  # (a file: test_tool_parser_plugin)
    "ssl_certfile": str(CERTS.cert),
    "ssl_keyfile": str(CERTS.key),
    "ssl_ca_certs": str(CERTS.ca),
    "ssl_cert_reqs": "2",
    "ssl_ciphers": "ECDHE+AESGCM",
    "uds": "/tmp/sp-flags.sock",
    "reasoning_effort_map": '{"low": "high"}',
}
# What a TLS flag needs beside it to mean anything.
_TLS = ["--ssl-certfile", str(CERTS.cert), "--ssl-keyfile", str(CERTS.key)]
COMPANIONS: dict[str, list[str]] = {
    "enable_auto_tool_choice": ["--tool-call-parser", "hermes"],
    "lora_modules": ["--enable-lora"],
    "ssl_keyfile": ["--ssl-certfile", str(CERTS.cert)],
    "ssl_certfile": ["--ssl-keyfile", str(CERTS.key)],
    "ssl_ca_certs": _TLS,
    "ssl_cert_reqs": [*_TLS, "--ssl-ca-certs", str(CERTS.ca)],
    "ssl_ciphers": _TLS,
    "enable_ssl_refresh": _TLS,
}

# Ours and aliases: the setting each maps to and its value after the flag.
EXPECT: dict[str, tuple[str, Any]] = {
    "api_server_count": ("api_server_count", 7),
    "host": ("host", "127.0.0.1"),
    "port": ("port", 7),
    "root_path": ("root_path", "/proxy"),
    "h11_max_incomplete_event_size": ("max_header_bytes", 7),
    "h11_max_header_count": ("max_header_count", 7),
    "allow_credentials": ("allow_credentials", True),
    "allowed_origins": ("allowed_origins", ["https://a.example"]),
    "allowed_methods": ("allowed_methods", ["GET"]),
    "allowed_headers": ("allowed_headers", ["x-a"]),
    "api_key": ("api_key", ["k1"]),
    "disable_fastapi_docs": ("disable_fastapi_docs", True),
    "sse_keep_alive_interval": ("sse_heartbeat", 7.0),
    "uvicorn_log_level": ("http_log_level", None),  # the first choice that is not vLLM's default: below
    "disable_uvicorn_access_log": ("access_log", "off"),
    "disable_access_log_for_endpoints": ("disable_access_log_for_endpoints", "/health,/metrics"),
    "log_error_stack": ("log_error_stack", True),
    "chat_template": ("chat_template", TEMPLATE),
    "chat_template_content_format": ("chat_template_content_format", None),
    "trust_request_chat_template": ("trust_request_chat_template", True),
    "default_chat_template_kwargs": ("default_chat_template_kwargs", {"enable_thinking": False}),
    "cohere_format": ("default_chat_template_kwargs", None),
    "response_role": ("response_role", "x"),
    "return_tokens_as_token_ids": ("return_tokens_as_token_ids", True),
    "enable_force_include_usage": ("enable_force_include_usage", True),
    "enable_auto_tool_choice": ("enable_auto_tool_choice", True),
    "tool_call_parser": ("tool_call_parser", "hermes"),
    "exclude_tools_when_tool_choice_none": ("exclude_tools_when_tool_choice_none", True),
    "lora_modules": ("lora_modules", ["ada=/tmp/ada"]),
    "enable_server_load_tracking": ("enable_server_load_tracking", True),
    "ssl_certfile": ("ssl_certfile", str(CERTS.cert)),
    "ssl_keyfile": ("ssl_keyfile", str(CERTS.key)),
    "ssl_ca_certs": ("ssl_ca_certs", str(CERTS.ca)),
    "ssl_cert_reqs": ("ssl_cert_reqs", 2),
    "ssl_ciphers": ("ssl_ciphers", "ECDHE+AESGCM"),
    "enable_ssl_refresh": ("enable_ssl_refresh", True),
    "uds": ("uds", "/tmp/sp-flags.sock"),
    "enable_tokenizer_info_endpoint": ("enable_tokenizer_info_endpoint", True),
    "enable_log_outputs": ("enable_log_outputs", True),
    "max_log_len": ("max_log_len", 7),
    "reasoning_effort_map": ("reasoning_effort_map", {"low": "high"}),
}


def flag_args(action: argparse.Action) -> list[str]:
    """The command-line words that give `action` a value other than vLLM's default."""
    dest = action.dest
    if isinstance(action, argparse.BooleanOptionalAction):
        return [action.option_strings[1] if action.default else action.option_strings[0]]
    if action.nargs == 0:  # store_true
        return [action.option_strings[0]]
    if dest in VALUES:
        value = VALUES[dest]
    elif action.choices:
        value = next(c for c in action.choices if c != action.default and c not in frontend_flags.FLAGS[dest].neutral)
    elif action.type in (int, float) or {int, float} & set(typing.get_args(hints().get(dest)) or (hints().get(dest),)):
        value = "7"
    else:
        value = "x"
    return [action.option_strings[0], str(value)]


def parse(words: list[str]) -> Settings:
    settings, _ = cli.parse(["--model", "m", *words])
    return settings


def test_every_flag_is_decided():
    undecided = sorted(set(actions()) - set(frontend_flags.FLAGS))
    assert undecided == [], f"vLLM front-end flags nobody decided about (streamproxy/frontend_flags.py): {undecided}"
    release = vllm_compat.release()
    stale = sorted(d for d in set(frontend_flags.FLAGS) - set(actions()) - {"model_tag"} if in_this_release(d))
    assert stale == [], f"decisions about flags vLLM {release} does not have (or give them since/until): {stale}"
    misdated = sorted(d for d in set(actions()) & set(frontend_flags.FLAGS) if not in_this_release(d))
    assert misdated == [], f"flags vLLM {release} has that their decision dates out of it (since/until): {misdated}"


@pytest.mark.parametrize("dest", DECIDED)
def test_flag(dest: str) -> None:
    if dest == "config":  # --config FILE: the file's keys are flags (test_config_file)
        return
    if not in_this_release(dest):
        pytest.skip(f"{frontend_flags.option(dest)} is not a flag of vLLM {vllm_compat.release()}")
    action = actions().get(dest)
    assert action is not None, f"decided about in streamproxy/frontend_flags.py, but not a flag of this vLLM: {dest}"
    words = flag_args(action)
    words += COMPANIONS.get(dest, [])
    decision = frontend_flags.FLAGS[dest]
    if decision.kind == "refused":
        with pytest.raises(SystemExit) as err:
            parse(words)
        message = str(err.value)
        assert action.option_strings[0] in message and decision.note in message and "\n" not in message
        return
    settings = parse(words)
    if decision.kind in ("ours", "alias"):
        name, expected = EXPECT[dest]
        if dest in ("uvicorn_log_level", "chat_template_content_format"):
            expected = words[1]
        if dest == "cohere_format":
            expected = {"cohere_format": "x"}
        assert getattr(settings, name) == expected
    else:  # engine / same: parsed, nothing of ours changes but what the note says
        assert decision.note


def test_every_spelling_of_every_flag_parses() -> None:
    """Each string vLLM's `vllm serve` parser takes for a front-end option, its hidden aliases too
    (0.33 pairs `--enable-x` with `--disable-x` and keeps `--no-enable-x` out of help), selects the
    same option in ours."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    ours = vllm_cli.parser(cli.add_arguments)._option_string_actions
    serve = vllm_compat.cli_args().make_arg_parser(FlexibleArgumentParser(add_help=False))
    missing = [s for a, strings in vllm_compat.option_strings(serve) if a.dest in actions() for s in strings if s not in ours]
    assert missing == []
    booleans = [a for a in actions().values() if isinstance(a, argparse.BooleanOptionalAction) and a.dest in frontend_flags.FLAGS]
    for action in booleans:
        strings = {s for a, ss in vllm_compat.option_strings(serve) if a is action for s in ss}
        for spelling in strings:  # each spelling sets the dest as vLLM's parser does
            expected = getattr(serve.parse_args([spelling]), action.dest)
            ns = vllm_cli.parser(cli.add_arguments).parse_args(["--model", "m", spelling])
            assert getattr(ns, action.dest) == expected, spelling


def test_a_refused_flag_at_a_value_that_means_its_default_starts() -> None:
    # 0.32's default --tool-strict-level, spelled out: the same on 0.33, whose default is unset
    assert parse(["--tool-strict-level", "auto"]).tool_call_parser is None
    with pytest.raises(SystemExit, match="^--tool-strict-level is not supported"):
        parse(["--tool-strict-level", next(c for c in actions()["tool_strict_level"].choices or () if c not in ("auto", None))])


def test_reasoning_effort_map_is_checked_as_vllm_checks_it() -> None:
    assert parse(["--reasoning-effort-map", '{"medium": "low", "xhigh": "max"}']).reasoning_effort_map == {"medium": "low", "xhigh": "max"}
    with pytest.raises(SystemExit, match=r"^--reasoning-effort-map has unknown efforts \['huge'\]; keys must be one of"):
        parse(["--reasoning-effort-map", '{"huge": "max"}'])
    with pytest.raises(SystemExit, match="^--reasoning-effort-map must be a JSON object mapping reasoning efforts to strings"):
        parse(["--reasoning-effort-map", '{"low": 3}'])


def test_serve_help_names_every_front_end_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.parse(["--help"])
    assert done.value.code == 0
    shown = capsys.readouterr().out
    assert [a.option_strings[0] for a in actions().values() if a.option_strings[0] not in shown] == []


def test_a_vllm_whose_parser_no_longer_fits_stops_with_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    def moved() -> Any:
        raise ModuleNotFoundError("No module named 'vllm.entrypoints.somewhere'", name="vllm.entrypoints.somewhere")

    vllm_cli._frontend_options.cache_clear()
    monkeypatch.setattr(vllm_compat, "cli_args", moved)
    try:
        with pytest.raises(SystemExit) as err:
            parse([])
    finally:
        vllm_cli._frontend_options.cache_clear()
    message = str(err.value)
    assert message.startswith(f"vLLM {vllm_compat.release()} does not fit streamproxy's use of its flags (ModuleNotFoundError: ")
    assert message.endswith("supported releases: 0.32, 0.33") and "\n" not in message


def test_config_file(tmp_path: Path) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text("response-role: bot\nsse-keep-alive-interval: 3\n")
    settings, _ = cli.parse(["--config", str(config), "--model", "m"])
    assert (settings.response_role, settings.sse_heartbeat) == ("bot", 3.0)


def test_chat_template_from_a_file_or_inline(tmp_path: Path) -> None:
    path = tmp_path / "tool.jinja"
    path.write_text(TEMPLATE)
    assert parse(["--chat-template", str(path)]).chat_template == TEMPLATE
    assert parse(["--chat-template", "{{ messages[0].content }}"]).chat_template == "{{ messages[0].content }}"
    with pytest.raises(SystemExit, match=r"^--chat-template: .*/nowhere/t.jinja.* looks like a file path"):
        parse(["--chat-template", "/nowhere/t.jinja"])
    with pytest.raises(SystemExit, match=r"^--chat-template: '/nowhere/t.jinja' looks like a file path"):
        cli.parse(["--engine", "fake", "--chat-template", "/nowhere/t.jinja"])
    # vLLM's own templates by name, as vllm serve finds them
    assert "im_start" in (parse(["--chat-template", "template_chatml.jinja"]).chat_template or "")


def test_tool_parser_plugin(tmp_path: Path, parser_registry: None) -> None:
    # (parser_registry: ours alone, as a fresh process has it; the vLLM CLI adds vLLM's registries itself)
    plugin = tmp_path / "my_parser.py"
    plugin.write_text(
        "from vllm.tool_parsers import ToolParserManager\n"
        "from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser\n"
        "@ToolParserManager.register_module('my_plugin_parser')\n"
        "class MyParser(Hermes2ProToolParser):\n    pass\n"
    )
    settings = parse(["--tool-parser-plugin", str(plugin), "--enable-auto-tool-choice", "--tool-call-parser", "my_plugin_parser"])
    assert settings.tool_call_parser == "my_plugin_parser"


def test_the_vllm_cli_knows_vllms_parser_names_before_an_engine_exists(parser_registry: None) -> None:
    settings = parse(["--enable-auto-tool-choice", "--tool-call-parser", "xlam", "--reasoning-parser", "granite"])
    assert (settings.tool_call_parser, settings.reasoning_parser) == ("xlam", "granite")
    with pytest.raises(SystemExit, match="unknown --reasoning-parser 'no_such'.*or a name in vLLM's registry"):
        parse(["--reasoning-parser", "no_such"])


def test_an_undecided_flag_is_refused_at_start() -> None:
    ns = argparse.Namespace(brand_new_flag=True)
    with pytest.raises(SystemExit, match="^--brand-new-flag: a vLLM front-end flag streamproxy has not decided about"):
        frontend_flags.apply(ns, {"brand_new_flag": False}, Settings())


def test_fake_engine_takes_our_front_end_flags() -> None:
    settings, _ = cli.parse(["--engine", "fake", "--response-role", "bot", "--chat-template", "{{ 1 }}",
                             "--enable-force-include-usage", "--root-path", "proxy/"])
    assert (settings.response_role, settings.chat_template, settings.enable_force_include_usage, settings.root_path) == (
        "bot", "{{ 1 }}", True, "/proxy")


def test_the_docs_list_every_flag_and_refused_route() -> None:
    from streamproxy.http.routes.unsupported import UNSUPPORTED

    docs = (Path(__file__).resolve().parents[2] / "docs" / "flags-and-routes.md").read_text()
    assert [d for d in frontend_flags.FLAGS if d != "model_tag" and f"`{frontend_flags.option(d)}`" not in docs] == []
    assert [p for m, p, _ in UNSUPPORTED if f"`{m} {p}`" not in docs] == []


@pytest.mark.parametrize(("words", "message"), [
    (["--ssl-keyfile", str(CERTS.key)], "--ssl-keyfile needs --ssl-certfile"),
    (["--ssl-ca-certs", str(CERTS.ca)], "--ssl-ca-certs needs --ssl-certfile"),
    ([*_TLS, "--ssl-cert-reqs", "2"], "--ssl-cert-reqs 1 or 2 needs --ssl-ca-certs"),
    ([*_TLS, "--ssl-cert-reqs", "5"], "--ssl-cert-reqs must be 0 (none), 1 (optional) or 2 (required), not 5"),
    (["--ssl-certfile", "/nowhere.pem"], "--ssl-certfile/--ssl-keyfile could not be loaded"),
    ([*_TLS, "--ssl-ciphers", "NOPE"], "--ssl-ciphers 'NOPE'"),
    (["--uds", "/tmp/x.sock", "--api-server-count", "2"], "--uds with --api-server-count above 1 is not supported"),
])
def test_bad_tls_flags_stop_the_start(words: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as err:
        cli.parse(["--engine", "fake", *words])
    assert str(err.value).startswith(message)


def test_gateway_refuses_serve_only_flags(tmp_path: Path) -> None:
    config = tmp_path / "gw.yaml"
    config.write_text("deployments:\n  - name: m\n    id: d1\n    upstreams: [\"http://127.0.0.1:9\"]\n")
    with pytest.raises(SystemExit, match="^--response-role is a flag of streamproxy serve; the gateway does not support it$"):
        cli.build_gateway(["--config", str(config), "--response-role", "bot"])
    with pytest.raises(SystemExit, match="^--ledger is a flag of streamproxy serve; the gateway's ledger is its config's `ledger:`$"):
        cli.build_gateway(["--config", str(config), "--ledger", "sqlite:///tmp/x.db"])
    with pytest.raises(SystemExit, match="^--ssl-keyfile needs --ssl-certfile$"):
        cli.build_gateway(["--config", str(config), "--ssl-keyfile", str(CERTS.key)])
    settings, _ = cli.build_gateway(["--config", str(config), *_TLS])  # the gateway listens with TLS too
    assert settings.ssl_certfile == str(CERTS.cert)


def test_serve_ledger_is_off_by_default_even_with_the_gateways_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMPROXY_LEDGER", "sqlite:///tmp/gateway-default.db")  # the gateway's default ledger
    settings, _ = cli.parse(["--engine", "fake"])
    assert settings.ledger is None
    settings, _ = cli.parse(["--engine", "fake", "--ledger", "sqlite:///tmp/serve.db"])
    assert settings.ledger == "sqlite:///tmp/serve.db"
