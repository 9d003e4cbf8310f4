"""A loaded model's vocabulary: tokenizing, pieces, control tokens and end-of-generation
tokens, read once from llama.cpp."""

from __future__ import annotations

import ctypes

import llama_cpp as lc
import numpy as np


class Vocab:
    """Tokenizer and token metadata of a loaded model, with per-token pieces cached."""

    def __init__(self, vocab_ptr: lc.llama_vocab_p) -> None:
        self.ptr = vocab_ptr
        self.n_tokens: int = lc.llama_vocab_n_tokens(vocab_ptr)
        self.bos: int = lc.llama_vocab_bos(vocab_ptr)
        self.eos: int = lc.llama_vocab_eos(vocab_ptr)
        self.add_bos: bool = bool(lc.llama_vocab_get_add_bos(vocab_ptr))
        # Pieces as bytes: a token may hold part of a UTF-8 character.
        self.pieces: list[bytes] = [self._piece(t, special=False) for t in range(self.n_tokens)]
        # The texts of control tokens (`<|python_tag|>`, `[TOOL_CALLS]`, `<|im_end|>` …):
        # llama.cpp renders them only when asked, and tokenizes them only with
        # parse_special (it gates CONTROL and UNKNOWN tokens alike).
        gated = lc.LLAMA_TOKEN_ATTR_CONTROL | lc.LLAMA_TOKEN_ATTR_UNKNOWN
        control = {t: self._piece(t, special=True) for t in range(self.n_tokens)
                   if lc.llama_vocab_get_attr(vocab_ptr, t) & gated}
        self.control_texts: tuple[str, ...] = tuple(
            text.decode("utf-8", errors="replace") for text in control.values() if text)
        # `pieces` with control tokens rendered: the text that tool-call and reasoning
        # parsers read (a request's `render_control`). The same objects where they agree.
        self.marked_pieces: list[bytes] = list(self.pieces)
        for token, text in control.items():
            self.marked_pieces[token] = text
        self.is_eog = np.array(
            [bool(lc.llama_vocab_is_eog(vocab_ptr, t)) for t in range(self.n_tokens)], dtype=bool
        )
        self.eog_tokens: list[int] = [int(t) for t in np.flatnonzero(self.is_eog)]
        self.fim = {
            "pre": lc.llama_vocab_fim_pre(vocab_ptr),
            "suf": lc.llama_vocab_fim_suf(vocab_ptr),
            "mid": lc.llama_vocab_fim_mid(vocab_ptr),
        }

    def _piece(self, token: int, *, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = lc.llama_token_to_piece(self.ptr, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = lc.llama_token_to_piece(self.ptr, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def token_text(self, token: int) -> str:
        """The token rendered for display, special tokens included."""
        return self._piece(token, special=True).decode("utf-8", errors="replace")

    def token_bytes(self, token: int) -> bytes:
        """The token's bytes as llama-server shows them, special tokens as their text."""
        return self._piece(token, special=True)

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 16
        buf = (lc.llama_token * capacity)()
        n = lc.llama_tokenize(self.ptr, data, len(data), buf, capacity, add_special, parse_special)
        if n < 0:
            capacity = -n
            buf = (lc.llama_token * capacity)()
            n = lc.llama_tokenize(
                self.ptr, data, len(data), buf, capacity, add_special, parse_special
            )
        return list(buf[:n])

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self.pieces[t] for t in tokens).decode("utf-8", errors="replace")

    def is_valid(self, token: int) -> bool:
        return 0 <= token < self.n_tokens
