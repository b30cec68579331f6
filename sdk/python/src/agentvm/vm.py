"""The VM handle: one VM's lifecycle, exec, and its sub-resources."""

from __future__ import annotations

from collections.abc import AsyncIterable, Iterable
from dataclasses import dataclass
from typing import Any

import anyio

from ._streams import LineStream, json_lines, parse
from ._transport import Call, Op, drop_none, op, query, seg
from .exec import AsyncConnection, AsyncProcess, Command, Connection, Feeder, Process, RunResult, exec_request
from .models import VM as VMInfo
from .errors import StreamLost
from .models import DiffResponse, ExecEvent, ExecResult, Snapshot
from .resources import Code, Events, Files, Jobs, Ports, Processes, Recordings, Services
from .terminals import Terminals



@dataclass
class ForkResult:
    """The parent and the new VMs of a fork, as handles."""

    parent: VM
    children: list[VM]
    raw: dict[str, Any]


class VM:
    """A VM. The handle keeps the VM's id (or the name it was opened by) and
    the last state the API returned in ``info``; lifecycle calls refresh it.
    On the async client every call returns a coroutine."""

    def __init__(self, t: Any, ref: str | VMInfo) -> None:
        self._t = t
        if isinstance(ref, str):
            self.id = ref
            self.info: VMInfo | None = None
        else:
            self.id = ref.id
            self.info = ref
        self.files = Files(t, self.id)
        self.terminals = Terminals(t, self.id)
        self.ports = Ports(t, self.id)
        self.services = Services(t, self.id)
        self.processes = Processes(t, self.id)
        self.jobs = Jobs(t, self.id)
        self.events = Events(t, self.id)
        #: live kernels of a code-interpreter VM (image="code-interpreter")
        self.code = Code(t, self.id)
        #: its terminal sessions and execs as the daemon recorded them (admin only)
        self.recordings = Recordings(t, self.id)

    def __repr__(self) -> str:
        return f"VM(id={self.id!r}, name={self.name!r}, state={self.state!r})"

    @property
    def name(self) -> str:
        return self.info.name if self.info and self.info.name else self.id

    @property
    def state(self) -> str | None:
        """The state as last returned by the API."""
        if self.info is None:
            return None
        s = self.info.state
        return getattr(s, "root", s)

    def _p(self, rest: str = "") -> str:
        return f"/v1/vms/{seg(self.id)}{rest}"

    def _update(self, r: Any) -> VMInfo:
        self.info = parse(VMInfo, r.json())
        return self.info

    @op
    def refresh(self) -> Op[VMInfo]:
        """Fetches the VM."""
        return self._update((yield Call("GET", self._p())))

    @op
    def wake(self) -> Op[VMInfo]:
        """Fetches the VM after resuming it if paused or waking it if suspended."""
        return self._update((yield Call("GET", self._p(), params={"wake": "1"})))

    @op
    def delete(self) -> Op[None]:
        """Deletes the VM (its snapshots are kept)."""
        yield Call("DELETE", self._p())

    @op
    def start(self) -> Op[VMInfo]:
        """Boots a stopped or crashed VM from its disk."""
        return self._update((yield Call("POST", self._p("/start"))))

    @op
    def stop(self) -> Op[VMInfo]:
        """Shuts the VM down, keeping its disk."""
        return self._update((yield Call("POST", self._p("/stop"))))

    @op
    def pause(self) -> Op[VMInfo]:
        """Freezes the vCPUs (memory stays in RAM)."""
        return self._update((yield Call("POST", self._p("/pause"))))

    @op
    def resume(self) -> Op[VMInfo]:
        """Continues a paused VM."""
        return self._update((yield Call("POST", self._p("/resume"))))

    @op
    def suspend(self) -> Op[VMInfo]:
        """Saves memory and devices to disk and frees the RAM; any request wakes it."""
        return self._update((yield Call("POST", self._p("/suspend"))))

    @op
    def resize(self, *, cpus: int | None = None, memory: int | str | None = None, disk: int | str | None = None) -> Op[VMInfo]:
        """Grows the disk online, hot-adds vCPUs, or sets sizes for the next start."""
        return self._update((yield Call("POST", self._p("/resize"), json=drop_none(cpus=cpus, memory=memory, disk=disk))))

    @op
    def set_policy(self, *, idle_timeout: str | None = None, delete_after: str | None = None, restart: str | None = None) -> Op[VMInfo]:
        """Sets the idle timeout ("0" turns it off), delete-after and restart policy."""
        return self._update((yield Call("POST", self._p("/policy"), json=drop_none(idle_timeout=idle_timeout, delete_after=delete_after, restart=restart))))

    @op
    def snapshot(self, name: str | None = None) -> Op[Snapshot]:
        """Captures memory, processes and disk while the VM keeps running."""
        r = yield Call("POST", self._p("/snapshot"), json=drop_none(name=name))
        return parse(Snapshot, r.json())

    @op
    def diff(self, *, since: str | None = None, diffs: bool = False, ignore: list[str] | None = None, default_ignores: bool = True, max_entries: int | None = None) -> Op[DiffResponse]:
        """What changed on the VM's disk since its creation (or ``since`` a
        snapshot): paths added, changed and removed, read from its disk
        layers; ``diffs`` adds unified diffs of text files."""
        params = query(since=since, diffs=diffs, ignore=ignore, max_entries=max_entries)
        if not default_ignores:
            params["default_ignores"] = "false"
        r = yield Call("GET", self._p("/diff"), params=params)
        return parse(DiffResponse, r.json())

    @op
    def fork(self, count: int = 1) -> Op[ForkResult]:
        """Copies the running VM into count new running VMs; the parent keeps running."""
        r = yield Call("POST", self._p("/fork"), json={"count": count})
        body = r.json()
        self.info = parse(VMInfo, body["parent"])
        children = [VM(self._t, parse(VMInfo, c)) for c in body.get("children") or []]
        return ForkResult(self, children, body)

    @op
    def logs(self) -> Op[str]:
        """The VM's log (serial console and QEMU output; the last 4 MiB)."""
        r = yield Call("GET", self._p("/logs"))
        return r.text

    @op
    def metrics(self) -> Op[dict[str, Any]]:
        """The VM's resource use (host and guest samples)."""
        r = yield Call("GET", self._p("/metrics"))
        return r.json()

    @op
    def screenshot(self, *, scale: float | None = None) -> Op[bytes]:
        """A PNG of a browser VM's display (image="browser"); scale in (0, 1]."""
        r = yield Call("GET", self._p("/screenshot"), params=query(scale=scale))
        return r.content

    @op
    def set_network(self, network: str | None) -> Op[VMInfo]:
        """Puts the VM on a private network; None takes it off."""
        return self._update((yield Call("POST", self._p("/network"), json={"network": network or ""})))

    @op
    def set_egress(self, egress: dict[str, Any] | None) -> Op[VMInfo]:
        """Sets the VM's own egress policy ({"mode": "deny", "allow": [...]});
        None drops it (its network's applies, else public)."""
        if egress is None:
            return self._update((yield Call("DELETE", self._p("/egress"))))
        return self._update((yield Call("POST", self._p("/egress"), json=egress)))

    @op
    def exec(self, cmd: Command | dict[str, Any], *, env: dict[str, str] | None = None, cwd: str | None = None, user: str | None = None, timeout: float | str | None = None, stdin: str | None = None) -> Op[ExecResult]:
        """Runs a command and returns its buffered output once it exits (each
        of stdout and stderr up to 16 MiB). A string is a shell command
        line, a list an argv; stdin is written to it and closed."""
        r = yield Call("POST", self._p("/exec"), json=exec_request(cmd, env=env, cwd=cwd, user=user, timeout=timeout, stdin=stdin))
        return parse(ExecResult, r.json())

    @op
    def exec_stream(self, cmd: Command | dict[str, Any], *, env: dict[str, str] | None = None, cwd: str | None = None, user: str | None = None, timeout: float | str | None = None, stdin: str | None = None) -> Op[LineStream[ExecEvent]]:
        """Runs a command; its events (stdout, stderr, exit, error) as produced."""
        req = exec_request(cmd, env=env, cwd=cwd, user=user, timeout=timeout, stdin=stdin)
        r = yield Call("POST", self._p("/exec"), json=req, headers={"Accept": "application/x-ndjson"}, stream=True)
        return LineStream(r, json_lines(ExecEvent))

    @op
    def spawn(self, cmd: Command | dict[str, Any], *, env: dict[str, str] | None = None, cwd: str | None = None, user: str | None = None, timeout: float | str | None = None) -> Op[Any]:
        """Starts a command with streaming stdin, stdout and stderr: a
        Process (sync) or an AsyncProcess (async)."""
        req = exec_request(cmd, env=env, cwd=cwd, user=user, timeout=timeout)
        r = yield Call("POST", self._p("/exec"), json=req, upgrade="agentvm-exec")
        return AsyncProcess(r) if self._t.is_async else Process(r)

    def run(self, cmd: Command | dict[str, Any], *, stdin: str | bytes | Iterable[str | bytes] | AsyncIterable[str | bytes] = b"", **kw: Any) -> Any:
        """Runs a command over the streaming path, feeding it stdin (bytes,
        str or an iterable of them, written while the output is read) and
        collecting its output into a RunResult. A stdin source that fails
        ends the command, and its error is raised."""
        feeder = Feeder()
        if self._t.is_async:

            async def go() -> RunResult:
                p = await self.spawn(cmd, **kw)
                failed: BaseException | None = None
                async with p:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(feeder.arun, p, stdin)
                        try:
                            res = await p.wait()
                        except Exception as err:  # raised below, not as a group
                            failed = err
                        tg.cancel_scope.cancel()  # input the command never read
                if failed is not None:
                    # a source that failed ended the command: its error says why
                    raise feeder.error or failed
                return res

            return go()
        p = self.spawn(cmd, **kw)
        with p:
            t = feeder.run(p, stdin)
            try:
                return p.wait()
            except StreamLost:
                t.join(5)
                if feeder.error is not None:
                    raise feeder.error from None
                raise

    @op
    def connect(self, port: int) -> Op[Any]:
        """A raw TCP stream to a port inside the VM through the server (no
        port is opened on the host): a Connection (sync) or an
        AsyncConnection (async)."""
        r = yield Call("GET", self._p(f"/tcp/{int(port)}"), upgrade="agentvm-tcp")
        return AsyncConnection(r) if self._t.is_async else Connection(r)
