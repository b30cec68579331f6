"""Terminals: named PTY sessions owned by the guest agent, which keep
running with nobody attached. Attaching is a WebSocket (binary messages
carry the terminal's bytes, text messages JSON control messages), spoken
by httpx-ws over the client's own connection."""

from __future__ import annotations

import base64
import json
import queue
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import wsproto.events as wse
from httpx_ws import AsyncWebSocketSession, WebSocketDisconnect, WebSocketNetworkError, WebSocketSession

from ._streams import parse, parse_list
from ._transport import Call, Op, op, query, seg
from .models import TermInfo

MAX_MESSAGE = 16 << 20


def _ws_call(path: str, params: dict[str, Any]) -> Call:
    return Call(
        "GET",
        path,
        params=params,
        headers={"Sec-WebSocket-Key": base64.b64encode(secrets.token_bytes(16)).decode(), "Sec-WebSocket-Version": "13"},
        upgrade="websocket",
    )


class _TermState:
    def __init__(self) -> None:
        #: The exit message ({"type": "exit", "exit_code": n}) once the program exited.
        self.exit: dict[str, Any] | None = None

    def take(self, ev: Any) -> bytes | None:
        """Output bytes of a message, or None for a control message."""
        if isinstance(ev, wse.BytesMessage):
            return bytes(ev.data)
        if isinstance(ev, wse.TextMessage):
            try:
                c = json.loads(ev.data)
                if isinstance(c, dict) and c.get("type") == "exit":
                    self.exit = c
            except ValueError:
                pass
        return None


