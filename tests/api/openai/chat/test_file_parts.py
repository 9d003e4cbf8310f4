"""Chat `file` content parts (`{"type": "file", "file": {"file_data", "filename"}}`): the
file's text reaches the prompt as `<filename>:\\n<text>`, exactly as the Responses
door's `input_file` does (the prompt's token count equals that of the text sent as a
text part); unreadable files are a 400 naming the part."""

from __future__ import annotations

from typing import Any

import httpx
from conftest import DEFAULT_MODEL

from edge_testkit.documents import data_url, tiny_pdf

LINES = ["Chapter one.", "It was a dark (and stormy) night."]


def prompt_tokens(http: httpx.Client, parts: list[dict[str, Any]]) -> int:
    r = http.post("/v1/chat/completions", json={
        "model": DEFAULT_MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": parts}]})
    assert r.status_code == 200, r.text
    return int(r.json()["usage"]["prompt_tokens"])


def test_a_pdf_file_part_is_the_text_of_its_pages(http: httpx.Client) -> None:
    file = {"type": "file", "file": {"filename": "story.pdf", "file_data": data_url(
        tiny_pdf([LINES]), "application/pdf")}}
    question = {"type": "text", "text": "Summarise it."}
    assert prompt_tokens(http, [file, question]) == prompt_tokens(http, [
        {"type": "text", "text": "story.pdf:\n" + "\n".join(LINES)}, question])


def test_a_file_part_without_data_is_refused_by_name(http: httpx.Client) -> None:
    r = http.post("/v1/chat/completions", json={
        "model": DEFAULT_MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "Read it."},
            {"type": "file", "file": {"file_id": "file-abc"}}]}]})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "messages[0].content[1].file" and "file_data" in error["message"]
