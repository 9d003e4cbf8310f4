#!/usr/bin/env bash
# Sets up everything on a fresh machine, then lints and runs the test suite against the
# real default model. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
install_project ".[test]"
.venv/bin/ruff check edge_server tests scripts
# The architecture (import contracts in pyproject.toml) and the type hints are checked too:
# a layer importing upward, an import cycle or a name an import missed fails here.
.venv/bin/lint-imports --no-cache
.venv/bin/mypy
exec .venv/bin/python -m pytest "$@"
