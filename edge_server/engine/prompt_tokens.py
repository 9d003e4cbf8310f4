"""A prompt's tokens as the engine takes them: chat text whose control texts came from
callers (kept plain text), and images laid out by the projector between texts."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from edge_server.engine.backend.llama_model import Vocab
from edge_server.engine.multimodal.projector import ImageChunk
from edge_server.engine.request import ImageSpan


@dataclass
class PromptTokens:
    tokens: list[int] = field(default_factory=list)
    images: list[ImageSpan] = field(default_factory=list)

    def add_text(self, tokens: list[int]) -> None:
        self.tokens += tokens

    def add_image(self, pieces: list[list[int] | ImageChunk]) -> None:
        """An image as the projector lays it out: its own marker tokens and the image."""
        for piece in pieces:
            if isinstance(piece, ImageChunk):
                self.images.append(ImageSpan(len(self.tokens), piece))
                self.tokens += piece.placeholders
            else:
                self.tokens += piece


def chat_text_tokens(vocab: Vocab, text: str, literals: dict[str, str]) -> list[int]:
    """Rendered chat text, no BOS: special tokens parsed in the template's markup, and
    each sentinel (a key of `literals`) as its caller's text, special tokens not parsed."""
    if not literals:
        return vocab.tokenize(text, add_special=False, parse_special=True)
    tokens: list[int] = []
    sentinels = "[" + "".join(literals) + "]"
    for piece in re.split(f"({sentinels})", text):
        if piece in literals:
            tokens += vocab.tokenize(literals[piece], add_special=False, parse_special=False)
        elif piece:
            tokens += vocab.tokenize(piece, add_special=False, parse_special=True)
    return tokens
