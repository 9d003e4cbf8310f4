#!/usr/bin/env bash
# Installs edge_server as a systemd service (run as root):
#   /opt/edge-server        the project and its virtual environment
#   /etc/edge-server/       edge-server.env (options) - kept if it exists
#   /var/lib/edge-server/   state: pulled models, hub cache (systemd's StateDirectory)
# Re-running upgrades the code and restarts the service.
set -euo pipefail
if [ "$(id -u)" -ne 0 ]; then
    echo "run as root (sudo $0)" >&2
    exit 1
fi
src="$(cd "$(dirname "$0")/../.." && pwd)"
prefix=/opt/edge-server

mkdir -p "$prefix"
if [ "$src" != "$prefix" ]; then
    # Copy the project, not its local virtual environment or caches.
    tar -C "$src" --exclude=.venv --exclude=.git --exclude='__pycache__' -cf - . \
        | tar -C "$prefix" -xf -
fi
cd "$prefix"
source scripts/_venv.sh
install_project .
chmod -R a+rX "$prefix"

install -d -m 0755 /etc/edge-server
if [ ! -f /etc/edge-server/edge-server.env ]; then
    install -m 0644 systemd/edge-server.env /etc/edge-server/edge-server.env
fi
install -m 0644 systemd/edge-server.service /etc/systemd/system/edge-server.service
systemctl daemon-reload
systemctl enable edge-server.service
systemctl restart edge-server.service
echo "edge-server installed; status: systemctl status edge-server; logs: journalctl -u edge-server"
