"""Exec in its three shapes: buffered (one ExecResult), NDJSON events as
they are produced, and the upgraded frame stream with stdin (``Process``),
plus raw TCP streams to a port inside a VM (``Connection``).

The upgraded stream (``Upgrade: agentvm-exec``) carries frames of 1 byte
type, 4 bytes big-endian length and the payload (at most 16 MiB)."""

from __future__ import annotations

import json
import struct
import threading
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import httpx

from ._conn import hard_close
from .errors import StreamLost
from .models import ExitStatus

STDIN, STDIN_EOF, STDOUT, STDERR, EXIT, ERROR, SIGNAL = 1, 2, 3, 4, 5, 6, 7
HEADER = 5
MAX_PAYLOAD = 16 << 20
STDIN_CHUNK = 64 << 10

SIGNALS = {
    "HUP": 1, "INT": 2, "QUIT": 3, "ILL": 4, "TRAP": 5, "ABRT": 6, "BUS": 7, "FPE": 8, "KILL": 9,
    "USR1": 10, "SEGV": 11, "USR2": 12, "PIPE": 13, "ALRM": 14, "TERM": 15, "STKFLT": 16,
    "CHLD": 17, "CONT": 18, "STOP": 19, "TSTP": 20, "TTIN": 21, "TTOU": 22, "URG": 23,
    "XCPU": 24, "XFSZ": 25, "VTALRM": 26, "PROF": 27, "WINCH": 28, "IO": 29, "PWR": 30, "SYS": 31,
}  # fmt: skip

Command = str | list[str]


def signal_number(sig: int | str) -> int:
    """A signal as Linux numbers it: a number, or a name with or without SIG."""
    if isinstance(sig, int):
        return sig
    name = sig.upper().removeprefix("SIG")
    n = int(name) if name.isdigit() else SIGNALS.get(name, 0)
    if not n:
        raise ValueError(f"unknown signal {sig!r}")
    return n


def exec_request(cmd: Command | dict[str, Any], *, env: dict[str, str] | None = None, cwd: str | None = None, user: str | None = None, timeout: float | str | None = None, stdin: str | None = None) -> dict[str, Any]:
    """The API's ExecRequest: a string is a shell command line, a list an argv."""
    if isinstance(cmd, str):
        req: dict[str, Any] = {"shell": cmd}
    elif isinstance(cmd, dict):
        req = dict(cmd)
    else:
        req = {"cmd": list(cmd)}
    for k, v in (("env", env), ("cwd", cwd), ("user", user), ("timeout", timeout), ("stdin", stdin)):
        if v is not None:
            req[k] = v
    return req


def encode_frame(kind: int, payload: bytes = b"") -> bytes:
    return struct.pack(">BI", kind, len(payload)) + payload


class FrameDecoder:
    """Splits a byte stream into (type, payload) frames; chunks may cut
    frames anywhere."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def push(self, chunk: bytes) -> list[tuple[int, bytes]]:
        self._buf += chunk
        out = []
        while len(self._buf) >= HEADER:
            kind, n = struct.unpack_from(">BI", self._buf)
            if n > MAX_PAYLOAD:
                raise StreamLost(f"exec frame of {n} bytes is larger than {MAX_PAYLOAD}")
            if len(self._buf) < HEADER + n:
                break
            out.append((kind, bytes(self._buf[HEADER : HEADER + n])))
            del self._buf[: HEADER + n]
        return out

    @property
    def pending(self) -> int:
        return len(self._buf)


@dataclass
class RunResult:
    """What a command run over the stream printed, and how it ended."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    signal: str | None = None
    timed_out: bool = False
    duration_ms: int = 0

    @property
    def text(self) -> str:
        return self.stdout.decode("utf-8", "replace")


class _ProcState:
    """What both Process classes share: decoding frames into output events
    and the exit status."""

    def __init__(self) -> None:
        self.decoder = FrameDecoder()
        self.events: deque[tuple[str, bytes]] = deque()
        self.exit: ExitStatus | None = None
        self.errors: list[str] = []

    def feed(self, data: bytes) -> None:
        for kind, payload in self.decoder.push(data):
            if kind == STDOUT:
                self.events.append(("stdout", payload))
            elif kind == STDERR:
                self.events.append(("stderr", payload))
            elif kind == ERROR:
                try:
                    msg = json.loads(payload).get("message", "")
                except ValueError:
                    msg = payload.decode("utf-8", "replace")
                if msg:
                    self.errors.append(msg)
                    self.events.append(("stderr", (msg + "\n").encode()))
            elif kind == EXIT:
                try:
                    self.exit = ExitStatus.model_validate_json(payload)
                except ValueError as err:
                    raise StreamLost(f"exec: bad exit frame: {err}") from err

    def lost(self) -> StreamLost:
        last = f": {self.errors[-1]}" if self.errors else ""
        return StreamLost("exec stream ended before the command exited" + last)

    def result(self, out: list[bytes], err: list[bytes]) -> RunResult:
        st = self.exit
        assert st is not None
        return RunResult(st.exit_code, b"".join(out), b"".join(err), st.signal or None, bool(st.timed_out), st.duration_ms)


