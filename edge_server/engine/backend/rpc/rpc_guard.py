"""Keeps the process alive when an RPC server dies.

llama.cpp's RPC client treats a lost connection as fatal: every failed send or receive
ends in `RPC_STATUS_ASSERT` -> `GGML_ABORT` -> `abort()` (ggml-rpc.cpp, rpc_dispatcher::work),
on its dispatcher thread, while the engine thread waits inside llama_decode for the reply.
ggml calls an abort callback before `abort()`; ours records the failure, fails the
requests in flight, and parks the failing thread for good instead of returning, so
`abort()` is never reached. The engine thread stays blocked in C (its context cannot be
used again): the model answers 503 from then on and /health says why, until the service
is restarted. Other aborts (bugs, not lost servers) keep llama.cpp's behaviour.

A socket check (Linux) also notices a server that closed its connection while idle.
"""

from __future__ import annotations

import ctypes
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from edge_server.engine.backend.rpc.rpc_devices import Endpoint, ggml

log = logging.getLogger(__name__)

_ABORT_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
_CHECK_INTERVAL_S = 1.0
_TCP_ESTABLISHED = "01"

_lock = threading.Lock()
_failure: str | None = None
_listeners: list[Callable[[str], None]] = []
_watched: dict[Endpoint, int] = {}  # endpoint -> loaded models using it
_installed: object = None  # the ctypes callback, kept alive as long as ggml may call it
_parked = threading.Event()  # never set: failed llama.cpp threads wait on it


def failure() -> str | None:
    """Why the RPC split is broken, or None while every server is connected."""
    return _failure


def add_listener(fn: Callable[[str], None]) -> None:
    """fn(reason) runs once, on any thread, when an RPC server is lost."""
    with _lock:
        _listeners.append(fn)
    if _failure is not None:
        fn(_failure)


def remove_listener(fn: Callable[[str], None]) -> None:
    with _lock:
        if fn in _listeners:
            _listeners.remove(fn)


def report(reason: str) -> None:
    """Marks the split broken (first reason wins) and tells the listeners."""
    global _failure
    with _lock:
        if _failure is not None:
            return
        _failure = reason
        listeners = list(_listeners)
    log.error("RPC split broken: %s; the model answers 503 until the service restarts",
              reason)
    for fn in listeners:
        try:
            fn(reason)
        except Exception:  # one listener's bug must not keep the others from running
            log.exception("RPC failure listener failed")


def _on_abort(message: bytes | None) -> None:
    text = (message or b"").decode("utf-8", errors="replace").strip()
    if "ggml-rpc" not in text:
        # Not a lost server: keep llama.cpp's behaviour (message, then abort()).
        print(text, file=sys.stderr, flush=True)
        return
    lost = ", ".join(str(e) for e in _lost_endpoints()) or "an RPC server"
    report(f"lost the connection to {lost} ({text.rsplit(': ', 1)[-1]})")
    # Returning would abort() the process: park this llama.cpp thread instead.
    while True:
        _parked.wait()


def install() -> None:
    """Sets the abort callback and starts the connection watch (once per process)."""
    global _installed
    with _lock:
        if _installed is None:
            callback = _ABORT_CALLBACK(_on_abort)
            ggml().set_abort_callback(ctypes.cast(callback, ctypes.c_void_p))
            _installed = callback
            threading.Thread(target=_watch, name="edge-rpc-watch", daemon=True).start()


def watch(endpoints: tuple[Endpoint, ...]) -> None:
    """A model on these servers was loaded: their connections must stay up."""
    install()
    with _lock:
        for endpoint in endpoints:
            _watched[endpoint] = _watched.get(endpoint, 0) + 1
            _addresses.setdefault(endpoint, _resolve(endpoint))


def unwatch(endpoints: tuple[Endpoint, ...]) -> None:
    """The model was freed: llama.cpp may close these connections now."""
    with _lock:
        for endpoint in endpoints:
            _watched[endpoint] = _watched.get(endpoint, 1) - 1
            if _watched[endpoint] <= 0:
                del _watched[endpoint]
                _connected.discard(endpoint)


def _resolve(endpoint: Endpoint) -> set[tuple[str, int]]:
    try:
        infos = socket.getaddrinfo(endpoint.host, endpoint.port, proto=socket.IPPROTO_TCP)
    except OSError:
        return set()
    return {(str(info[4][0]), endpoint.port) for info in infos}


def _proc_address(hex_addr: str) -> tuple[str, int]:
    """An address of /proc/net/tcp{,6}: hex IP in host (little-endian) words, hex port."""
    ip_hex, port_hex = hex_addr.split(":")
    raw = bytes.fromhex(ip_hex)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    ip = socket.inet_ntop(socket.AF_INET if len(words) == 4 else socket.AF_INET6, words)
    return (ip[7:] if ip.startswith("::ffff:") else ip), int(port_hex, 16)


def _own_socket_inodes() -> set[str]:
    inodes = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = fd.readlink().name
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def connection_states() -> dict[tuple[str, int], set[str]]:
    """TCP states of this process's own connections, by remote address (Linux)."""
    own = _own_socket_inodes()
    states: dict[tuple[str, int], set[str]] = {}
    for name in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/self/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[9] in own:
                states.setdefault(_proc_address(fields[2]), set()).add(fields[3])
    return states


_addresses: dict[Endpoint, set[tuple[str, int]]] = {}
_connected: set[Endpoint] = set()  # seen ESTABLISHED since the model was loaded


def _lost_endpoints() -> list[Endpoint]:
    """Watched endpoints connected before whose connection is no longer ESTABLISHED:
    closed by the server (CLOSE_WAIT), reset, or gone."""
    with _lock:
        watched = list(_watched)
    if not watched or not Path("/proc/self/net/tcp").exists():
        return []  # not Linux: the abort callback alone notices lost servers
    states = connection_states()
    lost = []
    for endpoint in watched:
        seen: set[str] = set()
        for address in _addresses.get(endpoint, ()):
            seen |= states.get(address, set())
        if _TCP_ESTABLISHED in seen:
            _connected.add(endpoint)
        elif endpoint in _connected:
            lost.append(endpoint)
    return lost


def _check() -> None:
    lost = _lost_endpoints()
    if lost:
        report(f"RPC server {', '.join(str(e) for e in lost)} closed its connection")


def _watch() -> None:
    while _failure is None:
        try:
            _check()
        except Exception:  # a malformed /proc line must not stop the watch
            log.exception("RPC connection check failed")
        time.sleep(_CHECK_INTERVAL_S)
