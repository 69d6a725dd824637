"""The gateway's routes through HTTP, in front of fake-engine replicas: any request is a 200 or a 4xx.

`live.LiveGateway`: the gateway on the real runner with two deployments
(chat-like routes on two replicas running serve's fuzzing settings,
embeddings on a pooling one). Every relayed route gets serve's fuzzed
bodies (`fuzz_support.request_bodies`) on each of its paths: by the body's
`model` (as sent, which mostly names nothing, or set to the deployment's
name or id) and by the deployment's id or name in the path. Also: unknown
deployment and model ids in every path that takes one, and a gateway with
keys (one limited to a deployment and 5 requests a minute) sent any
Authorization / x-api-key header. The checks are serve's (`answers.check`):
never a 5xx, nothing logged at ERROR by the gateway or its replicas, no
traceback; a 4xx in the route's error shape; a 200 JSON or a clean stream.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st
from yarl import URL

from streamproxy.gateway.routes import ROUTES, relayed_paths
from tests.fuzz.answers import check
from tests.fuzz.fuzz_support import SEEDS, WORDS, budget, request_bodies
from tests.fuzz.live import CHAT, EMBED, LiveGateway


@pytest.fixture(scope="module")
def gateway() -> Iterator[LiveGateway]:
    server = LiveGateway()
    yield server
    server.close()


def named(body: bytes, model: str) -> bytes:
    """`body` with its `model` set, when it is a JSON object (anything else: as it is)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return body
    if not isinstance(data, dict):
        return body
    data["model"] = model
    return json.dumps(data).encode()


@st.composite
def addressed(draw: st.DrawFn, route: str, schema: str, deployment: tuple[str, str] = CHAT) -> tuple[str, bytes]:
    """(path, body): a body for `schema` on one of the paths of `route` (a key of ROUTES)."""
    path = draw(st.sampled_from(relayed_paths(route)))
    body = draw(request_bodies(schema))
    if "{deployment}" in path:
        return path.replace("{deployment}", draw(st.sampled_from(deployment))), body
    if draw(st.integers(0, 3)):  # mostly named: the replicas see more than the gateway's own 400/404
        body = named(body, draw(st.sampled_from(deployment)))
    return path, body


ANTHROPIC = {"messages", "messages/count_tokens"}
KINDS = {"chat/completions": "chunks", "completions": "chunks", "responses": "responses", "messages": "anthropic"}


def relayed(route: str, schema: str, examples: int, deployment: tuple[str, str] = CHAT) -> Callable[..., None]:
    """The property for `route`: serve's fuzzed `schema` bodies on each of its paths, `examples` of them under "ci"."""

    def test(gateway: LiveGateway, request: tuple[str, bytes]) -> None:
        path, body = request
        check(gateway, path, body, kind=KINDS.get(route, "json"), anthropic=route in ANTHROPIC)

    test.__name__ = test.__qualname__ = "test_" + route.replace("/", "_")  # reports, and the derandomized seed
    return budget(examples)(given(addressed(route, schema, deployment))(test))


test_chat = relayed("chat/completions", "ChatCompletionRequest", 60)
test_completions = relayed("completions", "CompletionRequest", 30)
test_responses = relayed("responses", "ResponsesRequest", 50)
test_messages = relayed("messages", "MessagesRequest", 50)
test_count_tokens = relayed("messages/count_tokens", "CountTokensRequest", 20)
test_embeddings = relayed("embeddings", "EmbeddingRequest", 20, EMBED)
test_tokenize = relayed("tokenize", "TokenizeRequest", 20)
test_detokenize = relayed("detokenize", "DetokenizeRequest", 12)


# Any id where a deployment or a model is named, and a valid body where there is one.
_IDS = st.sampled_from([*CHAT, *EMBED]) | st.sampled_from([*WORDS, "dep-chat/v1", "..", "%2F", "v1"]) | st.text(min_size=1, max_size=20)
_GETS = ["/v1/models/{}", "/v1/deployments/{}", "/v1/deployments/{}/models", "/v1/deployments/{}/v1/models"]
_POSTS = [*(p for name in ROUTES for p in relayed_paths(name) if "{deployment}" in p), "/v1/deployments/{}/wake"]


