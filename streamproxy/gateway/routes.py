"""The gateway's route table: which paths relay what, in one place for the app and its OpenAPI document.

Every route `serve` has is here three times: `/v1/...` (the deployment
named by the body's `model`), `/v1/deployments/{deployment}/...`, and
`/v1/deployments/{deployment}/v1/...` (clients that append `/v1/...` to a
base URL); tokenize and detokenize also at the root, as `serve` has them.
`app.add_routes` registers these paths and `openapi` describes them.
"""

from __future__ import annotations

from streamproxy.apis.anthropic.spec import ANTHROPIC
from streamproxy.apis.responses.spec import RESPONSES
from streamproxy.apis.spec import OPENAI
from streamproxy.gateway.call import Route

# The path under /v1/ (or the root, for tokenize) -> what the replica is asked.
ROUTES: dict[str, Route] = {
    "chat/completions": Route("/v1/chat/completions", OPENAI, True),
    "completions": Route("/v1/completions", OPENAI, True),
    "responses": Route("/v1/responses", RESPONSES, True),
    "messages": Route("/v1/messages", ANTHROPIC, True),
    "messages/count_tokens": Route("/v1/messages/count_tokens", ANTHROPIC, False),
    "embeddings": Route("/v1/embeddings", OPENAI, False),
    "tokenize": Route("/tokenize", OPENAI, False),
    "detokenize": Route("/detokenize", OPENAI, False),
}
# Where a deployment is named by the path instead of the body's `model`.
DEPLOYMENT_PREFIXES = ("/v1/deployments/{deployment}", "/v1/deployments/{deployment}/v1")
# GET: the deployments the request's key may see (under a prefix: that one only).
MODELS_PATHS = ("/v1/models", *(prefix + "/models" for prefix in DEPLOYMENT_PREFIXES))


def relayed_paths(name: str) -> list[str]:
    """The paths of the relayed route `name` (a key of ROUTES)."""
    paths = [f"/v1/{name}", *(f"{prefix}/{name}" for prefix in DEPLOYMENT_PREFIXES)]
    if name in ("tokenize", "detokenize"):
        paths.append(f"/{name}")
    return paths
