"""HTTP plumbing shared by every route: request bodies and their bounds (body, limits),
errors in each protocol's shape (errors), API keys (auth), web origins allowed to call
(cors), draining on shutdown (draining), the replica header (replica), the model lease
and body parsing every endpoint starts with (dependencies), the cheap refusal
(admission), a request's hold on capacity, released when the engine is done (hold),
streams read ahead of their client (read_ahead), threads for blocking disk and network
work (io_threads), and Prometheus metrics (metrics).

May import: edge_server.catalogue.pool and the engine's public types (errors, job stats).
Imported by: every endpoint, the small routers and the app.
"""
