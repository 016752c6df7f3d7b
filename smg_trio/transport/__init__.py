"""Sockets and topology: the trio⇄pyzmq adapter, socket-dir safety, binding and the handshake."""

from smg_trio.transport.engine_side import ENGINE_LINGER_MS, EngineSockets, dial_frontend
from smg_trio.transport.handshake import (
    READY_TIMEOUT_S,
    EngineRegistration,
    engine_index,
    run_handshake,
)
from smg_trio.transport.sockdir import (
    SUN_PATH_MAX,
    check_ipc_path,
    ensure_ipc_socket_dir,
    unlink_stale_socket,
)
from smg_trio.transport.topology import (
    BoundSockets,
    HandshakeSocket,
    bind_handshake_socket,
    bind_worker_sockets,
)
from smg_trio.transport.zsocket import Frame, ZmqSocket, zmq_context

__all__ = [
    "ENGINE_LINGER_MS",
    "READY_TIMEOUT_S",
    "SUN_PATH_MAX",
    "BoundSockets",
    "EngineRegistration",
    "EngineSockets",
    "HandshakeSocket",
    "Frame",
    "ZmqSocket",
    "bind_handshake_socket",
    "bind_worker_sockets",
    "check_ipc_path",
    "dial_frontend",
    "engine_index",
    "ensure_ipc_socket_dir",
    "run_handshake",
    "unlink_stale_socket",
    "zmq_context",
]
