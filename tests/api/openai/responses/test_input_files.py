"""`input_file` parts on /v1/responses: a PDF's text (read with pypdf) and a text file's
text reach the prompt as `<filename>:\\n<text>`, exactly (the token count equals that of
the same text sent as `input_text`); other types, `file_id`, `file_url`, broken data and
files past the bounds are a 400 naming the part."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from conftest import DEFAULT_MODEL

from edge_server.api.common.documents import MAX_PDF_PAGES
from edge_testkit.documents import data_url, tiny_pdf

LINES = ["The secret word is PELICAN.", "Nothing (else) here."]


def count(http: httpx.Client, parts: list[dict[str, Any]]) -> int:
    r = http.post("/v1/responses/input_tokens", json={
        "model": DEFAULT_MODEL, "input": [{"role": "user", "content": parts}]})
    assert r.status_code == 200, r.text
    return int(r.json()["input_tokens"])


def text_part(text: str) -> dict[str, Any]:
    return {"type": "input_text", "text": text}


def file_part(data: bytes, media_type: str, filename: str) -> dict[str, Any]:
    return {"type": "input_file", "filename": filename,
            "file_data": data_url(data, media_type)}


def test_a_pdf_is_read_as_the_text_of_its_pages(http: httpx.Client) -> None:
    pdf = tiny_pdf([LINES, ["Page two."]])
    question = text_part("What is the secret word?")
    with_file = count(http, [file_part(pdf, "application/pdf", "notes.pdf"), question])
    as_text = count(http, [text_part("notes.pdf:\n" + "\n".join(LINES) + "\n\nPage two."),
                           question])
    assert with_file == as_text
    r = http.post("/v1/responses", json={
        "model": DEFAULT_MODEL, "max_output_tokens": 2,
        "input": [{"role": "user", "content": [
            file_part(pdf, "application/pdf", "notes.pdf"), question]}]})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["input_tokens"] == with_file


def test_a_text_file_is_its_text(http: httpx.Client) -> None:
    body = "name,age\nada,36\n"
    assert count(http, [file_part(body.encode(), "text/csv", "people.csv")]) == \
        count(http, [text_part("people.csv:\n" + body)])


@pytest.mark.parametrize(("part", "words"), [
    (file_part(b"\x89PNG\r\n", "image/png", "x.png"), "(image/png) is not served"),
    ({"type": "input_file", "file_id": "file-123"}, "needs `file_data`"),
    ({"type": "input_file", "file_url": "https://example.com/a.pdf"}, "needs `file_data`"),
    ({"type": "input_file", "file_data": "data:application/pdf;base64,%%%"}, "not valid base64"),
    ({"type": "input_file", "file_data": "JVBERi0x"}, "must be a base64 data URL"),
    (file_part(b"not a pdf at all", "application/pdf", "a.pdf"), "could not be read as a PDF"),
    (file_part(b"\xff\xfe\x00", "text/plain", "a.txt"), "must be UTF-8 text"),
    (file_part(tiny_pdf([["p"]] * (MAX_PDF_PAGES + 1)), "application/pdf", "long.pdf"),
     f"over {MAX_PDF_PAGES}"),
])
def test_files_it_cannot_read_are_refused_by_name(http: httpx.Client, part: dict[str, Any],
                                                  words: str) -> None:
    r = http.post("/v1/responses", json={
        "model": DEFAULT_MODEL, "max_output_tokens": 2,
        "input": [{"role": "user", "content": [text_part("Read this."), part]}]})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "input[0].content[1]" and words in error["message"], error
