"""Ollama's answers: NDJSON streams, the objects of an answer (Answer: content,
`thinking`, tool calls whose arguments are objects; a call is sent whole once the model
has written it), and the object that ends every answer with the durations
(nanoseconds) and counts Ollama reports. Streamed and whole answers both go through
Answer, so both give the same content.

An error after a stream began travels as a line of its own, `{"error": "..."}`, which
Ollama's clients raise.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from starlette.responses import StreamingResponse

from edge_server.api.common.logprobs_format import chat_logprobs
from edge_server.api.common.sse import EngineStream
from edge_server.api.http.errors import APIError
from edge_server.api.openai.chat.choice_output import ChoiceOutput
from edge_server.engine import ChoiceDelta, Usage
from edge_server.engine.backend.vocab import Vocab
from edge_server.engine.request import RequestHandle

NDJSON = "application/x-ndjson"


def created_at() -> str:
    """RFC 3339 in UTC, as Ollama writes `created_at`."""
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def line(payload: dict[str, Any]) -> str:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")) + "\n"


@dataclass
class Clock:
    """When each stage of one request was reached (time.monotonic_ns)."""

    received: int = field(default_factory=time.monotonic_ns)
    loaded: int = 0  # the model's lease held (after loading it, if it was not)
    submitted: int = 0
    first_token: int = 0

    def mark_loaded(self) -> None:
        self.loaded = time.monotonic_ns()

    def mark_submitted(self) -> None:
        self.submitted = time.monotonic_ns()

    def saw_token(self) -> None:
        if not self.first_token:
            self.first_token = time.monotonic_ns()

    def durations(self, usage: Usage) -> dict[str, int]:
        end = time.monotonic_ns()
        loaded = self.loaded or self.received
        submitted = self.submitted or loaded
        first = self.first_token or end
        return {
            "total_duration": end - self.received,
            "load_duration": loaded - self.received,
            "prompt_eval_count": usage.prompt_tokens,
            "prompt_eval_duration": first - submitted,
            "eval_count": usage.completion_tokens,
            "eval_duration": end - first,
        }


    def durations_embedding(self, tokens: int) -> dict[str, int]:
        end = time.monotonic_ns()
        return {"total_duration": end - self.received,
                "load_duration": (self.loaded or self.received) - self.received,
                "prompt_eval_count": tokens}


def ndjson_stream(lines: AsyncIterator[str], handles: list[RequestHandle] | None = None
                  ) -> StreamingResponse:
    """NDJSON lines whose engine work is cancelled however sending ends."""
    return EngineStream(lines, handles or [], media_type=NDJSON)


async def with_error_line(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    try:
        async for text in lines:
            yield text
    except APIError as exc:
        yield line({"error": exc.message})


@dataclass
class _Call:
    id: str
    name: str
    arguments: list[str] = field(default_factory=list)

    def as_ollama(self, index: int) -> dict[str, Any]:
        try:
            value = json.loads("".join(self.arguments) or "{}")
        except ValueError:  # cut off by num_predict
            value = {}
        return {"id": self.id, "function": {"index": index, "name": self.name,
                                            "arguments": value if isinstance(value, dict)
                                            else {}}}


class Answer:
    """`chat`: pieces go in `message`; else (generate) in `response`."""

    def __init__(self, *, chat: bool, model: str, output: ChoiceOutput, vocab: Vocab,
                 logprobs: bool) -> None:
        self.chat = chat
        self.model = model
        self.output = output
        self.vocab = vocab
        self.logprobs = logprobs
        self.content: list[str] = []
        self.thinking: list[str] = []
        self.calls: list[_Call] = []
        self._sent_calls = 0
        self.token_ids: list[int] = []
        self.scores: list[dict[str, Any]] = []
        self.finish_reason: str | None = None

    def feed(self, delta: ChoiceDelta) -> dict[str, Any] | None:
        """A streamed object for the new text, or None while nothing is known yet."""
        self.token_ids += delta.token_ids
        scores = (chat_logprobs(delta.logprobs, self.vocab)["content"]
                  if self.logprobs and delta.logprobs else [])
        self.scores += scores
        pieces = self.output.push(delta.text)
        if delta.finish_reason is not None:
            pieces += self.output.finish()
            self.finish_reason = delta.finish_reason
        content, thinking = self._read(pieces)
        calls = self._complete_calls(final=delta.finish_reason is not None)
        if not (content or thinking or calls or scores):
            return None
        return self._object(content, thinking, calls, scores, done=False)

    def _read(self, pieces: list[dict[str, Any]]) -> tuple[str, str]:
        content, thinking = [], []
        for piece in pieces:
            thinking.append(piece.get("reasoning_content") or "")
            content.append(piece.get("content") or "")
            for call in piece.get("tool_calls") or ():
                function = call.get("function", {})
                if "id" in call:
                    self.calls.append(_Call(call["id"], function.get("name", "")))
                elif self.calls and function.get("arguments"):
                    self.calls[-1].arguments.append(function["arguments"])
        self.content += content
        self.thinking += thinking
        return "".join(content), "".join(thinking)

    def _complete_calls(self, *, final: bool) -> list[dict[str, Any]]:
        """Calls the model has finished: all but the one being written, all at the end."""
        done = len(self.calls) if final else max(0, len(self.calls) - 1)
        out = [call.as_ollama(i) for i, call in enumerate(self.calls[self._sent_calls:done],
                                                          start=self._sent_calls)]
        self._sent_calls = max(self._sent_calls, done)
        return out

    def _object(self, content: str, thinking: str, calls: list[dict[str, Any]],
                scores: list[dict[str, Any]], *, done: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "created_at": created_at()}
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if thinking:
                message["thinking"] = thinking
            if calls:
                message["tool_calls"] = calls
            body["message"] = message
        else:
            body["response"] = content
            if thinking:
                body["thinking"] = thinking
        body["done"] = done
        if scores:
            body["logprobs"] = scores
        return body

    def final(self, *, whole: bool, durations: dict[str, int],
              context: list[int] | None) -> dict[str, Any]:
        """The object that ends the answer; `whole` (not streamed): with all it said."""
        if whole:
            calls = [call.as_ollama(i) for i, call in enumerate(self.calls)]
            body = self._object("".join(self.content), "".join(self.thinking), calls,
                                self.scores, done=True)
        else:
            body = self._object("", "", [], [], done=True)
        # A call ends the turn as "stop" in Ollama's terms; a cut-off answer is "length".
        body["done_reason"] = "length" if self.finish_reason == "length" else "stop"
        if context is not None:
            body["context"] = context + self.token_ids
        body.update(durations)
        return body
