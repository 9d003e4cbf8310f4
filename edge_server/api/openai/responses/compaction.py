"""Compaction items: a conversation's summary, sealed as the item's `encrypted_content`
and read back as an assistant turn when a later request's input carries it.

The content is opaque to clients as OpenAI's is, but not secret: the summary, compressed
and base64url-encoded behind a version prefix. Nothing in it grants anything (a client
could send the same text as a message), so it needs no key; what is bounded is what it
may expand to.
"""

from __future__ import annotations

import base64
import binascii
import zlib

from edge_server.api.http.errors import invalid
from edge_server.api.openai.chat.protocol import ChatMessage

_PREFIX = "edge-compaction-v1."
_MAX_SUMMARY_BYTES = 256 << 10
SUMMARY_HEADING = "Summary of the conversation so far:"
INSTRUCTION = ("Summarize the conversation so far for your own later use: what the user "
               "wants, the facts, names and decisions established, what was answered and "
               "what is still open. Write only the summary.")


def seal(summary: str) -> str:
    return _PREFIX + base64.urlsafe_b64encode(zlib.compress(summary.encode())).decode()


def unseal(content: str, param: str) -> str:
    """The summary a compaction item holds; a 400 naming `param` for content this server
    did not write (or that was cut or altered)."""
    if not content.startswith(_PREFIX):
        raise invalid(param, "is not a compaction this server wrote",
                      "invalid_encrypted_content")
    try:
        packed = base64.urlsafe_b64decode(content[len(_PREFIX):])
        inflater = zlib.decompressobj()
        raw = inflater.decompress(packed, _MAX_SUMMARY_BYTES)
        if inflater.unconsumed_tail or not inflater.eof:
            raise ValueError("cut, or larger than any summary")
        return raw.decode()
    except (binascii.Error, ValueError, zlib.error) as exc:
        raise invalid(param, "the compaction's content is damaged",
                      "invalid_encrypted_content") from exc


def summary_message(summary: str) -> ChatMessage:
    """How a compacted conversation stands in a later one: the model's own summary of it."""
    return ChatMessage(role="assistant", content=f"{SUMMARY_HEADING}\n{summary}")
