"""/tokenize `with_pieces` (llama-server's): each token as {id, piece}, the piece as text
where its bytes are valid UTF-8, else the list of its bytes."""

from __future__ import annotations

import httpx


def _pieces(http: httpx.Client, **body: object) -> list[dict[str, object]]:
    answer = http.post("/tokenize", json={"with_pieces": True, **body})
    assert answer.status_code == 200, answer.text
    tokens = answer.json()["tokens"]
    assert all(set(t) == {"id", "piece"} for t in tokens)
    return tokens  # type: ignore[no-any-return]


def _bytes(piece: object) -> bytes:
    return piece.encode() if isinstance(piece, str) else bytes(piece)  # type: ignore[arg-type]


def test_pieces_spell_the_text_with_the_same_ids(http: httpx.Client) -> None:
    text = "Hello world, how are you?"
    pieces = _pieces(http, content=text)
    plain = http.post("/tokenize", json={"content": text}).json()["tokens"]
    assert [t["id"] for t in pieces] == plain
    assert "".join(str(t["piece"]) for t in pieces) == text


def test_a_piece_holding_part_of_a_character_is_its_bytes(http: httpx.Client) -> None:
    text = "llama 🦙 and 骆驼"
    pieces = _pieces(http, content=text)
    assert b"".join(_bytes(t["piece"]) for t in pieces) == text.encode()
    partial = [t["piece"] for t in pieces if isinstance(t["piece"], list)]
    assert partial, pieces  # byte-level BPE splits the emoji's four bytes
    assert all(isinstance(b, int) and 0 <= b < 256 for p in partial for b in p)


def test_control_tokens_show_as_their_text(http: httpx.Client) -> None:
    pieces = _pieces(http, content="<|im_start|>user")
    assert pieces[0]["piece"] == "<|im_start|>"


def test_chat_messages_with_pieces(http: httpx.Client) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    pieces = _pieces(http, messages=messages)
    plain = http.post("/tokenize", json={"messages": messages}).json()["tokens"]
    assert [t["id"] for t in pieces] == plain
    assert any(t["piece"] == "<|im_start|>" for t in pieces)


def test_without_with_pieces_tokens_are_ids(http: httpx.Client) -> None:
    tokens = http.post("/tokenize", json={"content": "Hi", "with_pieces": False}).json()
    assert all(isinstance(t, int) for t in tokens["tokens"])
