"""Ollama's model management: tags, show, copy, delete, create, blobs, pull, and the
file created models are saved in."""
