"""Helpers for connections the server switched to another protocol (exec
frames, WebSocket, TCP): closing them so that a reader blocked in another
thread wakes, and waiting for bytes with a deadline of one's own."""

from __future__ import annotations

import select
import socket
from typing import Any



def hard_close(ns: Any) -> None:
    """Closes a sync network stream after shutting its socket down: close()
    alone neither wakes a recv blocked in another thread nor sends a FIN."""
    sock = ns.get_extra_info("socket")
    if sock is not None:
        try:
            # The plain socket's shutdown, also under TLS: SSLSocket.shutdown
            # drops its TLS state first, and a writer in another thread would
            # then send in the clear for a moment.
            socket.socket.shutdown(sock, socket.SHUT_RDWR)
        except OSError:
            pass  # already gone
    ns.close()


def wait_readable(ns: Any, timeout: float | None) -> bool:
    """Waits until a sync network stream has bytes to read (or EOF), at most
    timeout seconds (None: no limit; 0: a poll), without touching the
    socket's own timeout, which a writer in another thread sets too."""
    if getattr(ns, "_leading_data", b""):
        # Bytes that came with the upgrade's answer (the terminal's
        # scrollback, often in the same segment as the 101): httpcore's
        # upgraded stream holds them and returns them first, so the socket
        # has nothing to poll for; waiting on it lost them until more came.
        return True
    sock = ns.get_extra_info("socket")
    ssl_obj = ns.get_extra_info("ssl_object")
    if sock is None or (ssl_obj is not None and ssl_obj.pending()):
        return True
    # poll(2), not epoll: a close from another thread shuts the socket down
    # and then closes it, and epoll forgets a closed descriptor before this
    # thread may see the shutdown's wakeup; poll sees the hangup.
    try:
        p = select.poll()
        p.register(sock, select.POLLIN | select.POLLPRI)
        return bool(p.poll(None if timeout is None else timeout * 1000))
    except (ValueError, OSError):
        return True  # closed meanwhile: the read that follows says so

