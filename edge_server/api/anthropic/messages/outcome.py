"""How an answer ended and what it used, in Anthropic's terms."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from edge_server.api.anthropic.messages.protocol import MessagesUsage
from edge_server.api.openai.chat.choice_output import ChoiceOutput
from edge_server.engine import FinishReason, Usage


def message_id() -> str:
    return f"msg_{uuid.uuid4().hex[:24]}"


def messages_usage(usage: Usage) -> dict[str, int]:
    # Anthropic counts prompt tokens read from a cache apart from input_tokens.
    return MessagesUsage(
        input_tokens=usage.prompt_tokens - usage.cached_tokens,
        output_tokens=usage.completion_tokens,
        cache_read_input_tokens=usage.cached_tokens,
    ).model_dump()


@dataclass
class StopReading:
    """Reads which stop sequence ended the answer: the engine keeps it in the text
    (include_stop), and it is cut here."""

    stops: list[str]
    matched: str | None = None

    def cut(self, text: str, finish_reason: FinishReason | None) -> str:
        if finish_reason != "stop" or not self.stops:
            return text
        # The earliest match ends the text; of stops ending there, the longest began first.
        for stop in sorted(self.stops, key=len, reverse=True):
            if text.endswith(stop):
                self.matched = stop
                return text[: len(text) - len(stop)]
        return text

    def stop_reason(self, output: ChoiceOutput, finish_reason: FinishReason | None) -> str:
        reason = output.finish_reason(finish_reason)
        if reason == "length":
            return "max_tokens"
        if reason == "tool_calls":
            return "tool_use"
        return "stop_sequence" if self.matched is not None else "end_turn"
