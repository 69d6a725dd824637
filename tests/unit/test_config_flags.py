"""streamproxy/config.py: each flag declared once on its `Settings` field, and what is made from the
declarations: the parsers (serve's, the gateway's), the environment variables, the YAML reader and
the gateway's refusal of serve's own flags. No engine, no vLLM."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from streamproxy import cli, frontend_flags
from streamproxy.config import FLAGS, Flag, Settings, add_arguments, mapping_to_flags

SERVE_ONLY = sorted(name for name, flag in FLAGS.items() if "gateway" not in flag.commands)


def test_every_field_is_a_flag_with_its_type_and_default() -> None:
    assert list(FLAGS) == list(Settings.__struct_fields__)
    assert (FLAGS["port"].kind, FLAGS["port"].default, FLAGS["port"].option) == (int, 8000, "--port")
    assert (FLAGS["max_connections"].kind, FLAGS["max_connections"].default) == (int, None)  # int | None
    assert (FLAGS["reasoning_effort_map"].kind, FLAGS["allowed_methods"].default) == (dict, ["*"])


def test_variables_are_streamproxy_names_but_where_declared_otherwise() -> None:
    others = {name: flag.env for name, flag in FLAGS.items() if flag.env != "STREAMPROXY_" + name.upper()}
    # $STREAMPROXY_LEDGER is the gateway's default ledger, not serve's; --model and --served-model-name are vLLM's.
    assert others == {"model": None, "served_model_name": None, "ledger": None, "lora_modules": None}


def test_serve_only_flags_are_the_front_end_flags_the_gateway_does_not_take() -> None:
    assert SERVE_ONLY == sorted([
        "model", "served_model_name", "ledger", "root_path", "chat_template", "chat_template_content_format",
        "trust_request_chat_template", "response_role", "return_tokens_as_token_ids", "enable_force_include_usage",
        "exclude_tools_when_tool_choice_none", "enable_server_load_tracking", "enable_tokenizer_info_endpoint",
        "responses_store", "enable_log_outputs", "max_log_len", "disable_fastapi_docs", "log_error_stack",
        "reasoning_effort_map",
    ])


def test_ours_in_the_vllm_decisions_are_declared_flags() -> None:
    ours = {dest for dest, decision in frontend_flags.FLAGS.items() if decision.kind == "ours"}
    assert ours - set(FLAGS) == {"model_tag", "config"}  # the launcher's: the positional model, the YAML file


def _parser(command: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streamproxy " + command)
    add_arguments(parser, command)
    return parser


def _words(flag: Flag) -> list[str]:
    """The command-line words giving `flag` a value other than its default."""
    if flag.kind is bool:
        return [flag.option if not flag.default else "--no-" + flag.option[2:]]
    value = {int: "7", dict: '{"low": "high"}'}.get(flag.kind, "x")
    return [flag.option, value]


def test_how_each_kind_parses(monkeypatch: pytest.MonkeyPatch) -> None:
    ns = _parser("serve").parse_args([
        "--no-stream-push", "--allowed-origins", "a,b", "--allowed-origins", '["c"]', "--api-key", "k1", "k2",
        "--api-key", "k3", "--served-model-name", "a", "b", "--served-model-name", "c",
        "--default-chat-template-kwargs", '{"x": 1}', "--max-connections", "5", "--sse-heartbeat", "2.5",
    ])
    assert (ns.stream_push, ns.allowed_origins, ns.api_key) == (False, [["a", "b"], ["c"]], [["k1", "k2"], ["k3"]])
    assert (ns.served_model_name, ns.default_chat_template_kwargs, ns.max_connections, ns.sse_heartbeat) == (
        ["c"], {"x": 1}, 5, 2.5)
    monkeypatch.setenv("STREAMPROXY_STREAM_PUSH", "off")
    monkeypatch.setenv("STREAMPROXY_MAX_N", "3")
    monkeypatch.setenv("STREAMPROXY_LEDGER", "sqlite:///gateway.db")
    ns = _parser("serve").parse_args([])
    assert (ns.stream_push, ns.max_n, ns.ledger) == (False, 3, None)


def test_the_gateway_help_shows_only_the_flags_it_takes(capsys: pytest.CaptureFixture[str]) -> None:
    _parser("gateway").print_help()
    shown = capsys.readouterr().out
    assert [FLAGS[n].option for n in SERVE_ONLY if FLAGS[n].option + " " in shown] == []
    assert [f.option for f in FLAGS.values() if "gateway" in f.commands and f.option not in shown] == []


@pytest.mark.parametrize("name", SERVE_ONLY)
def test_the_gateway_refuses_each_flag_of_serve_only(name: str, tmp_path: Path) -> None:
    config = tmp_path / "gw.yaml"
    config.write_text("deployments:\n  - name: m\n    id: d1\n    upstreams: [\"http://127.0.0.1:9\"]\n")
    flag = FLAGS[name]
    with pytest.raises(SystemExit) as err:
        cli.build_gateway(["--config", str(config), *_words(flag)])
    assert str(err.value) == f"{flag.option} is a flag of streamproxy serve; {flag.refusal}"


def test_a_yaml_list_repeats_a_repeatable_flag_else_gives_its_words() -> None:
    assert mapping_to_flags({
        "allowed-origins": ["a", "b"], "api_key": ["k1", "k2"], "served_model_name": ["n1", "n2"], "port": 9,
        "max_model_len": 5, "stream_push": False, "allow_credentials": True, "default_chat_template_kwargs": {"x": 1},
    }) == [
        "--allowed-origins", "a", "--allowed-origins", "b", "--api-key", "k1", "--api-key", "k2",
        "--served-model-name", "n1", "n2", "--port", "9", "--max-model-len", "5", "--no-stream-push", "--allow-credentials",
        "--default-chat-template-kwargs", '{"x": 1}',
    ]
    # `false` turns a flag of ours that is on by default off (as vllm serve's --config does with --no-x); a key that
    # is not ours (vLLM's) and false is left out, which is its default off
    assert mapping_to_flags({"direct_outputs": False, "enable_prefix_caching": False, "enforce_eager": False}) == ["--no-direct-outputs"]