@budget(30)
@given(_IDS, st.sampled_from(_GETS + _POSTS))
def test_any_deployment_or_model_id(gateway, name, template):
    path = template.replace("{deployment}", "{}").format(quote(name, safe=""))
    if template in _GETS:
        check(gateway, path, None, method="GET")
        return
    route = next((r for r in ROUTES if path.endswith("/" + r)), "")
    body = json.dumps(SEEDS["MessagesRequest" if route in ANTHROPIC else "ChatCompletionRequest"][0]).encode()
    check(gateway, path, body, kind=KINDS.get(route, "json"), anthropic=_anthropic_route(path))


def _anthropic_route(path: str) -> bool:
    """Whether the path, as the server matches it (dot segments resolved, escapes but %2F and %25 decoded:
    aiohttp's `path_safe`), is one of the Anthropic routes. An id no route takes (a segment cannot hold
    { or }) is a plain 404 in OpenAI's shape."""
    sent = URL("http://gateway" + path).path_safe
    templates = [p for r in ANTHROPIC for p in relayed_paths(r)]
    return any(re.fullmatch(re.escape(t).replace(re.escape("{deployment}"), "[^{}/]+"), sent) for t in templates)


# --- keys ----------------------------------------------------------------------------

KEYS: list[dict[str, Any]] = [{"id": "limited", "key": "sk-limited", "deployments": [CHAT[0]], "rpm": 5}, {"id": "open", "key": "sk-open"}]


@pytest.fixture(scope="module")
def keyed() -> Iterator[LiveGateway]:
    server = LiveGateway(keys=KEYS)
    yield server
    server.close()


# Header values an HTTP client can send: printable Latin-1.
_HEADER_TEXT = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, blacklist_categories=["Cc"]), max_size=30)
_SECRETS = st.sampled_from(["sk-limited", "sk-open"]) | st.sampled_from(["sk-open ", " sk-limited", "sk-", "", "sk-open\t"]) | _HEADER_TEXT
_AUTH = st.one_of(
    st.builds(lambda scheme, secret: {"Authorization": f"{scheme}{secret}"}, st.sampled_from(["Bearer ", "bearer ", "Bearer  ", "Basic ", ""]), _SECRETS),
    st.builds(lambda secret: {"x-api-key": secret}, _SECRETS),
    st.just({}),
)
_KEYED = [("POST", p, r) for r in ("chat/completions", "messages", "embeddings", "tokenize") for p in relayed_paths(r)] + [
    ("GET", p, "") for p in ("/v1/models", "/v1/deployments", "/v1/models/fuzz-chat", "/v1/deployments/{deployment}")
]


@budget(40)
@given(_AUTH, st.sampled_from(_KEYED), st.sampled_from([CHAT, EMBED]))
def test_any_key(keyed, headers, where, deployment):
    method, path, route = where
    path = path.replace("{deployment}", deployment[1])
    if method == "GET":
        check(keyed, path, None, method="GET", headers=headers)
        return
    schema = {"messages": "MessagesRequest", "embeddings": "EmbeddingRequest", "tokenize": "TokenizeRequest"}.get(route, "ChatCompletionRequest")
    body = named(json.dumps(SEEDS[schema][0]).encode(), deployment[0])
    check(keyed, path, body, kind=KINDS.get(route, "json"), anthropic=route in ANTHROPIC, headers=headers)


# --- headers -------------------------------------------------------------------------

# The headers the gateway reads or passes on to the replica, with any value an HTTP client sends
# (printable, as UTF-8: also characters past Latin-1).
_NAMES = st.sampled_from(["anthropic-version", "anthropic-beta", "OpenAI-Beta", "X-Request-Id", "Content-Type", "Accept",
                          "Accept-Encoding", "User-Agent", "x-api-key", "Authorization", "Origin"])
_VALUES = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=40) | st.sampled_from(["2023-06-01", "gzip", "€", "é", "\t"])


@budget(30)
@given(st.dictionaries(_NAMES, _VALUES, max_size=4), st.sampled_from(["chat/completions", "messages", "tokenize"]), st.booleans())
def test_any_header(gateway, headers, route, stream):
    schema = {"messages": "MessagesRequest", "tokenize": "TokenizeRequest"}.get(route, "ChatCompletionRequest")
    body = json.dumps({**SEEDS[schema][0], "model": CHAT[0], "stream": stream}).encode()
    check(gateway, f"/v1/{route}", body, kind=KINDS.get(route, "json"), anthropic=route in ANTHROPIC, headers=headers)
