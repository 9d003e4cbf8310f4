#!/usr/bin/env bash
# Sets up everything on a fresh machine, then serves the embedded default model on
# http://127.0.0.1:8080. Extra arguments go to `edge-server serve` (see --help).
# The first run compiles llama.cpp through llama-cpp-python (several minutes on 2 cores);
# later runs reuse pip's cached wheel. Nothing is downloaded after the install.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
install_project .
exec .venv/bin/edge-server serve "$@"
