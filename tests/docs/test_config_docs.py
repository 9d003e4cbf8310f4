"""docs/configuration.md's options table is the one ServeOptions makes: a flag added,
removed or reworded in config.py without `python -m edge_server.config_docs` fails here."""

from __future__ import annotations

import dataclasses

from edge_server.config import ServeOptions
from edge_server.config_docs import DOCS, options_table, with_table


def test_the_options_table_is_up_to_date() -> None:
    text = DOCS.read_text()
    assert with_table(text) == text, "run `python -m edge_server.config_docs`"


def test_every_option_is_in_the_table() -> None:
    table = options_table()
    for field in dataclasses.fields(ServeOptions):
        assert f"`--{field.name.replace('_', '-')}`" in table
