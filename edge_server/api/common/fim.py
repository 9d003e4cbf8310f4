"""Fill-in-the-middle prompts from the model's own FIM tokens, for `POST /infill` and for
`/v1/completions` with `suffix`: both lay tokens out here, so a request without extra
context gives the same prompt on either route.

    [BOS] [extra context] <fim_pre> prefix prompt <fim_suf> suffix <fim_mid>

The extra context (other files' chunks, llama.vscode's `input_extra`) comes first and
changes rarely, so across keystrokes it stays a cached prefix of the KV cache and only
the part after it is evaluated again. Its layout is llama-server's repo-level pattern
(https://arxiv.org/pdf/2409.12186): `<fim_rep>myproject\\n`, then per chunk
`<fim_sep>filename\\n text`, then `<fim_sep>filename\\n` for the file being edited; a
vocabulary without <fim_rep> / <fim_sep> gets a plain-text separator per chunk instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import llama_cpp as lc

from edge_server.api.http.errors import unsupported
from edge_server.engine import Engine

# llama-server's separator between chunks where the vocabulary has no <fim_sep>.
_CHUNK_SEPARATOR = "\n\n--- snippet ---\n\n"
_PROJECT = "myproject\n"
_CURRENT_FILE = "filename\n"


@dataclass(frozen=True)
class ExtraChunk:
    text: str
    filename: str = "tmp"


def fim_tokens(engine: Engine, param: str) -> dict[str, int]:
    """The model's prefix / suffix / middle tokens; a 400 naming `param` without them."""
    fim = engine.vocab.fim
    missing = [name for name in ("pre", "suf", "mid") if fim[name] < 0]
    if missing:
        raise unsupported(param, "needs a model with fill-in-the-middle tokens; this one "
                          f"has no FIM {'/'.join(missing)} token in its vocabulary")
    return fim


def _text(engine: Engine, text: str) -> list[int]:
    # Caller text is plain text: control-token markup inside it stays text.
    return engine.vocab.tokenize(text, add_special=False, parse_special=False)


def extra_context(engine: Engine, chunks: list[ExtraChunk]) -> list[int]:
    """The repo-level header and chunks that go before <fim_pre> (empty: none)."""
    if not chunks:
        return []
    rep = lc.llama_vocab_fim_rep(engine.vocab.ptr)
    sep = lc.llama_vocab_fim_sep(engine.vocab.ptr)
    tokens: list[int] = [rep, *_text(engine, _PROJECT)] if rep >= 0 else []
    for chunk in chunks:
        if sep >= 0:
            tokens += [sep, *_text(engine, chunk.filename + "\n")]
        else:
            tokens += _text(engine, _CHUNK_SEPARATOR)
        tokens += _text(engine, chunk.text)
    if sep >= 0:
        tokens += [sep, *_text(engine, _CURRENT_FILE)]
    return tokens


def fim_prompt(engine: Engine, fim: dict[str, int], *, extra: list[int], prefix: list[int],
               suffix: list[int], prompt: list[int] | None = None) -> list[int]:
    """The whole prompt; the parts are tokens already cut to their windows."""
    vocab = engine.vocab
    head = [vocab.bos] if vocab.add_bos and vocab.bos >= 0 else []
    return [*head, *extra, fim["pre"], *prefix, *(prompt or []), fim["suf"], *suffix,
            fim["mid"]]


def text_tokens(engine: Engine, text: str) -> list[int]:
    return _text(engine, text)
