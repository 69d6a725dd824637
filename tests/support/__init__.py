"""Helpers shared by every test folder (tests/README.md says who owns what).

    sse            the one SSE parser: frames, data, JSON payloads, named events
    openai_schema  OpenAI's response shapes, from the openai SDK's models: validate, errors, validator_with
    api_events     Responses and Anthropic event streams against the SDKs' own models
    fake           USER_HI and what the fake engine makes of it; hold_start (an engine left loading)
    chat           schema-checked chat chunks, reassembled as a client does
    push           a spy on the writer's push sink
    openapi_doc    checks serve's and the gateway's /openapi.json tests share (valid 3.1, refs, the app's routes)

Import them absolutely, e.g. `from tests.support import sse, wait_until`. What the benchmarks need too
(server processes, wait_until, the fakes) is in harness/ (its __init__ lists it); wait_until and
wait_until_sync are also here, as harness.waiting has them.
"""

from harness.waiting import wait_until, wait_until_sync
from tests.support import sse
from tests.support.fake import USER_HI, USER_HI_PROMPT_TOKENS
from tests.support.openai_schema import errors as schema_errors
from tests.support.openai_schema import validate

__all__ = ["USER_HI", "USER_HI_PROMPT_TOKENS", "schema_errors", "sse", "validate", "wait_until", "wait_until_sync"]
