"""HTTP plumbing shared by every route: request bodies and their bounds (body, limits),
errors in each protocol's shape (errors, error_reshape), the replica header (replica),
the model lease and body parsing every endpoint starts with (dependencies), streams read
ahead of their client (read_ahead) within one bound on unsent bytes (send_buffers),
threads for blocking disk and network work (io_threads), the memory account
(memory_account) and Prometheus metrics (metrics).
guards/: API keys (auth), the Host header (host_guard), web origins allowed to call
(cors), the cheap refusal (admission), draining on shutdown (draining), and a request's
hold on capacity, released when the engine is done (hold).

May import: edge_server.catalogue.pool and the engine's public types (errors, job stats).
Imported by: every endpoint, the small routers and the app.
"""
