"""The small routes that generate nothing: models and health (models), tokenize and
detokenize (tokenize), and the OpenAPI document (openapi).

May import: the endpoint packages (chat's prompt rendering, every protocol for the
OpenAPI document), api.common and api.http.
Imported by: the app (api.app).
"""
