"""The HTTP layer: Starlette routes over the model pool and the engine.

Endpoints first, one package each, as vLLM's entrypoints (api_router / protocol / serving):
    chat/         POST /v1/chat/completions
    completions/  POST /v1/completions
    embeddings/   POST /v1/embeddings
    rerank/       POST /v1/rerank (llama-server's; Jina's, Cohere's and TEI's shapes)
    infill/       POST /infill (llama-server's code infill)
    messages/     POST /v1/messages (Anthropic), over chat
    responses/    /v1/responses (OpenAI Responses, stored responses too), over chat
    ollama/       Ollama's native API (/api/*), over chat, completions and embeddings
    native/       POST /completion (llama-server's native completion), over completions
Then what they share:
    routers/      the small routes: models, health, tokenize, apply-template, props, OpenAPI
    webui/        GET /, the chat page (static files, package data)
    common/       serving code and request fields shared by the endpoints
    http/         plumbing: bodies, limits, errors, auth, CORS, draining, metrics
    app.py        assembles the Starlette app

May import: edge_server.catalogue.pool and edge_server.engine (never the CLI).
Imported by: edge_server.cli and edge_server.process.
"""
