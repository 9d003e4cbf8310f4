"""Tiny random-weight GGUF models for tests and benchmarks, and the llama.cpp sources
(real tokenizers and chat templates) they are built from. Each `make_*` module runs as
`python -m edge_testkit.models.<name> --help`; `cache` builds them once, keyed by their code."""
