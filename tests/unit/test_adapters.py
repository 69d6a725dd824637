"""--lora-modules parsing (vLLM's two forms) and the adapter registry's checks (streamproxy/core/adapters.py)."""

from __future__ import annotations

import pytest

from streamproxy.cli import build
from streamproxy.core.adapters import AdapterRegistry, LoRAModule, parse_lora_modules
from streamproxy.errors import InvalidRequest, ModelNotFound


def test_name_equals_path_and_json_forms() -> None:
    got = parse_lora_modules([
        "sql=/adapters/sql",
        '{"name": "chat", "path": "/adapters/chat,v2", "base_model_name": "base"}',
        '[{"name": "a", "path": "/a"}, {"name": "b", "path": "/b"}]',
        "",
    ])
    assert got == [
        LoRAModule(name="sql", path="/adapters/sql"),
        LoRAModule(name="chat", path="/adapters/chat,v2", base_model_name="base"),
        LoRAModule(name="a", path="/a"),
        LoRAModule(name="b", path="/b"),
    ]


def test_a_path_may_hold_an_equals_sign() -> None:
    assert parse_lora_modules(["x=/tmp/a=b"]) == [LoRAModule(name="x", path="/tmp/a=b")]


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("{not json", "Invalid JSON format"),
        ('{"name": "x"}', "Invalid fields"),
        ('{"name": "x", "path": "/p", "rank": 8}', "Invalid fields"),
        ("=/p", "expected name=path"),
        ("x=", "expected name=path"),
        ("justaname", "Invalid JSON format"),
    ],
)
def test_bad_values_say_what_is_wrong(value: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse_lora_modules([value])


def test_a_name_given_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="more than once: a"):
        parse_lora_modules(["a=/x", '{"name": "a", "path": "/y"}'])


def test_registry_ids_parent_and_vllm_checks() -> None:
    reg = AdapterRegistry(["base", "alias"])
    a = reg.plan_load("a", "/a")
    assert (a.id, a.parent) == (1, "base")
    assert "a" not in reg  # planned, not served until added
    reg.add(a)
    b = reg.plan_load("b", "/b", parent="alias")
    assert (b.id, b.parent) == (2, "alias")
    reg.add(b)
    assert reg.plan_load("c", "/c", parent="nope").parent == "base"  # not a served name: the first one
    assert [x.name for x in reg] == ["a", "b"] and reg.get("a") is a and reg.get("zzz") is None and reg.get(None) is None
    with pytest.raises(InvalidRequest, match="already been loaded") as err:
        reg.plan_load("a", "/a2")
    assert err.value.param == "lora_name"
    again = reg.plan_load("a", "/a2", replace=True)
    assert (again.id, again.path) == (1, "/a2")  # in place: same id
    with pytest.raises(InvalidRequest, match="conflicts with a served base model"):
        reg.plan_load("alias", "/x")
    with pytest.raises(InvalidRequest, match="must be provided"):
        reg.plan_load("", "/x")
    with pytest.raises(InvalidRequest, match="must be provided") as err:
        reg.plan_load("x", "")
    assert err.value.param == "lora_path"
    assert reg.remove("a") is a and "a" not in reg
    with pytest.raises(ModelNotFound, match="cannot be found") as nf:
        reg.remove("a")
    assert nf.value.status == 404
    with pytest.raises(InvalidRequest, match="needs to be provided"):
        reg.remove("")
    # A removed name's id is never given out again.
    assert reg.plan_load("d", "/d").id == 4


def test_cli_flag_takes_both_forms_several_per_flag_and_repeated() -> None:
    settings, _ = build([
        "--engine", "fake", "--lora-modules", "a=/x", '{"name": "b", "path": "/y,z"}', "--port", "1",
        "--lora-modules", "c=/w",
    ])
    assert settings.lora_modules == ["a=/x", '{"name": "b", "path": "/y,z"}', "c=/w"]
    assert [m.name for m in parse_lora_modules(settings.lora_modules)] == ["a", "b", "c"]


def test_cli_refuses_a_bad_value_before_the_engine_loads() -> None:
    with pytest.raises(SystemExit, match="Invalid JSON format"):
        build(["--engine", "fake", "--lora-modules", "{oops"])
