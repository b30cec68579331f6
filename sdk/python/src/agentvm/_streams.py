"""Streamed answers, read with ``for`` on the sync client and ``async for``
on the async one: NDJSON (exec events, followed events and logs, code
runs) and raw bytes (file and tar downloads, job output)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Generic, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from .errors import StreamLost

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


def parse(model: type[M], data: Any) -> M:
    """Validates an answer into its model. An answer that does not validate
    (a newer server's new enum value, say) is kept unvalidated rather than
    refused, so an older SDK keeps working against a newer server."""
    try:
        return model.model_validate(data)
    except ValidationError:
        return model.model_construct(**data) if isinstance(data, dict) else model.model_construct()


def parse_list(model: type[M], data: Any, key: str) -> list[M]:
    return [parse(model, x) for x in (data or {}).get(key) or []]


class _Stream:
    def __init__(self, resp: httpx.Response) -> None:
        self._resp = resp
        self.headers = resp.headers

    def close(self) -> None:
        """Ends the stream (sync client)."""
        self._resp.close()

    async def aclose(self) -> None:
        """Ends the stream (async client)."""
        await self._resp.aclose()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    async def __aenter__(self) -> Any:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


class LineStream(_Stream, Generic[T]):
    """An NDJSON (or plain text) answer, one item per line as it arrives.
    Leaving the loop, or ``close()``/``aclose()``, ends the request."""

    def __init__(self, resp: httpx.Response, decode: Callable[[str], T]) -> None:
        super().__init__(resp)
        self._decode = decode

    def __iter__(self) -> Iterator[T]:
        try:
            for line in self._resp.iter_lines():
                if line.strip():
                    yield self._decode(line)
        except httpx.TransportError as err:
            raise StreamLost(f"the stream ended early: {err}") from err
        finally:
            self._resp.close()

    async def __aiter__(self) -> AsyncIterator[T]:
        try:
            async for line in self._resp.aiter_lines():
                if line.strip():
                    yield self._decode(line)
        except httpx.TransportError as err:
            raise StreamLost(f"the stream ended early: {err}") from err
        finally:
            await self._resp.aclose()


def json_lines(model: type[M]) -> Callable[[str], M]:
    return lambda line: parse(model, json.loads(line))


class ByteStream(_Stream):
    """A raw body (a file, a tar stream, a job's output) in chunks as they
    arrive; ``read()``/``aread()`` collect it whole. A file's stream has
    its ``info`` (type, mode, size, mtime) from the answer's headers."""

    def __init__(self, resp: httpx.Response, info: Any = None) -> None:
        super().__init__(resp)
        self.info = info

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._resp.iter_bytes()
        except httpx.TransportError as err:
            raise StreamLost(f"the stream ended early: {err}") from err
        finally:
            self._resp.close()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._resp.aiter_bytes():
                yield chunk
        except httpx.TransportError as err:
            raise StreamLost(f"the stream ended early: {err}") from err
        finally:
            await self._resp.aclose()

    def read(self) -> bytes:
        return b"".join(self)

    async def aread(self) -> bytes:
        return b"".join([c async for c in self])
