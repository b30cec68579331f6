"""The client side of a WebSocket after the handshake, sans I/O, on
wsproto: bytes in, messages out; messages in, bytes out. The terminal
classes move the bytes (sync or async), so there is no background thread
or task, and any thread or task may close a connection."""

from __future__ import annotations

import base64
import hashlib
import secrets

import wsproto.events as wse
from wsproto.connection import Connection, ConnectionState, ConnectionType
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

from .errors import StreamLost

MAX_MESSAGE = 16 << 20


GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def handshake_headers() -> dict[str, str]:
    return {"Sec-WebSocket-Key": base64.b64encode(secrets.token_bytes(16)).decode(), "Sec-WebSocket-Version": "13"}


def check_accept(request_headers: dict[str, str], response_headers: object) -> None:
    """The server's Sec-WebSocket-Accept must answer the request's key."""
    want = base64.b64encode(hashlib.sha1((request_headers["Sec-WebSocket-Key"] + GUID).encode()).digest()).decode()
    if getattr(response_headers, "get", lambda _k: None)("Sec-WebSocket-Accept") != want:
        raise StreamLost("WebSocket handshake failed: bad Sec-WebSocket-Accept")


class WebSocket:
    """One client connection's protocol state."""

    def __init__(self) -> None:
        self._c = Connection(ConnectionType.CLIENT)
        self._text: list[str] = []
        self._bin: list[bytes] = []
        self._size = 0
        #: set once the connection is closed (by either side)
        self.closed = False
        #: why it closed, when that was a failure (raised once the messages
        #: that came before it are read)
        self.error: StreamLost | None = None

    def receive(self, data: bytes) -> tuple[list[tuple[bool, bytes | str]], bytes]:
        """Feeds bytes read (b"" at EOF); returns the whole messages they
        complete as (binary, payload) and the bytes to send back (pongs, the
        close reply)."""
        out: list[tuple[bool, bytes | str]] = []
        reply = b""
        try:
            self._c.receive_data(data or None)
            for ev in self._c.events():
                if isinstance(ev, wse.Ping):
                    reply += self._c.send(ev.response())
                elif isinstance(ev, wse.CloseConnection):
                    if self._c.state == ConnectionState.REMOTE_CLOSING:
                        reply += self._c.send(ev.response())
                    elif self._c.state == ConnectionState.OPEN:
                        # wsproto's own verdict on bytes it could not parse
                        reply += self._c.send(wse.CloseConnection(code=ev.code, reason=ev.reason))
                    if ev.code not in (1000, 1001, 1005):
                        self.error = StreamLost(f"WebSocket closed with {ev.code} {ev.reason or ''}".rstrip())
                    self.closed = True
                elif isinstance(ev, (wse.TextMessage, wse.BytesMessage)):
                    self._size += len(ev.data)
                    if self._size > MAX_MESSAGE:
                        self.error = StreamLost(f"a WebSocket message larger than {MAX_MESSAGE} bytes")
                        self.closed = True
                        return out, reply + self._c.send(wse.CloseConnection(code=1009))
                    if isinstance(ev, wse.TextMessage):
                        self._text.append(ev.data)
                    else:
                        self._bin.append(bytes(ev.data))
                    if ev.message_finished:
                        msg: tuple[bool, bytes | str] = (True, b"".join(self._bin)) if isinstance(ev, wse.BytesMessage) else (False, "".join(self._text))
                        self._text, self._bin, self._size = [], [], 0
                        out.append(msg)
        except (LocalProtocolError, RemoteProtocolError) as err:
            self.closed = True
            self.error = StreamLost(f"WebSocket: {err}")
            return out, reply
        if not data:
            self.closed = True
        return out, reply

    def send(self, payload: bytes | str) -> bytes:
        """The bytes of one message."""
        if self.closed or self._c.state != ConnectionState.OPEN:
            raise StreamLost("the terminal connection is closed")
        ev = wse.BytesMessage(data=payload) if isinstance(payload, bytes) else wse.TextMessage(data=payload)
        return self._c.send(ev)

    def close(self, code: int = 1000, reason: str = "detach") -> bytes:
        """The bytes of the closing handshake (b"" when already closing)."""
        self.closed = True
        if self._c.state != ConnectionState.OPEN:
            return b""
        return self._c.send(wse.CloseConnection(code=code, reason=reason))
