"""A VM's sub-resources: files, ports, services, processes, jobs, events and
code contexts; and the server-wide domains. Each method is written once
(an op) and serves both clients."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio

from ._streams import ByteStream, LineStream, json_lines, parse, parse_list
from ._transport import Call, Op, drop_none, op, query, seg
from .errors import AgentVMError, NotFound, Unavailable
from .exec import Command, exec_request
from .models import CodeContext, CodeEvent, Domain, Event, FileInfo, JobInfo, Port, Recording, ServiceInfo



class _VMPart:
    def __init__(self, t: Any, vm: str) -> None:
        self._t = t
        self._vm = vm

    def _p(self, rest: str) -> str:
        return f"/v1/vms/{seg(self._vm)}{rest}"


def _info_from_headers(path: str, h: Any) -> FileInfo:
    info: dict[str, Any] = {"path": path, "name": path.rstrip("/").split("/")[-1] or path, "type": h.get("X-File-Type") or "file"}
    try:
        info["mode"] = int(h.get("X-File-Mode", ""), 8)
    except ValueError:
        pass
    try:
        info["size"] = int(h.get("X-File-Size", ""))
    except ValueError:
        pass
    if h.get("X-File-Mtime"):
        info["mtime"] = h["X-File-Mtime"]
    return parse(FileInfo, info)


def _body(t: Any, data: Any) -> Any:
    """An upload's body as httpx takes it on t's client: bytes as they are;
    a file object read in 1 MiB chunks; on the async client, a sync source
    (a file object or an iterable) read without blocking the event loop."""
    if isinstance(data, str):
        return data.encode()
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    if hasattr(data, "__aiter__"):
        return data  # an async source (an async file iterates its chunks)
    if hasattr(data, "read"):
        f = data

        def chunk() -> bytes:
            b = f.read(1 << 20)
            return b.encode() if isinstance(b, str) else b  # a text-mode file too

        if t.is_async:

            async def chunks() -> AsyncIterator[bytes]:
                while b := await anyio.to_thread.run_sync(chunk):
                    yield b

            return chunks()
        return iter(chunk, b"")
    if t.is_async:
        it = iter(data)

        async def items() -> AsyncIterator[bytes]:
            for b in it:
                yield b.encode() if isinstance(b, str) else bytes(b)

        return items()
    return data


class Files(_VMPart):
    """A VM's files. Relative paths start in the user's home directory;
    ``user`` runs the operation as that guest user."""

    @op
    def read(self, path: str, *, user: str | None = None, offset: int | None = None, length: int | None = None) -> Op[bytes]:
        """A file (or a range of it) into memory."""
        r = yield Call("GET", self._p("/files"), params=query(path=path, user=user, offset=offset or None, length=length))
        return r.content

    @op
    def read_text(self, path: str, *, user: str | None = None) -> Op[str]:
        r = yield Call("GET", self._p("/files"), params=query(path=path, user=user))
        return r.content.decode("utf-8")

    @op
    def stream(self, path: str, *, user: str | None = None, offset: int | None = None, length: int | None = None) -> Op[ByteStream]:
        """A file as chunks as they arrive (``info`` has its type, mode, size)."""
        r = yield Call("GET", self._p("/files"), params=query(path=path, user=user, offset=offset or None, length=length), stream=True)
        return ByteStream(r, _info_from_headers(path, r.headers))

    @op
    def write(self, path: str, data: Any, *, user: str | None = None, mode: int | None = None, mkdirs: bool = False) -> Op[FileInfo]:
        """Replaces a file atomically with data: bytes, str, a file object or
        an iterable of bytes (an async iterable on the async client),
        streamed. Readers in the VM see the old or the new file."""
        r = yield Call(
            "PUT",
            self._p("/files"),
            params=query(path=path, user=user, mode=f"{mode:04o}" if mode else None, mkdirs=mkdirs),
            content=_body(self._t, data),
            headers={"Content-Type": "application/octet-stream"},
        )
        return parse(FileInfo, r.json())

    @op
    def stat(self, path: str, *, user: str | None = None) -> Op[FileInfo]:
        """Describes a file (lstat: a symlink is itself)."""
        r = yield Call("GET", self._p("/files/stat"), params=query(path=path, user=user))
        return parse(FileInfo, r.json())

    @op
    def exists(self, path: str, *, user: str | None = None) -> Op[bool]:
        try:
            yield Call("GET", self._p("/files/stat"), params=query(path=path, user=user))
        except NotFound:
            return False
        return True

    @op
    def list(self, path: str, *, user: str | None = None) -> Op[list[FileInfo]]:
        """A directory's entries, sorted by name."""
        r = yield Call("GET", self._p("/files/list"), params=query(path=path, user=user))
        return parse_list(FileInfo, r.json(), "entries")

    @op
    def mkdir(self, path: str, *, user: str | None = None, mode: int | None = None) -> Op[FileInfo]:
        """Creates a directory and its missing parents."""
        r = yield Call("POST", self._p("/files/mkdir"), json=drop_none(path=path, mode=mode, user=user))
        return parse(FileInfo, r.json())

    @op
    def rename(self, src: str, dst: str, *, user: str | None = None, overwrite: bool = False) -> Op[FileInfo]:
        r = yield Call("POST", self._p("/files/rename"), json=drop_none(**{"from": src, "to": dst, "overwrite": overwrite or None, "user": user}))
        return parse(FileInfo, r.json())

    @op
    def remove(self, path: str, *, user: str | None = None, recursive: bool = False) -> Op[None]:
        """Removes a file, or a directory (recursive for a non-empty one)."""
        yield Call("DELETE", self._p("/files"), params=query(path=path, user=user, recursive=recursive))

    @op
    def read_tar(self, path: str, *, user: str | None = None) -> Op[ByteStream]:
        """A tar stream of a file or directory tree (names relative to path)."""
        r = yield Call("GET", self._p("/files/tar"), params=query(path=path, user=user), stream=True)
        return ByteStream(r)

    @op
    def write_tar(self, path: str, tar: Any, *, user: str | None = None) -> Op[dict[str, int]]:
        """Extracts a tar stream (bytes, a file object or an iterable of
        bytes) into the directory path, made if missing; returns the counts
        of files, dirs and bytes."""
        r = yield Call("PUT", self._p("/files/tar"), params=query(path=path, user=user), content=_body(self._t, tar), headers={"Content-Type": "application/x-tar"})
        return r.json()