def _stdin_frames(data: bytes) -> Iterator[bytes]:
    for off in range(0, len(data), STDIN_CHUNK):
        yield encode_frame(STDIN, data[off : off + STDIN_CHUNK])


def _bytes(data: str | bytes) -> bytes:
    return data.encode() if isinstance(data, str) else bytes(data)


class Process:
    """A running command over the upgraded exec stream (sync client): write
    to its stdin, read its output as it comes, signal it, wait for it.
    ``for kind, data in p`` yields ("stdout"|"stderr", bytes) until it exits."""

    def __init__(self, resp: httpx.Response) -> None:
        self._resp = resp
        self._ns = resp.extensions["network_stream"]
        self._st = _ProcState()
        self._wlock = threading.Lock()
        self._closed = False

    @property
    def exit_status(self) -> ExitStatus | None:
        """The exit status, once the command exited."""
        return self._st.exit

    @property
    def errors(self) -> list[str]:
        """Guest-reported errors ("command not found"); also in stderr."""
        return self._st.errors

    def _send(self, frame: bytes) -> None:
        if self._closed:
            raise StreamLost("exec stream is closed")
        with self._wlock:
            try:
                self._ns.write(frame)
            except Exception as err:  # httpcore's and the socket's errors alike
                raise StreamLost(f"exec stream is closed: {err}") from err

    def write(self, data: str | bytes) -> None:
        """Writes to the command's stdin."""
        for f in _stdin_frames(_bytes(data)):
            self._send(f)

    def close_stdin(self, data: str | bytes | None = None) -> None:
        """Writes data if given, then closes the command's stdin."""
        if data is not None:
            self.write(data)
        self._send(encode_frame(STDIN_EOF))

    def signal(self, sig: int | str) -> None:
        """Sends a signal to the command's process group."""
        self._send(encode_frame(SIGNAL, str(signal_number(sig)).encode()))

    def kill(self) -> None:
        """Closes the stream (from any thread: a read or write blocked in
        another ends with StreamLost); a command still running is killed by
        the guest."""
        if not self._closed:
            self._closed = True
            try:
                hard_close(self._ns)
            finally:
                self._resp.close()

    def read(self) -> tuple[str, bytes] | None:
        """The next chunk of output as (stream, bytes); None once it exited."""
        while not self._st.events:
            if self._st.exit is not None:
                return None
            if self._closed:
                raise self._st.lost()
            try:
                data = self._ns.read(65536)
            except Exception as err:
                self.kill()
                raise self._st.lost() from err
            if not data:
                self.kill()
                raise self._st.lost()
            self._st.feed(data)
            if self._st.exit is not None:
                self.kill()
        return self._st.events.popleft()

    def __iter__(self) -> Iterator[tuple[str, bytes]]:
        while (ev := self.read()) is not None:
            yield ev

    def wait(self) -> RunResult:
        """Reads the output to its end and returns it with the exit status
        (a non-zero exit is not an error; a lost stream raises StreamLost)."""
        out: list[bytes] = []
        err: list[bytes] = []
        for kind, data in self:
            (out if kind == "stdout" else err).append(data)
        return self._st.result(out, err)

    def __enter__(self) -> Process:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kill()


