"""The reasoning splitter on its own: tags left out of both parts, a prose opening
(Apriel's "Here are my reasoning steps:") kept as the reasoning's first words whether
the prompt or the model wrote it, as llama.cpp's test-chat.cpp expects; streamed one
character at a time or whole, the same split."""

from __future__ import annotations

import pytest

from edge_server.api.openai.chat.reasoning import ReasoningSplitter

APRIEL = ("Here are my reasoning steps:\n", "[BEGIN FINAL RESPONSE]")


def split(text: str, *, opened: bool, markers: tuple[str, str],
          streamed: bool) -> tuple[str, str]:
    splitter = ReasoningSplitter(starts_inside=opened, markers=markers)
    parts = [splitter.push(c) for c in text] if streamed else [splitter.push(text)]
    parts.append(splitter.finish())
    return "".join(r for r, _ in parts), "".join(c for _, c in parts)


@pytest.mark.parametrize("streamed", [False, True])
def test_tags_are_in_neither_part(streamed: bool) -> None:
    assert split("<think>hmm</think>\n\nHi", opened=False, markers=("<think>", "</think>"),
                 streamed=streamed) == ("hmm", "Hi")
    assert split("hmm</think>Hi", opened=True, markers=("<think>", "</think>"),
                 streamed=streamed) == ("hmm", "Hi")


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("opened", [True, False])
def test_a_prose_opening_stays_in_the_reasoning(streamed: bool, opened: bool) -> None:
    written = "" if opened else APRIEL[0]
    reasoning, content = split(written + "I'm\nthinking\n[BEGIN FINAL RESPONSE]\nHello!",
                               opened=opened, markers=APRIEL, streamed=streamed)
    assert reasoning.strip() == "Here are my reasoning steps:\nI'm\nthinking"
    assert content == "Hello!"
