"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API.

`convert_anthropic.to_chat` translates, `core.prepare` builds as for chat (a `max_tokens` over what the
context leaves is lowered: Anthropic clients send a cap), and an `AnthropicEncoder` renders (with
`emit=False`, the non-stream sink). Errors are in Anthropic's shape on these routes
(`http.error_shapes`; in a stream, `event: error`). count_tokens renders through the same chat template,
so it equals what a create is billed for. A stream's `return_token_ids` and `continue_token_ids` are
chat's (generation.blocks); its tool_use ids follow from its message's id (`seed_of`), so a
continuation's equal the broken stream's.
"""

from __future__ import annotations

from aiohttp import web

from streamproxy.apis.anthropic import convert as C
from streamproxy.apis.anthropic.protocol import TokenCount, decode_count_request, decode_request, encode
from streamproxy.apis.anthropic.stream import AnthropicEncoder
from streamproxy.core.blockstream import seed_of
from streamproxy.core.prepare import prepare, prompt, renamed
from streamproxy.http.context import CONTEXT
from streamproxy.http.routes import generation
from streamproxy.http.routes.body import decode_body
from streamproxy.http.state import app_state


async def messages(request: web.Request) -> web.StreamResponse:
    state = app_state(request)
    req = await decode_body(request, decode_request)
    engine = state.require_engine(req.model)
    with renamed(C.CHAT_NAMES):
        chat = C.to_chat(req)
        prep = prepare(state.settings, engine, chat, cap_to_context=True)
    prep.params.adapter = state.adapter(req.model)
    message_id = "msg_" + request[CONTEXT].request_id
    model = req.model or engine.info.name
    filters, stops, capped, seed = prep.filters, req.stop_sequences, prep.window_capped, seed_of(message_id)

    def encoder(emit: bool) -> AnthropicEncoder:
        return AnthropicEncoder(message_id=message_id, model=model, filters=filters, stop_sequences=stops, window_capped=capped, emit=emit,
                                id_seed=seed)

    engine_prompt, pieces = generation.block_continuation(req, prep.params, engine, prep.prompt_ids)
    work = generation.Work(engine, [engine_prompt], [prep.params], continued=len(req.continue_token_ids or ()))
    answer = generation.blocks(encoder, AnthropicEncoder.final_json, req, prep.prompt_ids, pieces)
    return await generation.run(request, work, answer, req.stream)


async def count_tokens(request: web.Request) -> web.Response:
    state = app_state(request)
    req = await decode_body(request, decode_count_request)
    engine = state.require_engine(req.model)
    with renamed(C.CHAT_NAMES):
        _, ids = prompt(state.settings, engine, C.to_chat(req), counting=True)
    return web.Response(body=encode(TokenCount(input_tokens=len(ids))), content_type="application/json")