class Ports(_VMPart):
    """A VM's exposed ports: HTTP preview URLs, or host TCP ports."""

    @op
    def expose(self, port: int, *, public: bool = False, tcp: bool = False, host_port: int | None = None, host_addr: str | None = None) -> Op[Port]:
        """Exposes a port: an HTTP preview URL (``url``; ``public`` answers
        without a token), or with ``tcp`` a host TCP port."""
        r = yield Call("POST", self._p("/ports"), json=drop_none(port=port, public=public or None, tcp=tcp or None, host_port=host_port, host_addr=host_addr))
        return parse(Port, r.json())

    @op
    def list(self) -> Op[list[Port]]:
        r = yield Call("GET", self._p("/ports"))
        return parse_list(Port, r.json(), "ports")

    @op
    def unexpose(self, port: int, kind: str = "http") -> Op[None]:
        """Removes an exposure of kind http (default) or tcp."""
        yield Call("DELETE", self._p(f"/ports/{int(port)}"), params=query(kind=kind))


class Domains:
    """Custom host names mapped to VM ports through the preview proxy."""

    def __init__(self, t: Any) -> None:
        self._t = t

    @op
    def add(self, domain: str, vm: str, port: int, **extra: Any) -> Op[Domain]:
        r = yield Call("POST", "/v1/domains", json={"domain": domain, "vm": vm, "port": port, **extra})
        return parse(Domain, r.json())

    @op
    def list(self) -> Op[list[Domain]]:
        r = yield Call("GET", "/v1/domains")
        return parse_list(Domain, r.json(), "domains")

    @op
    def delete(self, domain: str) -> Op[None]:
        yield Call("DELETE", "/v1/domains/" + seg(domain))


