"""A chained turn's prompt as the previous response's own tokens plus the new tail.

Rendering the whole conversation again would turn the previous answer back into text
and re-tokenize it: the tokens can differ from those the model generated (a tokenizer
need not produce what the model wrote, and templates drop or reformat reasoning and tool
calls), so the prefix cache would stop matching inside the previous answer. Instead the
conversation is rendered with each stored output as a marker: the text before the
previous response's marker must be exactly that response's own prompt (checked by its
digest, `Continuation.key`), and then the new prompt is the stored tokens (its prompt
and everything it generated, reasoning included) followed by the tokens of the text
after the marker. Where that does not hold (another model, changed instructions or
tools, a template that renders history differently from a fresh turn, images), the
conversation is rendered and tokenized whole, as a stateless request is.
"""

from __future__ import annotations

import hashlib
import json

from edge_server.api.common.bounds.model_bounds import ModelBounds
from edge_server.api.http.errors import APIError
from edge_server.api.openai.chat.prompt import ChatPrompt, PromptRender, chat_prompt
from edge_server.api.openai.chat.protocol import ChatMessage
from edge_server.api.openai.responses.conversation import MARK_OPEN, output_marker
from edge_server.api.openai.responses.store import Continuation, StoredResponse
from edge_server.engine import Engine
from edge_server.engine.chat_template import RenderedChat


def prompt_key(text: str, literals: dict[str, str]) -> str:
    """Digest of a rendered prompt, with the control texts its sentinels stand for."""
    used = sorted((s, t) for s, t in literals.items() if s in text)
    return hashlib.sha256((text + json.dumps(used)).encode()).hexdigest()


class Continuing:
    """chat.serving.prepare's `make_prompt` for a Responses request. After it ran,
    `key` is the digest a follow-up turn checks (None: no follow-up can continue this
    prompt's tokens) and `continued` says whether the previous tokens were reused."""

    def __init__(self, engine: Engine, marked: list[ChatMessage] | None,
                 previous: StoredResponse | None) -> None:
        self.engine = engine
        # The conversation with stored outputs as markers; None: nothing stored before.
        self.marked = marked
        self.previous = previous
        self.key: str | None = None
        self.continued = False

    def __call__(self, messages: list[ChatMessage], render: PromptRender) -> ChatPrompt:
        if _has_images(self.marked or messages):  # image tokens are not kept: rendered whole
            return chat_prompt(*render(messages), self.engine)
        if self.marked is None:  # nothing stored before: the conversation itself
            rendered, images = render(messages)
            self.key = prompt_key(rendered.text, rendered.literals)
            return chat_prompt(rendered, images, self.engine)
        try:
            marked, _ = render(self.marked)
        except APIError:
            # A template may refuse the marked form (a tool answer after a plain
            # assistant message, say): the conversation itself is rendered instead.
            return chat_prompt(*render(messages), self.engine)
        self.key = prompt_key(marked.text, marked.literals)
        tokens = self._continued(marked)
        if tokens is None:
            return chat_prompt(*render(messages), self.engine)
        self.continued = True
        return ChatPrompt(marked.text, tokens)

    def _continued(self, marked: RenderedChat) -> list[int] | None:
        previous = self.previous
        stored: Continuation | None = previous.continuation if previous else None
        if previous is None or stored is None or stored.fingerprint != self.engine.fingerprint:
            return None
        marker = output_marker(previous.id)
        at = marked.text.find(marker)
        if at < 0:
            return None
        head, tail = marked.text[:at], marked.text[at + len(marker):]
        if MARK_OPEN in tail or prompt_key(head, marked.literals) != stored.key:
            return None
        # The engine made them, and its fingerprint is unchanged; checked all the same,
        # since a token outside the vocabulary would abort llama.cpp.
        ModelBounds.of(self.engine).check_vocabulary(stored.tokens, "previous_response_id")
        return stored.tokens + self.engine.tokenize_chat_tail(
            RenderedChat(tail, marked.literals))


def _has_images(messages: list[ChatMessage]) -> bool:
    return any(not isinstance(m.content, str) and m.content is not None
               and any(part.type == "image_url" for part in m.content) for m in messages)
