"""The options table of docs/configuration.md, made from ServeOptions (config.py), so the
manual cannot drift from the flags: `python -m edge_server.config_docs` rewrites the
table between its markers, and a test fails while the file differs from what this
makes."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from edge_server.config import ServeOptions, env_name

BEGIN = "<!-- options: made by `python -m edge_server.config_docs`; do not edit by hand -->"
END = "<!-- end of options -->"
DOCS = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


def _default(field: dataclasses.Field[object]) -> str:
    if field.metadata.get("action") == "store_true":
        return "off"
    if field.default is dataclasses.MISSING or field.default is None:
        return "none"
    return f"`{field.default}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def options_table() -> str:
    """Every option: its flag, environment variable, default and --help text."""
    rows = ["| option | environment | default | meaning |", "|---|---|---|---|"]
    for field in dataclasses.fields(ServeOptions):
        flag = "--" + field.name.replace("_", "-")
        meaning = field.metadata["help"]
        choices = field.metadata.get("choices")
        if choices:
            meaning += " (one of " + ", ".join(f"`{c}`" for c in choices) + ")"
        if field.metadata.get("action") == "append":
            meaning += " (repeatable)"
        rows.append(f"| `{flag}` | `{env_name(field.name)}` | {_default(field)} | "
                    f"{_cell(meaning)} |")
    return "\n".join(rows) + "\n"


def with_table(text: str) -> str:
    """`text` with the table between its markers made anew."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:start] + "\n" + options_table() + text[end:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if the file differs from what this makes")
    args = parser.parse_args()
    text = DOCS.read_text()
    made = with_table(text)
    if args.check:
        sys.exit(0 if made == text else 1)
    DOCS.write_text(made)


if __name__ == "__main__":
    main()
