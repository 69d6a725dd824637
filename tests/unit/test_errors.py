"""errors: one error shape everywhere; msgspec validation errors -> 400 with param."""

from __future__ import annotations

import json

import msgspec
import pytest

from streamproxy import errors as E
from streamproxy.protocol.openai_chat import decode_request
from tests.support import schema_errors


def bad(body: bytes) -> msgspec.ValidationError:
    with pytest.raises(msgspec.ValidationError) as info:
        decode_request(body)
    return info.value


# ---------------------------------------------------------------- to_json


def test_to_json_exact_bytes_with_nulls():
    assert E.InvalidRequest("bad").to_json() == (
        b'{"error":{"message":"bad","type":"invalid_request_error","param":null,"code":null}}'
    )


def test_to_json_exact_bytes_with_param_and_code():
    err = E.ContextLengthExceeded("too long", param="messages")
    assert err.to_json() == (
        b'{"error":{"message":"too long","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}'
    )


ALL_ERRORS = [
    E.APIError, E.InvalidRequest, E.InvalidJSON, E.ContextLengthExceeded, E.AuthenticationError, E.NotFound,
    E.ModelNotFound, E.MethodNotAllowed, E.PayloadTooLarge, E.RateLimited,
    E.InternalError, E.EngineError, E.ServiceUnavailable, E.EngineLoading, E.GenerationTimeout,
]


@pytest.mark.parametrize("cls", ALL_ERRORS)
def test_every_error_has_the_openai_shape(cls):
    body = json.loads(cls("m").to_json())
    assert list(body) == ["error"]
    assert list(body["error"]) == ["message", "type", "param", "code"]
    assert body["error"]["message"] == "m"
    assert isinstance(body["error"]["type"], str)
    assert body["error"]["param"] is None
    assert body["error"]["code"] is None or isinstance(body["error"]["code"], str)
    assert schema_errors("ErrorResponse", body) == []


@pytest.mark.parametrize("cls", ALL_ERRORS)
def test_code_is_never_the_status(cls):
    err = cls("m")
    assert err.code != str(err.status)
    assert isinstance(err.status, int) and 400 <= err.status <= 599


@pytest.mark.parametrize(
    ("cls", "status", "type_", "code"),
    [
        (E.InvalidRequest, 400, "invalid_request_error", None),
        (E.InvalidJSON, 400, "invalid_request_error", "invalid_json"),
        (E.AuthenticationError, 401, "authentication_error", "invalid_api_key"),
        (E.ModelNotFound, 404, "invalid_request_error", "model_not_found"),
        (E.PayloadTooLarge, 413, "invalid_request_error", "request_too_large"),
        (E.RateLimited, 429, "rate_limit_error", "too_many_requests"),
        (E.EngineError, 500, "internal_error", "engine_error"),
        (E.EngineLoading, 503, "service_unavailable", "engine_loading"),
        (E.GenerationTimeout, 504, "timeout_error", "generation_timeout"),
    ],
)
def test_status_type_and_code_per_class(cls, status, type_, code):
    err = cls("m")
    assert (err.status, err.type, err.code) == (status, type_, code)


def test_explicit_code_and_status_override_class_defaults():
    err = E.InvalidRequest("m", code="custom", status=422)
    assert (err.status, err.code) == (422, "custom")
    assert E.InvalidRequest("m").status == 400  # the class is untouched


def test_retry_after_header():
    assert E.RateLimited("slow down").headers() == {"Retry-After": "1"}
    assert E.ServiceUnavailable("down", retry_after=30).headers() == {"Retry-After": "30"}
    assert E.InvalidRequest("m").headers() == {}


def test_message_is_the_exception_text():
    assert str(E.InvalidRequest("the text")) == "the text"


# ---------------------------------------------------------------- msgspec errors


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ("Expected `int`, got `str` - at `$.n`", "n"),
        ("Expected `str`, got `int` - at `$.messages[0].role`", "messages[0].role"),
        ("Expected `object`, got `array`", None),
        ("Expected `object`, got `array` - at `$`", None),
    ],
)
def test_param_from_msgspec(message, param):
    assert E.param_from_msgspec(message) == param


def test_wrong_type_at_top_level_field():
    err = E.from_validation_error(bad(b'{"messages":[{"role":"user","content":"hi"}],"n":"2"}'))
    assert isinstance(err, E.InvalidRequest)
    assert json.loads(err.to_json()) == {
        "error": {
            "message": "Expected `int | null`, got `str` at 'n'",  # null: the default (OpenAI types `n` as nullable)
            "type": "invalid_request_error",
            "param": "n",
            "code": "invalid_type",
        }
    }


def test_wrong_type_deep_in_messages():
    err = E.from_validation_error(bad(b'{"messages":[{"role":"user","content":[{"type":"text","text":1}]}]}'))
    assert err.param == "messages[0].content[0].text"
    assert err.message == "Expected `str | null`, got `int` at 'messages[0].content[0].text'"
    assert err.code == "invalid_type"


def test_wrong_type_in_nested_object():
    err = E.from_validation_error(bad(b'{"messages":[],"stream_options":{"include_usage":"yes"}}'))
    assert err.param == "stream_options.include_usage"


def test_wrong_top_level_type_has_no_param():
    err = E.from_validation_error(bad(b"[]"))
    assert (err.param, err.message, err.code) == (None, "Expected `object`, got `array`", "invalid_type")


def test_missing_field_is_missing_required_parameter():
    err = E.from_validation_error(bad(b"{}"))
    assert err.status == 400
    assert err.code == "missing_required_parameter"
    assert err.message == "missing required parameter 'messages'"
    assert schema_errors("ErrorResponse", json.loads(err.to_json())) == []


def test_missing_top_level_field_names_it_as_param():
    assert E.from_validation_error(bad(b"{}")).param == "messages"


def test_missing_nested_field_names_it_as_param():
    assert E.from_validation_error(bad(b'{"messages":[{"content":"x"}]}')).param == "messages[0].role"
