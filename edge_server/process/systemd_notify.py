"""sd_notify without a library: one datagram to $NOTIFY_SOCKET (Type=notify services)."""

from __future__ import annotations

import os
import socket


def notify(state: str) -> bool:
    """Sends e.g. "READY=1"; returns False when not run under a notify-aware manager."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # abstract namespace
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
        return True
    except OSError:
        return False


def watchdog_interval() -> float | None:
    """Seconds between WATCHDOG=1 pings when systemd's WatchdogSec= is on (half its
    timeout, as sd_watchdog_enabled advises), else None."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return max(int(usec) / 2e6, 0.5)
    except ValueError:
        return None