class Terminal:
    """An attached terminal (sync client). ``read()`` or ``for chunk in t``
    gives its output, scrollback first; the output ends when the program
    exits (``exit``) or the connection closes. ``close()`` detaches and
    leaves the program running."""

    def __init__(self, resp: httpx.Response) -> None:
        self._resp = resp
        self._ws = WebSocketSession(resp.extensions["network_stream"], max_message_size_bytes=MAX_MESSAGE, response=resp)
        self._ws.__enter__()
        self._st = _TermState()
        self._ended = False

    @property
    def exit(self) -> dict[str, Any] | None:
        return self._st.exit

    def read(self, timeout: float | None = None) -> bytes | None:
        """The next chunk of output; None once it ended (or was closed, from
        any thread). With a timeout, raises TimeoutError when nothing came
        in that time."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._ended:
            # Short waits, so that close() from another thread ends a read.
            wait = 0.5 if deadline is None else max(0.0, min(0.5, deadline - time.monotonic()))
            try:
                ev = self._ws.receive(timeout=wait)
            except queue.Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError("no terminal output in time") from None
                continue
            except (WebSocketDisconnect, WebSocketNetworkError):
                self._ended = True
                break
            data = self._st.take(ev)
            if data:
                return data
        return None

    def __iter__(self) -> Iterator[bytes]:
        while (b := self.read()) is not None:
            yield b

    def write(self, data: str | bytes) -> None:
        """Sends input (keystrokes)."""
        self._ws.send_bytes(data.encode() if isinstance(data, str) else data)

    def resize(self, cols: int, rows: int) -> None:
        self._ws.send_text(json.dumps({"type": "resize", "cols": cols, "rows": rows}))

    def signal(self, sig: str) -> None:
        """Sends a signal ("INT", "TERM"...) to the foreground process group."""
        self._ws.send_text(json.dumps({"type": "signal", "signal": sig}))

    def close(self) -> None:
        """Detaches; the program keeps running in the VM."""
        if not self._ended:
            self._ended = True
        try:
            self._ws.__exit__(None, None, None)
        finally:
            self._resp.close()

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncTerminal:
    """An attached terminal (async client); use it with ``async with`` (or
    close it in the task that attached it)."""

    def __init__(self, resp: httpx.Response) -> None:
        self._resp = resp
        self._ws = AsyncWebSocketSession(resp.extensions["network_stream"], max_message_size_bytes=MAX_MESSAGE, response=resp)
        self._cm: Any = None
        self._st = _TermState()
        self._ended = False

    async def _open(self) -> AsyncTerminal:
        self._cm = self._ws.__asynccontextmanager__()
        await self._cm.__aenter__()
        return self

    @property
    def exit(self) -> dict[str, Any] | None:
        return self._st.exit

    async def read(self, timeout: float | None = None) -> bytes | None:
        while not self._ended:
            try:
                ev = await self._ws.receive(timeout=timeout)
            except (WebSocketDisconnect, WebSocketNetworkError):
                self._ended = True
                break
            data = self._st.take(ev)
            if data:
                return data
        return None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while (b := await self.read()) is not None:
            yield b

    async def write(self, data: str | bytes) -> None:
        await self._ws.send_bytes(data.encode() if isinstance(data, str) else data)

    async def resize(self, cols: int, rows: int) -> None:
        await self._ws.send_text(json.dumps({"type": "resize", "cols": cols, "rows": rows}))

    async def signal(self, sig: str) -> None:
        await self._ws.send_text(json.dumps({"type": "signal", "signal": sig}))

    async def close(self) -> None:
        self._ended = True
        cm, self._cm = self._cm, None
        try:
            if cm is not None:
                await cm.__aexit__(None, None, None)
        finally:
            await self._resp.aclose()

    async def __aenter__(self) -> AsyncTerminal:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class Terminals:
    """A VM's terminal sessions."""

    def __init__(self, t: Any, vm: str) -> None:
        self._t = t
        self._vm = vm

    def _path(self, name: str | None = None, rest: str = "") -> str:
        p = f"/v1/vms/{seg(self._vm)}/terminals"
        return p if name is None else f"{p}/{seg(name)}{rest}"

    @op
    def list(self) -> Op[list[TermInfo]]:
        r = yield Call("GET", self._path())
        return parse_list(TermInfo, r.json(), "terminals")

    @op
    def create(self, name: str | None = None, *, argv: list[str] | None = None, cols: int | None = None, rows: int | None = None, env: dict[str, str] | None = None, cwd: str | None = None, user: str | None = None, **extra: Any) -> Op[TermInfo]:
        """Starts a session: argv (default the user's login shell) on a PTY."""
        body = {k: v for k, v in dict(name=name, argv=argv, cols=cols, rows=rows, env=env, cwd=cwd, user=user, **extra).items() if v is not None}
        r = yield Call("POST", self._path(), json=body)
        return parse(TermInfo, r.json())

    @op
    def get(self, name: str) -> Op[TermInfo]:
        r = yield Call("GET", self._path(name))
        return parse(TermInfo, r.json())

    @op
    def kill(self, name: str) -> Op[None]:
        """Ends a session (SIGHUP, then SIGKILL) and removes it."""
        yield Call("DELETE", self._path(name))

    @op
    def resize(self, name: str, cols: int, rows: int) -> Op[None]:
        yield Call("POST", self._path(name, "/resize"), json={"cols": cols, "rows": rows})

    @op
    def signal(self, name: str, sig: str) -> Op[None]:
        yield Call("POST", self._path(name, "/signal"), json={"signal": sig})

    def attach(self, name: str, *, cols: int | None = None, rows: int | None = None, scrollback: bool = True) -> Any:
        """Attaches over a WebSocket: a Terminal (sync), or a coroutine of an
        AsyncTerminal (async). cols and rows (both) resize on attach;
        scrollback=False skips the replay of earlier output."""
        params = query(cols=cols if cols and rows else None, rows=rows if cols and rows else None, scrollback=None if scrollback else "0")
        call = _ws_call(self._path(name), params)
        if self._t.is_async:

            async def opened() -> AsyncTerminal:
                return await AsyncTerminal(await self._t.send(call))._open()

            return opened()
        return Terminal(self._t.send(call))
