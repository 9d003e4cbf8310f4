"""Grammars from JSON schemas: schema checks (schema_check, pattern_check,
pattern_chars), the bounds every grammar is held to before llama.cpp parses it (limits),
and the JSON schema -> GBNF converter (json_grammar).

May import: the standard library and llama-cpp-python's pure-Python schema converter;
nothing else of edge_server (it needs no model).
Imported by: the HTTP layer's shared serving code (response_format, tools), which hands
the GBNF text to the engine inside a request's sampling parameters.
"""
