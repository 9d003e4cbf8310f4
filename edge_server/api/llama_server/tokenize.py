"""POST /tokenize, /detokenize and /apply-template (as llama.cpp's server has them):
clients count tokens, find ids for logit_bias and see the prompt a chat becomes without
a tokenizer or template engine of their own. `model` is optional: the default model.

/tokenize takes either `content` (raw text; `parse_special: false` reads control-token
text such as `<|im_end|>` as plain text) or chat `messages` (and `tools`), which give
exactly the prompt tokens /v1/chat/completions would evaluate for them (as vLLM's
/tokenize does). `with_pieces: true` gives each token as `{id, piece}`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, field_validator, model_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edge_server.api.common.bounds.model_bounds import ModelBounds
from edge_server.api.common.bounds.prompt_bounds import check_prompt_bytes, check_token_count
from edge_server.api.common.image_input.image_fetch import fetch_image_urls, fetched_images
from edge_server.api.http.dependencies import leased_model, off_loop, parse_body, serve_with_model
from edge_server.api.http.limits import MAX_MESSAGES, MAX_TOOLS, token_ids
from edge_server.api.openai.chat.prompt import chat_prompt, render_chat, shown_text
from edge_server.api.openai.chat.protocol import ChatMessage, TemplateKwargs, Tool
from edge_server.catalogue.default_model import DEFAULT_ALIAS
from edge_server.engine import Engine
from edge_server.engine.chat_template import RenderedChat
from edge_server.engine.multimodal.projector import Media


class ChatInput(BaseModel):
    """A chat as /v1/chat/completions takes it, for the template alone."""

    model: str = DEFAULT_ALIAS
    messages: list[ChatMessage] | None = Field(default=None, min_length=1, max_length=MAX_MESSAGES)
    tools: list[Tool] | None = Field(default=None, max_length=MAX_TOOLS)
    add_generation_prompt: bool = True
    enable_thinking: bool | None = None  # None: the template's own default
    chat_template_kwargs: TemplateKwargs | None = None

    def render(self, engine: Engine) -> tuple[RenderedChat, dict[str, Media]]:
        assert self.messages is not None
        asked = {} if self.enable_thinking is None else {"enable_thinking": self.enable_thinking}
        return render_chat(self.messages, engine, self.tools or [],
                           add_generation_prompt=self.add_generation_prompt,
                           template_kwargs={**asked, **(self.chat_template_kwargs or {})})

    def shown(self, engine: Engine) -> str:
        """The rendered text only: nothing is tokenized or evaluated."""
        return shown_text(*self.render(engine))


class ApplyTemplateRequest(ChatInput):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)


class ApplyTemplateResponse(BaseModel):
    prompt: str


class TokenizeRequest(ChatInput):
    content: str | None = None
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False  # llama-server's: each token as {id, piece}

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.content is None) == (self.messages is None):
            raise ValueError("give either `content` or `messages`")
        return self


class DetokenizeRequest(BaseModel):
    model: str = DEFAULT_ALIAS
    tokens: list[int]

    @field_validator("tokens", mode="plain")
    @classmethod
    def _tokens(cls, v: Any) -> list[int]:
        return token_ids(v)


def _tokens(body: TokenizeRequest, engine: Engine) -> list[int]:
    if body.messages is not None:
        prompt = chat_prompt(*body.render(engine), engine)
        check_token_count(len(prompt.tokens), engine, "messages")
        return prompt.tokens
    assert body.content is not None
    # Bounded as prompts are: text that cannot fit the context is refused untokenized.
    check_prompt_bytes(body.content, engine, "content")
    tokens = engine.tokenize(
        body.content, add_special=body.add_special, parse_special=body.parse_special
    )
    check_token_count(len(tokens), engine, "content")
    return tokens


def with_pieces(tokens: list[int], engine: Engine) -> list[dict[str, Any]]:
    """llama-server's `{id, piece}` objects: the piece as text where its bytes are valid
    UTF-8, else as the list of its bytes (a token may hold part of a character)."""
    out: list[dict[str, Any]] = []
    for token in tokens:
        data = engine.vocab.token_bytes(token)
        try:
            piece: str | list[int] = data.decode("utf-8")
        except UnicodeDecodeError:
            piece = list(data)
        out.append({"id": token, "piece": piece})
    return out


def _tokenized(body: TokenizeRequest, engine: Engine) -> list[int] | list[dict[str, Any]]:
    tokens = _tokens(body, engine)
    return with_pieces(tokens, engine) if body.with_pieces else tokens


def _content(body: DetokenizeRequest, engine: Engine) -> str:
    ModelBounds.of(engine).check_token_ids(body.tokens, "tokens")
    return engine.vocab.detokenize(body.tokens)


async def tokenize(request: Request) -> Response:
    body = await parse_body(request, TokenizeRequest)
    async with leased_model(request, body.model) as lease:
        with fetched_images(await fetch_image_urls(body, lease.engine)):
            tokens = await off_loop(_tokenized, body, lease.engine)
        return lease.answer(JSONResponse({"tokens": tokens}))


async def detokenize(request: Request) -> Response:
    body = await parse_body(request, DetokenizeRequest)

    async def serve(engine: Engine) -> Response:
        return JSONResponse({"content": await off_loop(_content, body, engine)})

    return await serve_with_model(request, body.model, serve)


async def apply_template(request: Request) -> Response:
    body = await parse_body(request, ApplyTemplateRequest)
    async with leased_model(request, body.model) as lease:
        # Image URLs are fetched on the fetch threads first, as chat's are: a slow server
        # never holds a preparation thread.
        with fetched_images(await fetch_image_urls(body, lease.engine)):
            prompt = await off_loop(body.shown, lease.engine)
        return lease.answer(JSONResponse(ApplyTemplateResponse(prompt=prompt).model_dump()))


routes = [
    Route("/tokenize", tokenize, methods=["POST"]),
    Route("/detokenize", detokenize, methods=["POST"]),
    Route("/apply-template", apply_template, methods=["POST"]),
]
