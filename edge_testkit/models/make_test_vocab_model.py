"""Writes a tiny llama-architecture GGUF model with a REAL tokenizer, for TESTS ONLY.

llama.cpp's sources ship the tokenizers of many model families as `models/ggml-vocab-*.gguf`
(Llama 3's llama-bpe, qwen2, qwen35, deepseek-llm, phi-3, command-r, gemma-4, …): the
`tokenizer.*` metadata of the real model and no weights. This copies those keys (tokens,
types, merges or scores, pre-tokenizer, special-token ids, chat templates) into a small
random-weight model (2 layers, width 64, the output layer tied to the embeddings: a
150k-token vocabulary is about 20 MB), so tests see the family's real token ids and its
control tokens (`<|eot_id|>`, `<|im_end|>`, …) exactly as the real model has them.

Families whose markers the vocab file lacks get them added the way the real model's
tokenizer has them (`--add-control '[TOOL_CALLS]'`: a CONTROL token; `--add-user TEXT`: a
USER_DEFINED one, always rendered as text). A text the vocabulary already holds is retyped
in place; a new one is appended. `--chat-template FILE` stores a template as the model's.

What it generates means nothing; the output is deterministic (a fixed seed), so tests
rebuild it into a cache instead of shipping a binary file.

    python -m edge_testkit.models.make_test_vocab_model VOCAB.gguf OUT.gguf \
        [--add-control '<|python_tag|>' ...] [--add-user '<tool_call>' ...] \
        [--chat-template FILE] [--layers 2] [--width 64] [--seed 0]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from edge_testkit.models.gguf_test_weights import add_llama_weights, llama_writer, write_out

# Token types of llama.cpp's vocabulary (llama_token_type).
NORMAL, CONTROL, USER_DEFINED = 1, 3, 4
HEADS = 4
CONTEXT = 8192
# Keys of the vocab file that describe the weights of the model it came from, or are
# rewritten here.
_SKIPPED = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores")


def _field_value(field: Any) -> Any:
    return field.contents()


def _copy_key(writer: GGUFWriter, key: str, field: Any) -> None:
    """One metadata key with its own GGUF type (ids stay uint32, flags bool …)."""
    kind = field.types[0]
    if kind == GGUFValueType.ARRAY:
        writer.add_key_value(key, _field_value(field), kind, field.types[-1])
    else:
        writer.add_key_value(key, _field_value(field), kind)


def _with_added(tokens: list[str], types: list[int], scores: list[float] | None,
                added: Sequence[tuple[str, int]]) -> None:
    """Retypes each added text the vocabulary holds, appends the others (in place)."""
    index = {text: i for i, text in enumerate(tokens)}
    for text, kind in added:
        if text in index:
            types[index[text]] = kind
            continue
        index[text] = len(tokens)
        tokens.append(text)
        types.append(kind)
        if scores is not None:
            scores.append(0.0)


def add_tokenizer(writer: GGUFWriter, vocab: Path, *, add_control: Sequence[str] = (),
                  add_user: Sequence[str] = (), chat_template: str | None = None) -> int:
    """Copies the vocab file's `tokenizer.*` keys into `writer` (the markers added, the
    template replaced where given); returns the vocabulary's size."""
    reader = GGUFReader(str(vocab))
    fields = reader.fields
    tokens = [str(t) for t in _field_value(fields["tokenizer.ggml.tokens"])]
    types = [int(t) for t in _field_value(fields["tokenizer.ggml.token_type"])]
    scores = ([float(s) for s in _field_value(fields["tokenizer.ggml.scores"])]
              if "tokenizer.ggml.scores" in fields else None)
    _with_added(tokens, types, scores,
                [(t, CONTROL) for t in add_control] + [(t, USER_DEFINED) for t in add_user])
    writer.add_vocab_size(len(tokens))
    for key, field in fields.items():
        if not key.startswith("tokenizer.") or key in _SKIPPED:
            continue
        if chat_template is not None and key.startswith("tokenizer.chat_template"):
            continue
        _copy_key(writer, key, field)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    if scores is not None:
        writer.add_token_scores(scores)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    return len(tokens)


def write_model(vocab: Path, out: Path, *, add_control: Sequence[str] = (),
                add_user: Sequence[str] = (), chat_template: str | None = None,
                layers: int = 2, width: int = 64, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    n_ff = 2 * width
    name = f"edge-server-test-vocab-{vocab.stem.removeprefix('ggml-vocab-')}"
    writer = llama_writer(out, name, context=CONTEXT, width=width, layers=layers, n_ff=n_ff,
                          heads=HEADS)
    n_vocab = add_tokenizer(writer, vocab, add_control=add_control, add_user=add_user,
                            chat_template=chat_template)
    add_llama_weights(writer, rng, n_vocab=n_vocab, width=width, layers=layers, n_ff=n_ff,
                      tied=True)
    return write_out(writer, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("vocab", type=Path, help="a models/ggml-vocab-*.gguf of llama.cpp")
    parser.add_argument("out", type=Path)
    parser.add_argument("--add-control", action="append", default=[], metavar="TEXT",
                        help="a CONTROL token (retyped if the vocabulary has it, else added)")
    parser.add_argument("--add-user", action="append", default=[], metavar="TEXT",
                        help="a USER_DEFINED token (always rendered as text)")
    parser.add_argument("--chat-template", type=Path, metavar="FILE",
                        help="store this Jinja template as the model's chat template")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    template = args.chat_template.read_text() if args.chat_template else None
    print(write_model(args.vocab, args.out, add_control=args.add_control,
                      add_user=args.add_user, chat_template=template, layers=args.layers,
                      width=args.width, seed=args.seed))


if __name__ == "__main__":
    main()
