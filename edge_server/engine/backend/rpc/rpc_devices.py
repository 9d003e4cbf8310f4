"""llama.cpp RPC servers as model devices: endpoints checked in Python, then registered
through ggml's backend registry and handed to llama.cpp in `llama_model_params.devices`.

llama.cpp aborts the whole process when an endpoint cannot be reached or answers with
another protocol version (ggml-rpc.cpp, rpc_dispatcher::start), so every endpoint is
first greeted here with the same HELLO message, with timeouts, to fail with a clear error.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import ipaddress
import os
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

import llama_cpp as lc
from llama_cpp._ctypes_extensions import load_shared_library

from edge_server.engine.backend.runtime import init_backend

MAX_SERVERS = 16  # GGML_RPC_MAX_SERVERS
# ggml-rpc.cpp of the llama.cpp that llama-cpp-python 0.3.36 vendors: RPC_CMD_HELLO is
# pinned to 14 across versions; the reply is major, minor, patch, padding, 24 caps bytes.
_CMD_HELLO = 14
_CAPS_SIZE = 24
_PROTO_MAJOR = 7
_CONNECT_TIMEOUT_S = 3.0
_REPLY_TIMEOUT_S = 5.0
_DEV_TYPE_CPU, _DEV_TYPE_GPU, _DEV_TYPE_IGPU = 0, 1, 2


def rpc_build_dir() -> Path:
    """Where scripts/build/build-rpc.sh puts rpc-server and the RPC-enabled libraries of the
    installed llama-cpp-python's llama.cpp."""
    if os.environ.get("EDGE_SERVER_RPC_BUILD"):
        return Path(os.environ["EDGE_SERVER_RPC_BUILD"])
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    version = importlib.metadata.version("llama-cpp-python")
    return Path(cache) / "edge-server" / f"rpc-{version}"


class RpcError(RuntimeError):
    """An --rpc endpoint that is malformed, unreachable, busy or incompatible."""


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_endpoints(values: list[str] | tuple[str, ...]) -> tuple[Endpoint, ...]:
    """HOST:PORT items (also comma-separated inside one item), bounded and deduplicated
    before anything reaches llama.cpp, whose parser aborts on what it cannot read."""
    items = [v.strip() for value in values for v in value.split(",") if v.strip()]
    if len(items) > MAX_SERVERS:
        raise RpcError(f"--rpc: at most {MAX_SERVERS} servers, got {len(items)}")
    endpoints: list[Endpoint] = []
    for item in items:
        host, sep, port_text = item.rpartition(":")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if not sep or not host or not port_text.isdigit():
            raise RpcError(f"--rpc {item!r}: expected HOST:PORT")
        port = int(port_text)
        if not 1 <= port <= 65535:
            raise RpcError(f"--rpc {item!r}: port out of range 1-65535")
        if len(host) > 253 or any(c.isspace() or c in "/,@" for c in host):
            raise RpcError(f"--rpc {item!r}: not a host name or address")
        if ":" in host:
            try:
                ipaddress.IPv6Address(host)
            except ValueError as exc:
                raise RpcError(f"--rpc {item!r}: not an IPv6 address") from exc
        endpoint = Endpoint(host, port)
        if endpoint in endpoints:
            raise RpcError(f"--rpc {item!r} given twice")
        endpoints.append(endpoint)
    return tuple(endpoints)


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed the connection")
        data += chunk
    return data


def greet(endpoint: Endpoint) -> str:
    """Says HELLO as llama.cpp will, with timeouts; returns the server's protocol version.
    rpc-server serves one client at a time: one busy with another process never answers."""
    try:
        with socket.create_connection((endpoint.host, endpoint.port),
                                      timeout=_CONNECT_TIMEOUT_S) as sock:
            sock.settimeout(_REPLY_TIMEOUT_S)
            sock.sendall(bytes([_CMD_HELLO]) + struct.pack("<Q", _CAPS_SIZE) + bytes(_CAPS_SIZE))
            (size,) = struct.unpack("<Q", _recv_exact(sock, 8))
            if size != 4 + _CAPS_SIZE:
                raise RpcError(f"RPC server {endpoint} answered HELLO with {size} bytes: not a "
                               "compatible rpc-server")
            major, minor, patch = _recv_exact(sock, size)[:3]
    except TimeoutError as exc:
        raise RpcError(f"RPC server {endpoint} did not answer within its timeout (down, "
                       "firewalled, or serving another client)") from exc
    except OSError as exc:
        raise RpcError(f"RPC server {endpoint} unreachable: {exc}") from exc
    version = f"{major}.{minor}.{patch}"
    if major != _PROTO_MAJOR:
        raise RpcError(f"RPC server {endpoint} speaks RPC protocol {version}, this llama.cpp "
                       f"needs {_PROTO_MAJOR}.x: build rpc-server from the same llama.cpp "
                       "(scripts/build/build-rpc.sh)")
    return version


