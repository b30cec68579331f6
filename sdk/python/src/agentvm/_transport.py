"""The HTTP layer, written once for both clients.

Every API call is a generator (an "op") that yields the requests it needs
as ``Call`` values and receives each ``httpx.Response``; it knows nothing
of I/O. ``SyncTransport.drive`` runs an op to its end on an
``httpx.Client``, ``AsyncTransport.drive`` returns a coroutine that runs it
on an ``httpx.AsyncClient``. So the sync client (``AgentVM``) and the async
one (``AsyncAgentVM``) share every line that builds a request or reads an
answer; only the loops that move bytes differ.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import httpx

from .errors import AgentVMError, ConnectionFailed, InvalidArgument, StreamLost, error_from_body

DEFAULT_URL = "http://127.0.0.1:7070"

T = TypeVar("T")


def seg(s: str | int) -> str:
    """Escapes one path segment (a VM id or name, a terminal name, ...)."""
    return quote(str(s), safe="")


def drop_none(**kw: Any) -> dict[str, Any]:
    """A JSON body without the fields left unset."""
    return {k: v for k, v in kw.items() if v is not None}


def query(**q: Any) -> dict[str, Any]:
    """A query string's values: None and False are left out, True is "1"."""
    out: dict[str, Any] = {}
    for k, v in q.items():
        if v is None or v is False:
            continue
        if v is True:
            v = "1"
        elif isinstance(v, (list, tuple)):
            v = [str(x) for x in v]
            if not v:
                continue
        else:
            v = str(v)
        out[k] = v
    return out


@dataclass
class Call:
    """One HTTP request an op asks for."""

    method: str
    path: str
    params: dict[str, Any] = field(default_factory=dict)
    json: Any = None
    content: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    # stream: the body is not read; the op gets the response open and must
    # hand it to a Stream (which closes it).
    stream: bool = False
    # upgrade: the protocol to switch to (Connection: Upgrade); the op gets
    # the response of the 101 with its network stream.
    upgrade: str | None = None


Op = Generator[Call, httpx.Response, T]


def op(fn: Callable[..., Op[T]]) -> Callable[..., Any]:
    """Makes a generator method an API call of its object's transport: it
    returns the value on the sync client and a coroutine on the async one."""

    @functools.wraps(fn)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        return self._t.drive(fn(self, *args, **kwargs))

    return call


def default_token(data_dir: str | None = None) -> str:
    """AGENTVM_TOKEN, else the admin token in the data dir, else ""."""
    tok = os.environ.get("AGENTVM_TOKEN")
    if tok:
        return tok
    return _file_token(data_dir or os.environ.get("AGENTVM_DATA_DIR") or str(Path.home() / ".local" / "share" / "agentvm"))


def _file_token(data_dir: str) -> str:
    """The admin token in data_dir, else ""."""
    try:
        return (Path(data_dir) / "admin.token").read_text().strip()
    except OSError:
        return ""


def _headers(call: Call, base: dict[str, str]) -> dict[str, str]:
    h = dict(base)
    h.update(call.headers)
    if call.upgrade:
        h["Connection"] = "Upgrade"
        h["Upgrade"] = call.upgrade
    return h


def _check(resp: httpx.Response, call: Call) -> None:
    if call.upgrade and resp.status_code != 101:
        if resp.status_code < 300:
            raise AgentVMError(resp.status_code, "http", f"the server did not switch to {call.upgrade} (HTTP {resp.status_code})")