class Services(_VMPart):
    """A VM's services (systemd units agentvm-NAME.service)."""

    def _sp(self, name: str | None = None, rest: str = "") -> str:
        return self._p("/services" + ("" if name is None else "/" + seg(name) + rest))

    @op
    def create(self, name: str, command: Command | None = None, *, env: dict[str, str] | None = None, cwd: str | None = None, user: str | None = None, restart: str | None = None, type: str | None = None, no_boot: bool = False, no_start: bool = False) -> Op[ServiceInfo]:
        """Creates a service (a string command runs in a shell, a list is an
        argv); by default it is enabled and started."""
        body = drop_none(name=name, env=env, cwd=cwd, user=user, restart=restart, type=type, no_boot=no_boot or None, no_start=no_start or None)
        if isinstance(command, str):
            body["shell"] = command
        elif command is not None:
            body["argv"] = list(command)
        r = yield Call("POST", self._sp(), json=body)
        return parse(ServiceInfo, r.json())

    @op
    def list(self) -> Op[list[ServiceInfo]]:
        r = yield Call("GET", self._sp())
        return parse_list(ServiceInfo, r.json(), "services")

    @op
    def get(self, name: str) -> Op[ServiceInfo]:
        r = yield Call("GET", self._sp(name))
        return parse(ServiceInfo, r.json())

    @op
    def start(self, name: str) -> Op[ServiceInfo]:
        r = yield Call("POST", self._sp(name, "/start"))
        return parse(ServiceInfo, r.json())

    @op
    def stop(self, name: str) -> Op[ServiceInfo]:
        r = yield Call("POST", self._sp(name, "/stop"))
        return parse(ServiceInfo, r.json())

    @op
    def restart(self, name: str) -> Op[ServiceInfo]:
        r = yield Call("POST", self._sp(name, "/restart"))
        return parse(ServiceInfo, r.json())

    @op
    def delete(self, name: str) -> Op[None]:
        """Stops, disables and removes a service."""
        yield Call("DELETE", self._sp(name))

    @op
    def logs(self, name: str, *, lines: int | None = None) -> Op[str]:
        """The last lines of the service's journal."""
        r = yield Call("GET", self._sp(name, "/logs"), params=query(lines=lines))
        return r.text

    @op
    def follow(self, name: str, *, lines: int | None = None) -> Op[LineStream[str]]:
        """The journal's last lines, then new ones as they are written."""
        r = yield Call("GET", self._sp(name, "/logs"), params=query(lines=lines, follow=True), stream=True)
        return LineStream(r, lambda s: s)


class Processes(_VMPart):
    """The processes of a VM."""

    @op
    def list(self) -> Op[list[dict[str, Any]]]:
        """pid, ppid, user, state, command, cpu_percent, rss_bytes, started_at."""
        r = yield Call("GET", self._p("/processes"))
        return r.json().get("processes") or []

    @op
    def signal(self, pid: int, sig: int | str = "TERM") -> Op[None]:
        """Signals a process (pid 1 and the agent are refused)."""
        yield Call("POST", self._p(f"/processes/{int(pid)}/signal"), json={"signal": str(sig)})


class Jobs(_VMPart):
    """Detached execs: they outlive the client; their output stays in the VM."""

    def _jp(self, job: str | None = None, rest: str = "") -> str:
        return self._p("/jobs" + ("" if job is None else "/" + seg(job) + rest))

    @op
    def start(self, cmd: Command, *, env: dict[str, str] | None = None, cwd: str | None = None, user: str | None = None, timeout: float | str | None = None) -> Op[JobInfo]:
        r = yield Call("POST", self._jp(), json=exec_request(cmd, env=env, cwd=cwd, user=user, timeout=timeout))
        return parse(JobInfo, r.json())

    @op
    def list(self) -> Op[list[JobInfo]]:
        r = yield Call("GET", self._jp())
        return parse_list(JobInfo, r.json(), "jobs")

    @op
    def get(self, job: str) -> Op[JobInfo]:
        r = yield Call("GET", self._jp(job))
        return parse(JobInfo, r.json())

    @op
    def logs(self, job: str, *, stream: str | None = None, offset: int | None = None, follow: bool = False) -> Op[str]:
        """A job's output (stdout, stderr or both) as text; with follow,
        once the job exited."""
        r = yield Call("GET", self._jp(job, "/logs"), params=query(stream=stream, offset=offset or None, follow=follow))
        return r.text

    @op
    def stream(self, job: str, *, stream: str | None = None, offset: int | None = None, follow: bool = False) -> Op[ByteStream]:
        r = yield Call("GET", self._jp(job, "/logs"), params=query(stream=stream, offset=offset or None, follow=follow), stream=True)
        return ByteStream(r)

    @op
    def wait(self, job: str, *, timeout_ms: int | None = None) -> Op[JobInfo]:
        """Waits until the job exits (or timeout_ms passes: then it is
        returned still running)."""
        r = yield Call("POST", self._jp(job, "/wait"), params=query(timeout_ms=timeout_ms))
        return parse(JobInfo, r.json())

    @op
    def signal(self, job: str, sig: int | str = "TERM") -> Op[None]:
        yield Call("POST", self._jp(job, "/signal"), json={"signal": str(sig)})

    @op
    def delete(self, job: str) -> Op[None]:
        """Kills the job if it runs and removes it with its output."""
        yield Call("DELETE", self._jp(job))


