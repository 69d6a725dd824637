"""Completions request preparation: prompt(s) -> token ids, engine params, echo.

Each prompt of `prompt` (one or a batch) is tokenized or checked against the vocabulary and gets its
own params (an omitted `max_tokens` is the rest of its context; too long: a 400 naming which prompt),
and becomes one engine request, choices numbered prompt x n + choice, as vLLM does. `echo` keeps each
prompt's text for `core.echo.Echo`; `max_tokens: 0` (echo only) asks for one token, dropped. Prompt
logprobs: `prompt_logprobs`, or with echo `logprobs` (vLLM's rule). `best_of` other than `n` is a 400.
Sans-IO: the engine is only asked to tokenize and detokenize.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine_adapter.base import Engine, GenerationParams
from streamproxy.core import params as P
from streamproxy.core import structured as S
from streamproxy.core.echo import Echo
from streamproxy.errors import InvalidRequest
from streamproxy.protocol.openai_completions import CompletionRequest


@dataclass(slots=True)
class CompletionPlan:
    prompts: list[list[int]]  # token ids, one list per prompt
    params: list[GenerationParams]  # one per prompt (max_tokens may differ)
    texts: list[str] | None  # echo: each prompt's text
    prompt_only: bool  # echo with max_tokens 0: the prompt is the whole text

    @property
    def n(self) -> int:
        return self.params[0].n

    @property
    def choices(self) -> int:
        return len(self.prompts) * self.n

    @property
    def logprobs(self) -> bool:
        return self.params[0].logprobs is not None

    @property
    def prompt_logprobs(self) -> bool:
        return self.params[0].prompt_logprobs is not None

    def echo(self, i: int) -> Echo | None:
        """Prompt i's echo transform (None without echo)."""
        if self.texts is None:
            return None
        return Echo(self.texts[i], self.n, prompt_only=self.prompt_only, logprobs=self.logprobs)


def _check_best_of(req: CompletionRequest) -> None:
    n = P.choices(req)
    if req.best_of is None or req.best_of == n:
        return
    if req.best_of < n:
        raise InvalidRequest(f"'best_of' ({req.best_of}) must be at least 'n' ({n})", param="best_of")
    raise InvalidRequest(
        "'best_of' greater than 'n' is not supported: the engine cannot generate candidates to choose from "
        "(vLLM's engine has no best_of); ask for 'n' choices with 'logprobs' and rank them yourself",
        param="best_of",
    )


def _prompt_ids(engine: Engine, prompt: str | list[int], where: str) -> list[int]:
    if isinstance(prompt, str):
        ids = engine.encode(prompt)
        if not ids:
            raise InvalidRequest(f"{where} is empty", param="prompt")
        return ids
    vocab = engine.info.vocab_size
    if any(t < 0 or (vocab is not None and t >= vocab) for t in prompt):
        raise InvalidRequest(f"{where}: token ids must be within the vocabulary (0 .. {(vocab or 0) - 1})", param="prompt")
    return list(prompt)


def plan(engine: Engine, req: CompletionRequest, *, max_n: int) -> CompletionPlan:
    if req.suffix:
        raise InvalidRequest("'suffix' is not supported", param="suffix")
    _check_best_of(req)
    prompts = P.completion_prompts(req.prompt)
    prompt_only = bool(req.echo) and req.max_tokens == 0
    if req.max_tokens == 0 and not req.echo:
        raise InvalidRequest("'max_tokens' must be at least 1 (0 only with 'echo': the prompt alone)", param="max_tokens")
    logprobs = P.completion_logprobs(req)
    prompt_logprobs = P.prompt_logprobs(req)
    if prompt_logprobs is None and req.echo:
        prompt_logprobs = logprobs
    structured = S.constraint(req)
    info = engine.info
    ids: list[list[int]] = []
    params: list[GenerationParams] = []
    for i, prompt in enumerate(prompts):
        where = "the prompt" if len(prompts) == 1 else f"prompt {i} of the list"
        prompt_ids = _prompt_ids(engine, prompt, where)
        try:
            p = P.sampling_params(
                req,
                prompt_len=len(prompt_ids),
                max_model_len=info.max_model_len,
                requested_max_tokens=1 if prompt_only else req.max_tokens,
                max_n=max_n,
                vocab_size=info.vocab_size,
                logprobs=logprobs,
            )
        except InvalidRequest as exc:
            if len(prompts) > 1 and exc.param in ("prompt", "max_tokens"):
                exc.message = f"prompt {i} of the list: {exc.message}"
                exc.args = (exc.message,)
            raise
        p.prompt_logprobs = prompt_logprobs
        p.structured = structured
        ids.append(prompt_ids)
        params.append(p)
    texts = None
    if req.echo:
        texts = [p if isinstance(p, str) else engine.decode(p) for p in prompts]
    return CompletionPlan(ids, params, texts, prompt_only)
