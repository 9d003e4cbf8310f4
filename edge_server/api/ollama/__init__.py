"""Ollama's native API (/api/*) on the same engine, pool and chat path as the OpenAI
doors, so that apps speaking only Ollama work unchanged.

    api_router   the routes
    protocol     request schemas (pydantic)
    options      `options` onto the samplers; `keep_alive` durations
    names        `name:tag` model names onto the pool's names
    profiles     what a made model's Modelfile adds, applied to its requests
    translate    chat and generate requests as the chat / raw requests they mean
    serving      /api/chat and /api/generate: prepared, run, answered
    streaming    an answer as Ollama's objects, NDJSON streams, the final durations
    embed        /api/embed and /api/embeddings over the embeddings door
    error_shape  every error on /api/* as {"error": "..."}
management/, the models this server keeps:
    models       /api/tags, show, ps, version, copy, delete (and what is refused)
    create       /api/create: a model made from a served one or an uploaded GGUF
    modelfile    a Modelfile's text as FROM, TEMPLATE, SYSTEM and PARAMETER
    saved_models made models and copied names, kept in ollama-models.json (saved_file)
    blobs        HEAD/POST /api/blobs: GGUF uploads streamed to disk, digest-checked;
                 upload_room: the disk room they may take
    gguf_info    details and model_info read from a GGUF file; its digest, kept
    pull         /api/pull with Ollama's progress objects; pull_jobs: pulls in flight
"""
