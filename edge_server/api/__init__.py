"""The HTTP layer: Starlette routes over the model pool and the engine.

One package per protocol, and in each one package per endpoint, as vLLM's entrypoints
(api_router / protocol / serving):
    openai/          OpenAI's API
        chat/            POST /v1/chat/completions (templates, tools, reasoning)
        completions/     POST /v1/completions
        responses/       /v1/responses (stored responses too), over chat
        embeddings/      POST /v1/embeddings
        models.py        GET /v1/models, /v1/models/{model} and /health
    anthropic/       Anthropic's API
        messages/        POST /v1/messages and count_tokens, over chat
    ollama/          Ollama's API (/api/*), over chat, completions and embeddings
        management/      tags, show, copy, delete, create, blobs, pull
    llama_server/    llama-server's own routes
        completion/      POST /completion, over completions
        infill/          POST /infill (code infill)
        rerank/          POST /v1/rerank (Jina's, Cohere's and TEI's shapes too)
        props.py, slots.py, tokenize.py   /props, /slots, /tokenize, /apply-template
Then what they share:
    webui/           GET /, the chat page (static files, package data)
    openapi.py       GET /openapi.json; unprefixed.py: the OpenAI routes without /v1
    common/          serving code and request fields shared by the endpoints
    http/            plumbing: bodies, limits, errors, metrics; http/guards/: auth,
                     CORS, admission, draining
    app.py           assembles the Starlette app

May import: edge_server.catalogue.pool and edge_server.engine (never the CLI).
Imported by: edge_server.cli and edge_server.process.
"""
