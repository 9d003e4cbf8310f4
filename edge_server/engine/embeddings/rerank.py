"""How a reranker reads a query-document pair: the tokens of one scored sequence, laid
out as llama-server's format_prompt_rerank does.

With a rerank template in the GGUF file (`tokenizer.chat_template.rerank`, holding
{query} and {document}: Qwen3-Reranker's yes/no prompt, for one) the pair is that text;
otherwise BOS query EOS SEP document EOS, each special token where the vocabulary asks
for it (a BERT reranker: [CLS] query [SEP] document), EOS falling back to SEP.
Caller text is data: control-token text in the query or a document is read as plain
text, only the template's own markup as special tokens.
"""

from __future__ import annotations

import re

import llama_cpp as lc

from edge_server.engine.backend.llama_model import LlamaModel
from edge_server.engine.embeddings.embedder import EmbeddingsUnsupported

_FIELDS = ("{query}", "{document}")


def _rerank_template(model: LlamaModel) -> str | None:
    raw = lc.llama_model_chat_template(model.model, b"rerank")
    return raw.decode("utf-8", errors="replace") if raw else None


def _is_causal(model: LlamaModel) -> bool:
    arch = model.metadata.get("general.architecture", "")
    return model.metadata.get(f"{arch}.attention.causal", "true").lower() != "false"


class PairLayout:
    """Tokens of (query, document) pairs for one reranker."""

    def __init__(self, model: LlamaModel) -> None:
        self.vocab = model.vocab
        self.template = _rerank_template(model)
        if self.template is None and _is_causal(model):
            # A causal reranker scores the answer to a prompt (yes or no); without its
            # prompt the pair would be scored as text it was never trained on.
            arch = model.metadata.get("general.architecture", "?")
            raise EmbeddingsUnsupported(
                f"this reranker ({arch}, causal) scores with a yes/no prompt, and its GGUF "
                "file has no rerank template (tokenizer.chat_template.rerank) to lay it out")
        vocab = self.vocab.ptr
        eos = lc.llama_vocab_eos(vocab)
        self.eos = eos if eos >= 0 else lc.llama_vocab_sep(vocab)
        self.sep = lc.llama_vocab_sep(vocab)
        self.add_bos = bool(lc.llama_vocab_get_add_bos(vocab)) and self.vocab.bos >= 0
        self.add_eos = bool(lc.llama_vocab_get_add_eos(vocab)) and self.eos >= 0
        self.add_sep = bool(lc.llama_vocab_get_add_sep(vocab)) and self.sep >= 0
        self._template_pieces = None if self.template is None else self._split(self.template)

    def tokenize(self, text: str) -> list[int]:
        """A query's or document's tokens, as they go into pairs."""
        return self.vocab.tokenize(text, add_special=False, parse_special=False)

    def pair(self, query: list[int], document: list[int]) -> list[int]:
        """The tokens of one scored sequence, from tokenize's query and document."""
        if self._template_pieces is not None:
            values = {"{query}": query, "{document}": document}
            tokens: list[int] = []
            for piece in self._template_pieces:
                tokens += values[piece] if isinstance(piece, str) else piece
            return tokens
        tokens = [self.vocab.bos] if self.add_bos else []
        tokens += query
        tokens += [self.eos] if self.add_eos else []
        tokens += [self.sep] if self.add_sep else []
        tokens += document
        tokens += [self.eos] if self.add_eos else []
        return tokens

    def _split(self, template: str) -> list[list[int] | str]:
        """The template's markup as tokens (special tokens parsed), its fields by name."""
        pieces: list[list[int] | str] = []
        for piece in re.split("(" + "|".join(map(re.escape, _FIELDS)) + ")", template):
            if piece in _FIELDS:
                pieces.append(piece)
            elif piece:
                pieces.append(self.vocab.tokenize(piece, add_special=False,
                                                  parse_special=True))
        return pieces
