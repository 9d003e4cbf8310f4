"""The chat page at `GET /`: static files (static/, package data) served from memory under
a strict Content-Security-Policy. The page itself speaks to the API like any client.

May import: the HTTP plumbing (http/). Imported by: the app.
"""
