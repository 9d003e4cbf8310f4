"""edge_server: an OpenAI-compatible LLM server for CPUs and Apple silicon, on llama.cpp."""

__version__ = "0.1.0"
