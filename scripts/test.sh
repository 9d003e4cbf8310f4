#!/usr/bin/env bash
# Sets up everything on a fresh machine, then lints and runs the test suite against the
# real default model. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
install_project ".[test]"
# The chat page's tests drive Debian's chromium through its chromedriver; without them
# (no apt-get, no root) those tests skip, saying why.
if ! { command -v chromium && command -v chromedriver; } >/dev/null 2>&1 \
        && command -v apt-get >/dev/null 2>&1; then
    sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo -n"
    ($sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq \
        chromium chromium-driver) >/dev/null 2>&1 \
        || echo "warning: could not install chromium, the browser tests will skip" >&2
fi
.venv/bin/ruff check edge_server edge_testkit tests scripts
# The architecture (import contracts in pyproject.toml) and the type hints are checked too:
# a layer importing upward, an import cycle or a name an import missed fails here.
.venv/bin/lint-imports --no-cache
.venv/bin/mypy
exec .venv/bin/python -m pytest "$@"
