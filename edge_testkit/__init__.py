"""What the test suite (tests/) and the scripts (scripts/) share: test support, not part of
the server.

- `edge_testkit.models`: the tiny random-weight GGUF models (chat, architectures, FIM,
  projector, reranker, benchmark-sized) and the vendored llama.cpp sources they take their
  tokenizers and templates from; each maker also runs as `python -m edge_testkit.models.<name>`.
- `edge_testkit.servers`: starting and stopping a real edge_server process, and a local
  stand-in for the Hugging Face Hub.
- `edge_testkit.fuzz`: the request generators and the judge of the fuzz test and campaign.
- `edge_testkit.soak`: soaks that a test runs briefly and a script runs for longer.
- `edge_testkit.browser`: headless chromium for the chat-page tests.
- `edge_testkit.images`, `edge_testkit.tools`: image helpers (data URLs, a local image
  origin) and tool definitions that suites in several folders send.
- `edge_testkit.measure`: small helpers for fair measurements.
- `edge_testkit.documents`: PDFs written by hand, for the file-input tests.

It is installed with the project (`pip install -e .`) so that neither tests nor scripts
edit `sys.path` or load each other by file path.
"""

from __future__ import annotations

from pathlib import Path

# The checkout: servers run from it, and the systemd files and the docs are read from it.
ROOT = Path(__file__).resolve().parent.parent
