"""POST /tokenize and /detokenize (as llama.cpp's server has them): clients count tokens
and find ids for logit_bias without a tokenizer of their own."""

from __future__ import annotations

from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..engine import Engine
from .dependencies import parse_body, serve_with_model
from .serving_common import check_prompt_tokens


class TokenizeRequest(BaseModel):
    model: str
    content: str
    add_special: bool = False


class DetokenizeRequest(BaseModel):
    model: str
    tokens: list[int] = Field(max_length=1_000_000)


async def tokenize(request: Request) -> Response:
    body = await parse_body(request, TokenizeRequest)

    async def serve(engine: Engine) -> Response:
        return JSONResponse(
            {"tokens": engine.tokenize(body.content, add_special=body.add_special)})

    return await serve_with_model(request, body.model, serve)


async def detokenize(request: Request) -> Response:
    body = await parse_body(request, DetokenizeRequest)

    async def serve(engine: Engine) -> Response:
        check_prompt_tokens(body.tokens, engine, "tokens")
        return JSONResponse({"content": engine.vocab.detokenize(body.tokens)})

    return await serve_with_model(request, body.model, serve)


routes = [
    Route("/tokenize", tokenize, methods=["POST"]),
    Route("/detokenize", detokenize, methods=["POST"]),
]