class AsyncProcess:
    """A running command over the upgraded exec stream (async client)."""

    def __init__(self, resp: httpx.Response) -> None:
        self._resp = resp
        self._ns = resp.extensions["network_stream"]
        self._st = _ProcState()
        self._wlock = anyio.Lock()
        self._closed = False

    @property
    def exit_status(self) -> ExitStatus | None:
        return self._st.exit

    @property
    def errors(self) -> list[str]:
        return self._st.errors

    async def _send(self, frame: bytes) -> None:
        if self._closed:
            raise StreamLost("exec stream is closed")
        async with self._wlock:
            try:
                await self._ns.write(frame)
            except Exception as err:
                raise StreamLost(f"exec stream is closed: {err}") from err

    async def write(self, data: str | bytes) -> None:
        for f in _stdin_frames(_bytes(data)):
            await self._send(f)

    async def close_stdin(self, data: str | bytes | None = None) -> None:
        if data is not None:
            await self.write(data)
        await self._send(encode_frame(STDIN_EOF))

    async def signal(self, sig: int | str) -> None:
        await self._send(encode_frame(SIGNAL, str(signal_number(sig)).encode()))

    async def kill(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                await self._ns.aclose()
            finally:
                await self._resp.aclose()

    async def read(self) -> tuple[str, bytes] | None:
        while not self._st.events:
            if self._st.exit is not None:
                return None
            if self._closed:
                raise self._st.lost()
            try:
                data = await self._ns.read(65536)
            except Exception as err:
                await self.kill()
                raise self._st.lost() from err
            if not data:
                await self.kill()
                raise self._st.lost()
            self._st.feed(data)
            if self._st.exit is not None:
                await self.kill()
        return self._st.events.popleft()

    async def __aiter__(self) -> AsyncIterator[tuple[str, bytes]]:
        while (ev := await self.read()) is not None:
            yield ev

    async def wait(self) -> RunResult:
        out: list[bytes] = []
        err: list[bytes] = []
        async for kind, data in self:
            (out if kind == "stdout" else err).append(data)
        return self._st.result(out, err)

    async def __aenter__(self) -> AsyncProcess:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.kill()


class Feeder:
    """Writes a command's stdin while its output is read (a command that
    echoes its input would otherwise fill both pipes and stall). A source
    that fails ends the command; its error is kept for the caller, who
    raises it when the command did not complete."""

    def __init__(self) -> None:
        self.error: BaseException | None = None

    def run(self, p: Process, src: str | bytes | Iterable[str | bytes]) -> threading.Thread:
        def put(write: Any, *args: Any) -> bool:
            try:
                write(*args)
                return True
            except StreamLost:
                return False  # the command exited before reading all of its input

        def go() -> None:
            if isinstance(src, (str, bytes, bytearray)):
                put(p.close_stdin, src)
                return
            try:
                for chunk in src:
                    if not put(p.write, chunk):
                        return
            except BaseException as err:  # the source failed: end the command
                self.error = err
                p.kill()
                return
            put(p.close_stdin)

        t = threading.Thread(target=go, daemon=True)
        t.start()
        return t

    async def arun(self, p: AsyncProcess, src: str | bytes | Iterable[str | bytes] | AsyncIterable[str | bytes]) -> None:
        async def put(write: Any, *args: Any) -> bool:
            try:
                await write(*args)
                return True
            except StreamLost:
                return False

        if isinstance(src, (str, bytes, bytearray)):
            await put(p.close_stdin, src)
            return
        try:
            if isinstance(src, AsyncIterable):
                async for chunk in src:
                    if not await put(p.write, chunk):
                        return
            else:
                for chunk in src:
                    if not await put(p.write, chunk):
                        return
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as err:
            self.error = err
            await p.kill()
            return
        await put(p.close_stdin)


class Connection:
    """A raw TCP stream to a port inside a VM, through the server (sync)."""

    def __init__(self, resp: httpx.Response) -> None:
        self._resp = resp
        self._ns = resp.extensions["network_stream"]

    def send(self, data: bytes) -> None:
        try:
            self._ns.write(data)
        except Exception as err:
            raise StreamLost(f"the TCP stream broke: {err}") from err

    def recv(self, n: int = 65536) -> bytes:
        """Up to n bytes; b"" once the other side closed."""
        try:
            return self._ns.read(n)
        except Exception as err:
            raise StreamLost(f"the TCP stream broke: {err}") from err

    def close(self) -> None:
        """Closes the stream (from any thread)."""
        try:
            hard_close(self._ns)
        finally:
            self._resp.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncConnection:
    """A raw TCP stream to a port inside a VM, through the server (async)."""

    def __init__(self, resp: httpx.Response) -> None:
        self._resp = resp
        self._ns = resp.extensions["network_stream"]

    async def send(self, data: bytes) -> None:
        try:
            await self._ns.write(data)
        except Exception as err:
            raise StreamLost(f"the TCP stream broke: {err}") from err

    async def recv(self, n: int = 65536) -> bytes:
        try:
            return await self._ns.read(n)
        except Exception as err:
            raise StreamLost(f"the TCP stream broke: {err}") from err

    async def aclose(self) -> None:
        try:
            await self._ns.aclose()
        finally:
            await self._resp.aclose()

    async def __aenter__(self) -> AsyncConnection:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()