class _Ggml:
    """The few ggml backend-registry functions llama-cpp-python does not bind."""

    def __init__(self) -> None:
        lib_dir = Path(lc.llama_cpp._lib._name).parent
        lib = load_shared_library("ggml", lib_dir)
        vp, sz = ctypes.c_void_p, ctypes.c_size_t

        def fn(name: str, res: object, *args: object) -> ctypes._CFuncPtr:  # type: ignore[name-defined]
            f = getattr(lib, name)
            f.restype, f.argtypes = res, list(args)
            return f

        self.reg_by_name = fn("ggml_backend_reg_by_name", vp, ctypes.c_char_p)
        self.reg_proc = fn("ggml_backend_reg_get_proc_address", vp, vp, ctypes.c_char_p)
        self.reg_name = fn("ggml_backend_reg_name", ctypes.c_char_p, vp)
        self.reg_dev_count = fn("ggml_backend_reg_dev_count", sz, vp)
        self.reg_dev_get = fn("ggml_backend_reg_dev_get", vp, vp, sz)
        self.dev_count = fn("ggml_backend_dev_count", sz)
        self.dev_get = fn("ggml_backend_dev_get", vp, sz)
        self.dev_name = fn("ggml_backend_dev_name", ctypes.c_char_p, vp)
        self.dev_description = fn("ggml_backend_dev_description", ctypes.c_char_p, vp)
        self.dev_type = fn("ggml_backend_dev_type", ctypes.c_int, vp)
        self.dev_reg = fn("ggml_backend_dev_backend_reg", vp, vp)
        self.dev_memory = fn("ggml_backend_dev_memory", None, vp, ctypes.POINTER(sz),
                             ctypes.POINTER(sz))
        self.set_abort_callback = fn("ggml_set_abort_callback", vp, vp)
        self.dev_by_type = fn("ggml_backend_dev_by_type", vp, ctypes.c_int)
        self.buft_name = fn("ggml_backend_buft_name", ctypes.c_char_p, vp)


_ggml: _Ggml | None = None


def ggml() -> _Ggml:
    global _ggml
    if _ggml is None:
        _ggml = _Ggml()
    return _ggml


@dataclass(frozen=True)
class RpcDevice:
    endpoint: Endpoint
    name: str  # RPC0, RPC1, ... in the order added
    handle: int  # ggml_backend_dev_t

    def memory(self) -> tuple[int, int]:
        """(free, total) bytes the rpc-server reports for its device."""
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        ggml().dev_memory(self.handle, ctypes.byref(free), ctypes.byref(total))
        return free.value, total.value


_added: dict[Endpoint, tuple[RpcDevice, ...]] = {}


def _require_rpc() -> None:
    if not lc.llama_supports_rpc():
        built = rpc_build_dir()
        hint = (f"set LLAMA_CPP_LIB_PATH={built / 'lib'}" if (built / ".complete").is_file()
                else "run scripts/build/build-rpc.sh and set LLAMA_CPP_LIB_PATH")
        raise RpcError(f"--rpc needs llama.cpp built with -DGGML_RPC=on: {hint} (see the "
                       "docs/deployment.md)")


def check_servers(endpoints: tuple[Endpoint, ...]) -> None:
    """At start: this llama.cpp has RPC, and every server answers HELLO."""
    if endpoints:
        _require_rpc()
        for endpoint in endpoints:
            greet(endpoint)


def describe_servers(endpoints: tuple[Endpoint, ...]) -> list[str]:
    """A line per RPC device with the memory its server reports (`edge-server info`)."""
    init_backend()
    lines = []
    for device in add_servers(endpoints):
        free, total = device.memory()
        lines.append(f"RPC device {device.name} at {device.endpoint}: "
                     f"{free >> 20} MiB free of {total >> 20} MiB")
    return lines


def add_servers(endpoints: tuple[Endpoint, ...]) -> list[RpcDevice]:
    """The devices of each endpoint, registered once per process (as llama.cpp caches
    them): greeted first, since llama.cpp's own connect aborts the process on failure."""
    _require_rpc()
    g = ggml()
    reg = g.reg_by_name(b"RPC")
    proc = g.reg_proc(reg, b"ggml_backend_rpc_add_server") if reg else None
    if not proc:
        raise RpcError("this llama.cpp has no RPC backend registry")
    add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(proc)
    devices: list[RpcDevice] = []
    for endpoint in endpoints:
        if endpoint not in _added:
            greet(endpoint)
            server_reg = add_server(str(endpoint).encode())
            if not server_reg or g.reg_dev_count(server_reg) == 0:
                raise RpcError(f"RPC server {endpoint} offers no device")
            _added[endpoint] = tuple(
                RpcDevice(endpoint, (g.dev_name(dev) or b"?").decode(), dev)
                for dev in (g.reg_dev_get(server_reg, i)
                            for i in range(g.reg_dev_count(server_reg)))
            )
        devices += _added[endpoint]
    return devices


def local_accelerators() -> list[int]:
    """Local GPU devices as llama.cpp's default selection picks them (integrated ones only
    without a discrete one); the CPU is not listed, it takes the layers not offloaded."""
    g = ggml()
    gpus: list[int] = []
    igpus: list[int] = []
    for i in range(g.dev_count()):
        dev = g.dev_get(i)
        kind = g.dev_type(dev)
        if g.reg_name(g.dev_reg(dev)) == b"RPC":
            continue
        if kind == _DEV_TYPE_GPU:
            gpus.append(dev)
        elif kind == _DEV_TYPE_IGPU and not igpus:
            igpus.append(dev)
    return gpus or igpus


class DeviceList:
    """The NULL-terminated ggml_backend_dev_t array llama_model_params.devices points to:
    RPC servers first (as llama.cpp orders them, to minimise transfers), then local GPUs.
    llama.cpp copies the list at load, but the array is kept with the model anyway."""

    def __init__(self, endpoints: tuple[Endpoint, ...]) -> None:
        self.rpc = add_servers(endpoints)
        handles = [d.handle for d in self.rpc] + local_accelerators()
        self.array = (ctypes.c_void_p * (len(handles) + 1))(*handles, None)

    @property
    def address(self) -> int:
        return ctypes.addressof(self.array)