class _Base:
    is_async = False

    def __init__(self, url: str | None, token: str | None, data_dir: str | None, headers: dict[str, str] | None, timeout: float | None, verify: Any) -> None:
        self.url = (url or os.environ.get("AGENTVM_URL") or DEFAULT_URL).rstrip("/")
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"agentvm URL {self.url!r} must start with http:// or https://")
        # The token of the environment (or the local admin token) goes only
        # to the server of the environment: a URL given here gets the token
        # given with it, or none.
        if token is None:
            if url is None:
                token = default_token(data_dir)
            else:
                token = _file_token(data_dir) if data_dir else ""
        self.token = token
        self.headers = dict(headers or {})
        if self.token:
            self.headers["Authorization"] = "Bearer " + self.token
        # Reads wait as long as the call runs (an exec lasts as long as its
        # command); connecting and writing give up after `timeout`.
        t = 30.0 if timeout is None else timeout
        self._timeout = httpx.Timeout(t, read=None)
        self._verify = True if verify is None else verify

    def _failed(self, call: Call, err: Exception) -> AgentVMError:
        """The error of a request that got no answer: not sent at all
        (ConnectionFailed), or broken after it was sent, when the server may
        have acted on it (StreamLost)."""
        if isinstance(err, (httpx.ConnectError, httpx.ConnectTimeout, httpx.UnsupportedProtocol, httpx.ProxyError)):
            return ConnectionFailed(0, "connection_failed", f"cannot reach agentvm at {self.url} (is `agentvm serve` running?): {err}")
        if isinstance(err, httpx.LocalProtocolError):
            return InvalidArgument(0, "invalid_argument", f"{call.method} {call.path}: the request could not be sent: {err}")
        if isinstance(err, httpx.PoolTimeout):
            return ConnectionFailed(0, "connection_failed", f"no free connection to {self.url} in time: this client has too many requests and streams open at once ({err})")
        return StreamLost(f"{call.method} {call.path}: the connection broke after the request was sent, so it may have been carried out: {err!r}")

    def _request(self, client: httpx.Client | httpx.AsyncClient, call: Call) -> httpx.Request:
        return client.build_request(
            call.method,
            self.url + call.path,
            params=call.params or None,
            json=call.json,
            content=call.content,
            headers=_headers(call, self.headers),
        )


class SyncTransport(_Base):
    """Runs ops on an httpx.Client."""

    def __init__(self, url: str | None = None, token: str | None = None, data_dir: str | None = None, headers: dict[str, str] | None = None, timeout: float | None = None, verify: Any = None) -> None:
        super().__init__(url, token, data_dir, headers, timeout, verify)
        self.client = httpx.Client(timeout=self._timeout, verify=self._verify)

    def send(self, call: Call) -> httpx.Response:
        req = self._request(self.client, call)
        try:
            resp = self.client.send(req, stream=call.stream or bool(call.upgrade))
        except (httpx.TransportError, httpx.DecodingError) as err:
            raise self._failed(call, err) from err
        if resp.status_code >= 300:
            try:
                body = resp.read()
            except (httpx.HTTPError, httpx.StreamError):
                body = b""
            finally:
                resp.close()
            raise error_from_body(resp.status_code, body.decode("utf-8", "replace"))
        try:
            _check(resp, call)
        except AgentVMError:
            resp.close()
            raise
        return resp

    def drive(self, gen: Op[T]) -> T:
        try:
            call = next(gen)
            while True:
                try:
                    resp = self.send(call)
                except AgentVMError as err:
                    call = gen.throw(err)
                    continue
                try:
                    call = gen.send(resp)
                except StopIteration:
                    raise  # the op is done (and owns any stream it kept)
                except BaseException:
                    resp.close()  # a stream the op did not take over
                    raise
        except StopIteration as stop:
            return stop.value

    def close(self) -> None:
        self.client.close()


class AsyncTransport(_Base):
    """Runs ops on an httpx.AsyncClient."""

    is_async = True

    def __init__(self, url: str | None = None, token: str | None = None, data_dir: str | None = None, headers: dict[str, str] | None = None, timeout: float | None = None, verify: Any = None) -> None:
        super().__init__(url, token, data_dir, headers, timeout, verify)
        self.client = httpx.AsyncClient(timeout=self._timeout, verify=self._verify)

    async def send(self, call: Call) -> httpx.Response:
        req = self._request(self.client, call)
        try:
            resp = await self.client.send(req, stream=call.stream or bool(call.upgrade))
        except (httpx.TransportError, httpx.DecodingError) as err:
            raise self._failed(call, err) from err
        if resp.status_code >= 300:
            try:
                body = await resp.aread()
            except (httpx.HTTPError, httpx.StreamError):
                body = b""
            finally:
                await resp.aclose()
            raise error_from_body(resp.status_code, body.decode("utf-8", "replace"))
        try:
            _check(resp, call)
        except AgentVMError:
            await resp.aclose()
            raise
        return resp

    async def drive(self, gen: Op[T]) -> T:
        try:
            call = next(gen)
            while True:
                try:
                    resp = await self.send(call)
                except AgentVMError as err:
                    call = gen.throw(err)
                    continue
                try:
                    call = gen.send(resp)
                except StopIteration:
                    raise  # the op is done (and owns any stream it kept)
                except BaseException:
                    await resp.aclose()  # a stream the op did not take over
                    raise
        except StopIteration as stop:
            return stop.value

    async def close(self) -> None:
        await self.client.aclose()


Transport = SyncTransport | AsyncTransport
