"""Terminals: named PTY sessions owned by the guest agent, which keep
running with nobody attached. Attaching is a WebSocket (binary messages
carry the terminal's bytes, text messages JSON control messages) over the
client's own connection; _ws.py speaks the protocol, these classes move
the bytes."""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import httpx

from ._conn import hard_close, wait_readable
from ._streams import parse, parse_list
from ._transport import Call, Op, drop_none, op, query, seg
from ._ws import WebSocket, check_accept, handshake_headers
from .errors import StreamLost
from .models import TermInfo


class _TermState:
    """What both terminal classes share: the protocol, output not yet
    read, and the exit message."""

    def __init__(self) -> None:
        self.ws = WebSocket()
        self.out: deque[bytes] = deque()
        #: the exit message ({"type": "exit", "exit_code": n}) once the program exited
        self.exit: dict[str, Any] | None = None

    def ended(self, closed: bool) -> bool:
        """Whether no more output can come (the stream ended, or the caller
        closed it); a protocol error the stream met is raised, once."""
        if self.ws.error is not None:
            err, self.ws.error = self.ws.error, None
            raise err
        return self.ws.closed or closed

    def take(self, data: bytes) -> bytes:
        """Feeds bytes read; queues the output; returns bytes to send back."""
        msgs, reply = self.ws.receive(data)
        for binary, payload in msgs:
            if binary:
                if payload:
                    self.out.append(payload)  # type: ignore[arg-type]
                continue
            try:
                c = json.loads(payload)
            except ValueError:
                continue
            if isinstance(c, dict) and c.get("type") == "exit":
                c.setdefault("exit_code", 0)  # the server leaves a 0 out
                self.exit = c
        return reply


def _control(**msg: Any) -> str:
    return json.dumps(msg)


class Terminal:
    """An attached terminal (sync client). ``read()`` or ``for chunk in t``
    gives its output, scrollback first; the output ends when the program
    exits (``exit``) or the connection closes. ``close()`` (from any thread)
    detaches and leaves the program running."""

    def __init__(self, resp: httpx.Response) -> None:
        self._resp = resp
        self._ns = resp.extensions["network_stream"]
        self._st = _TermState()
        self._wlock = threading.Lock()
        self._closed = False

    @property
    def exit(self) -> dict[str, Any] | None:
        return self._st.exit

    def _write(self, data: bytes, timeout: float | None = None) -> None:
        if not data:
            return
        if not self._wlock.acquire(timeout=-1 if timeout is None else timeout):
            raise StreamLost("the terminal connection is stuck: a write did not finish in time")
        try:
            self._ns.write(data, timeout=timeout)
        except Exception as err:
            raise StreamLost(f"the terminal connection broke: {err}") from err
        finally:
            self._wlock.release()

    def read(self, timeout: float | None = None) -> bytes | None:
        """The next chunk of output; None once it ended (or was closed, from
        any thread: output still buffered is dropped with it). With a
        timeout (0 polls), raises TimeoutError when
        nothing came in that time; a broken connection is StreamLost."""
        if self._closed:
            return None  # what was still buffered went with the close
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._st.out:
            if self._st.ended(self._closed):
                return None
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not wait_readable(self._ns, left):
                raise TimeoutError("no terminal output in time")
            try:
                data = self._ns.read(65536)
            except Exception as err:
                if self._closed:
                    return None  # closed here, from another thread
                raise StreamLost(f"the terminal connection broke: {err}") from err
            reply = self._st.take(data)
            try:
                self._write(reply)
            except StreamLost:
                pass  # a pong or close reply that could not go: the next read says
        return self._st.out.popleft()

    def __iter__(self) -> Iterator[bytes]:
        while (b := self.read()) is not None:
            yield b

    def write(self, data: str | bytes) -> None:
        """Sends input (keystrokes)."""
        self._write(self._st.ws.send(data.encode() if isinstance(data, str) else bytes(data)))

    def resize(self, cols: int, rows: int) -> None:
        self._write(self._st.ws.send(_control(type="resize", cols=cols, rows=rows)))

    def signal(self, sig: str) -> None:
        """Sends a signal ("INT", "TERM"...) to the foreground process group."""
        self._write(self._st.ws.send(_control(type="signal", signal=sig)))

    def close(self) -> None:
        """Detaches; the program keeps running in the VM."""
        if self._closed:
            return
        self._closed = True
        try:
            # The closing handshake, if it can go within 2 s (a writer stuck
            # on a peer that does not read must not hold the close).
            self._write(self._st.ws.close(), timeout=2)
        except StreamLost:
            pass
        finally:
            hard_close(self._ns)
            self._resp.close()

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncTerminal:
    """An attached terminal (async client). Any task may read, write or
    close it."""

    def __init__(self, resp: httpx.Response) -> None:
        self._resp = resp
        self._ns = resp.extensions["network_stream"]
        self._st = _TermState()
        self._wlock = anyio.Lock()
        self._rlock = anyio.Lock()
        self._closed = False

    @property
    def exit(self) -> dict[str, Any] | None:
        return self._st.exit

    async def _write(self, data: bytes) -> None:
        if not data:
            return
        async with self._wlock:
            try:
                await self._ns.write(data)
            except Exception as err:
                raise StreamLost(f"the terminal connection broke: {err}") from err

    async def read(self, timeout: float | None = None) -> bytes | None:
        """The next chunk of output; None once it ended (or was closed, from
        any task: output still buffered is dropped with it). With a timeout,
        raises TimeoutError when nothing came in
        that time; a broken connection is StreamLost. Readers take turns."""
        async with self._rlock:
            if self._closed:
                return None  # what was still buffered went with the close
            with anyio.fail_after(timeout):
                while not self._st.out:
                    if self._st.ended(self._closed):
                        return None
                    try:
                        data = await self._ns.read(65536)
                    except Exception as err:
                        if self._closed:
                            return None
                        raise StreamLost(f"the terminal connection broke: {err}") from err
                    try:
                        await self._write(self._st.take(data))
                    except StreamLost:
                        pass
                return self._st.out.popleft()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while (b := await self.read()) is not None:
            yield b

    async def write(self, data: str | bytes) -> None:
        await self._write(self._st.ws.send(data.encode() if isinstance(data, str) else bytes(data)))

    async def resize(self, cols: int, rows: int) -> None:
        await self._write(self._st.ws.send(_control(type="resize", cols=cols, rows=rows)))

    async def signal(self, sig: str) -> None:
        await self._write(self._st.ws.send(_control(type="signal", signal=sig)))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            with anyio.move_on_after(5):
                await self._write(self._st.ws.close())
        except StreamLost:
            pass
        finally:
            try:
                await self._ns.aclose()
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
        body = drop_none(name=name, argv=argv, cols=cols, rows=rows, env=env, cwd=cwd, user=user, **extra)
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
        AsyncTerminal (async); a missing terminal is NotFound. cols and rows (both) resize on attach;
        scrollback=False skips the replay of earlier output."""
        params = query(cols=cols if cols and rows else None, rows=rows if cols and rows else None, scrollback=None if scrollback else "0")
        call = Call("GET", self._path(name), params=params, headers=handshake_headers(), upgrade="websocket")
        if self._t.is_async:

            async def opened() -> AsyncTerminal:
                resp = await self._t.send(call)
                try:
                    check_accept(call.headers, resp.headers)
                except StreamLost:
                    await resp.aclose()
                    raise
                return AsyncTerminal(resp)

            return opened()
        resp = self._t.send(call)
        try:
            check_accept(call.headers, resp.headers)
        except StreamLost:
            resp.close()
            raise
        return Terminal(resp)
