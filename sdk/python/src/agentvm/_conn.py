"""Helpers for connections the server switched to another protocol (exec
frames, WebSocket, TCP): closing them so that a reader blocked in another
thread wakes, and one error type for a connection that broke."""

from __future__ import annotations

import socket
from typing import Any

from .errors import StreamLost


def hard_close(ns: Any) -> None:
    """Closes a sync network stream after shutting its socket down: close()
    alone neither wakes a recv blocked in another thread nor sends a FIN."""
    sock = ns.get_extra_info("socket")
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already gone
    ns.close()


def lost(what: str, err: BaseException | None = None) -> StreamLost:
    return StreamLost(f"{what}: {err}" if err is not None else what)