class Events(_VMPart):
    """A VM's event log (also of a VM that is gone, by its id)."""

    @op
    def list(self, *, after: int | None = None, limit: int | None = None) -> Op[list[Event]]:
        r = yield Call("GET", self._p("/events"), params=query(after=after, limit=limit))
        return parse_list(Event, r.json(), "events")

    @op
    def follow(self, *, after: int = 0) -> Op[LineStream[Event]]:
        """The events after ``after``, then each new one as it happens."""
        r = yield Call("GET", self._p("/events"), params=query(follow=True, after=after), stream=True)
        return LineStream(r, json_lines(Event))


class Recordings(_VMPart):
    """The VM's terminal sessions (asciicast v2) and execs (JSON lines) as
    the daemon recorded them (admin only)."""

    @op
    def list(self) -> Op[list[Recording]]:
        """The recordings, oldest first."""
        r = yield Call("GET", self._p("/recordings"))
        return parse_list(Recording, r.json(), "recordings")

    @op
    def enabled(self) -> Op[bool]:
        """Whether the VM's terminals and execs are recorded."""
        r = yield Call("GET", self._p("/recordings"))
        return bool(r.json().get("enabled"))

    @op
    def get(self, id: str) -> Op[str]:
        """One recording: a terminal's asciicast v2 text, or an exec's JSON line."""
        r = yield Call("GET", self._p("/recordings/" + seg(id)))
        return r.text

    @op
    def export(self) -> Op[bytes]:
        """Every recording and the VM's events as a .tar.gz."""
        r = yield Call("GET", self._p("/recordings/export"))
        return r.content

    @op
    def set_enabled(self, enabled: bool) -> Op[None]:
        """Turns the recording on or off (kept recordings stay)."""
        yield Call("POST", self._p("/recordings/settings"), json={"enabled": enabled})


@dataclass
class Execution:
    """What a code run produced."""

    stdout: str = ""
    stderr: str = ""
    #: every result event; ``main`` marks the value of the last expression
    results: list[CodeEvent] = field(default_factory=list)
    #: the error event when the code raised
    error: CodeEvent | None = None
    execution_count: int = 0
    #: the main result's text/plain representation
    text: str | None = None

    def add(self, e: CodeEvent) -> bool:
        """Takes one event; True once the run ended."""
        if e.type == "stdout":
            self.stdout += e.text or ""
        elif e.type == "stderr":
            self.stderr += e.text or ""
        elif e.type == "result":
            self.results.append(e)
            plain = (e.data or {}).get("text/plain")
            if e.main and isinstance(plain, str):
                self.text = plain
        elif e.type == "error":
            self.error = e
        elif e.type == "count":
            self.execution_count = e.execution_count or 0
        elif e.type == "end":
            if e.error:
                raise Unavailable(0, "unavailable", "run code: " + e.error)
            return True
        return False


def _unfinished() -> AgentVMError:
    return Unavailable(0, "unavailable", "run code: the stream ended before the run did")


class Code(_VMPart):
    """Live kernels (contexts) of a code-interpreter VM."""

    @op
    def stream(self, code: str, *, language: str | None = None, context: str | None = None, env: dict[str, str] | None = None, timeout: str | None = None) -> Op[LineStream[CodeEvent]]:
        """Runs code; its events (stdout, stderr, result, error, count, end) as produced."""
        body = drop_none(code=code, language=language, context=context, env=env, timeout=timeout)
        r = yield Call("POST", self._p("/code"), json=body, stream=True)
        return LineStream(r, json_lines(CodeEvent))

    def run(self, code: str, **kw: Any) -> Any:
        """Runs code and collects its events into an Execution. An exception
        in the code is ``error`` in the answer; a run that ends abnormally
        raises."""
        if self._t.is_async:

            async def collect() -> Execution:
                ex = Execution()
                async for e in await self.stream(code, **kw):
                    if ex.add(e):
                        return ex
                raise _unfinished()

            return collect()
        ex = Execution()
        for e in self.stream(code, **kw):
            if ex.add(e):
                return ex
        raise _unfinished()

    @op
    def contexts(self) -> Op[list[CodeContext]]:
        r = yield Call("GET", self._p("/code/contexts"))
        return parse_list(CodeContext, r.json(), "contexts")

    @op
    def create_context(self, *, language: str | None = None, cwd: str | None = None) -> Op[CodeContext]:
        r = yield Call("POST", self._p("/code/contexts"), json=drop_none(language=language, cwd=cwd))
        return parse(CodeContext, r.json())

    @op
    def restart_context(self, ctx: str) -> Op[None]:
        """Restarts a context's kernel: its state is lost, its id kept."""
        yield Call("POST", self._p("/code/contexts/" + seg(ctx) + "/restart"))

    @op
    def delete_context(self, ctx: str) -> Op[None]:
        yield Call("DELETE", self._p("/code/contexts/" + seg(ctx)))

