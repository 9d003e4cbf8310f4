"""Embeddings: a second llama.cpp context on a loaded model's weights with pooled outputs,
and the worker thread that batches every waiting embedding request (embedder); a
reranker's (query, document) pairs as its sequences (rerank), scored in that context.

May import: engine.backend and engine.errors.
Imported by: engine.engine, and the HTTP layer's embeddings endpoint for its job types.
"""
