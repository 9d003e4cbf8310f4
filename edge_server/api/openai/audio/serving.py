"""Transcriptions and translations: the clip decoded and checked (common/audio_input),
then a chat turn of the model's own template that asks for its words at the request's
temperature, as Ollama serves them: the clip as audio tokens, the instruction after it.

The model writes the text; nothing here knows the words. A transcript ends by
TOKENS_PER_SECOND of audio (plus a little), more than any speech needs (Whisper's own
decoder stops at 224 tokens a 30-second window): a model that never ends its turn
cannot run on to the context's end. verbose_json's one segment is
the whole clip (the model writes no timestamps), its avg_logprob the answer's mean token
logprob and its compression_ratio Whisper's (bytes over zlib-compressed bytes).
"""

from __future__ import annotations

import json
import math
import secrets
import zlib
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from edge_server.api.common.audio_input.audio import decode_audio_bytes
from edge_server.api.common.serving import (
    cancel_on_disconnect,
    collect,
    stream_deltas,
    submit,
    wait_started,
)
from edge_server.api.common.sse import sse_event, sse_response, sse_with_errors
from edge_server.api.http.dependencies import off_loop
from edge_server.api.http.errors import unsupported
from edge_server.api.openai.audio.protocol import (
    Task,
    TokenUsageDetails,
    Transcription,
    TranscriptionDurationUsage,
    TranscriptionRequest,
    TranscriptionSegment,
    TranscriptionTokenUsage,
    TranscriptionVerbose,
)
from edge_server.api.openai.chat.prompt import ChatPrompt, PromptRender, chat_prompt
from edge_server.api.openai.chat.protocol import ChatCompletionRequest, ChatMessage
from edge_server.api.openai.chat.serving import PreparedChat, prepare
from edge_server.engine import Engine
from edge_server.engine.multimodal.audio import PcmAudio
from edge_server.engine.request import RequestHandle

TOKENS_PER_SECOND = 12
_TOKENS_ANY_CLIP = 32


def answer_bound(clip: PcmAudio) -> int:
    """Most tokens a transcript of `clip` may take."""
    return _TOKENS_ANY_CLIP + math.ceil(TOKENS_PER_SECOND * clip.seconds)


def instruction(task: Task, language: str | None, context: str | None) -> str:
    """What the model is asked after the clip."""
    if task == "translate":
        text = "Translate the speech in this audio into English. Write only the translation."
    else:
        text = "Transcribe the speech in this audio exactly as spoken. Write only the words."
        if language:
            text += f" The speech is in the language with code {language}."
    if context:
        text += f" Follow the spelling and style of this earlier text: {context}"
    return text


def _prepared(req: TranscriptionRequest, task: Task, clip: PcmAudio,
              engine: Engine) -> PreparedChat:
    """The chat request: one user turn, the clip (a sentinel standing in the text as
    chat images do, replaced by its audio tokens) and the instruction."""
    key = f"\ue000audio-{secrets.token_hex(8)}-0\ue001"
    chat = ChatCompletionRequest(
        model=req.model, temperature=req.temperature, stream=req.stream,
        logprobs=req.response_format == "verbose_json",
        messages=[ChatMessage(role="user", content=key + "\n" + instruction(
            task, req.language, req.prompt))])

    def make_prompt(messages: list[ChatMessage], render: PromptRender) -> ChatPrompt:
        rendered, media = render(messages)
        return chat_prompt(rendered, {**media, key: clip}, engine)

    prepared = prepare(chat, engine, make_prompt)
    prepared.request.max_tokens = min(prepared.request.max_tokens, answer_bound(clip))
    return prepared


class TranscriptionServing:
    async def create(self, req: TranscriptionRequest, task: Task, engine: Engine,
                     http: Request) -> Response:
        if "audio" not in engine.modalities or engine.projector is None:
            raise unsupported("model", f"({engine.model_id!r}) reads no audio: it needs a "
                              "multimodal projector with an audio encoder (--mmproj)")
        clip = await off_loop(decode_audio_bytes, req.file, None, engine.settings.audio_limits,
                              engine.projector.sample_rate, "file")
        prepared = await off_loop(_prepared, req, task, clip, engine)
        handle = submit(engine, prepared.request, http)
        if req.stream:
            await wait_started(http, [handle])
            events = _events(http, handle)
            return sse_response(sse_with_errors(events), [handle])
        async with cancel_on_disconnect(http, [handle]):
            [result] = await collect(handle, 1)
        text = result.text.strip()
        if req.response_format == "text":
            return PlainTextResponse(text)
        if req.response_format == "verbose_json":
            mean = result.mean_logprob if result.logprobs else 0.0
            raw = text.encode()
            segment = TranscriptionSegment(
                id=0, seek=0, start=0.0, end=round(clip.seconds, 3), text=text,
                tokens=result.token_ids, temperature=req.temperature, avg_logprob=mean,
                compression_ratio=len(raw) / len(zlib.compress(raw)) if raw else 0.0,
                no_speech_prob=0.0)
            body: Any = TranscriptionVerbose(
                task=task, language=req.language or "unknown",
                duration=round(clip.seconds, 3), text=text, segments=[segment],
                usage=TranscriptionDurationUsage(seconds=round(clip.seconds, 3)))
        else:
            body = Transcription(text=text, usage=token_usage(handle))
        return Response(json.dumps(body.model_dump(), ensure_ascii=False),
                        media_type="application/json")


def token_usage(handle: RequestHandle) -> TranscriptionTokenUsage:
    usage = handle.usage
    return TranscriptionTokenUsage(
        input_tokens=usage.prompt_tokens,
        input_token_details=TokenUsageDetails(
            text_tokens=usage.prompt_tokens - usage.audio_tokens,
            audio_tokens=usage.audio_tokens),
        output_tokens=usage.completion_tokens,
        total_tokens=usage.prompt_tokens + usage.completion_tokens)


async def _events(http: Request, handle: RequestHandle) -> AsyncIterator[str]:
    """OpenAI's transcript events: a `transcript.text.delta` per piece of text, then
    `transcript.text.done` with the whole text and the usage."""
    parts: list[str] = []
    async with cancel_on_disconnect(http, [handle]):
        async for delta in stream_deltas(handle):
            text = delta.text if parts else delta.text.lstrip()
            if text:
                parts.append(text)
                yield sse_event({"type": "transcript.text.delta", "delta": text})
        yield sse_event({"type": "transcript.text.done", "text": "".join(parts).rstrip(),
                         "usage": token_usage(handle).model_dump()})
