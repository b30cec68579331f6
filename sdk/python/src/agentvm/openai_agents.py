"""agentvm as a sandbox for the OpenAI Agents SDK (``openai-agents`` 0.24).

A ``SandboxAgent``'s shell and file tools run in an agentvm VM::

    from agents import RunConfig, Runner
    from agents.sandbox import SandboxAgent, SandboxRunConfig
    from agentvm.openai_agents import AgentVMSandboxClient, AgentVMSandboxClientOptions

    client = AgentVMSandboxClient()  # AGENTVM_URL / AGENTVM_TOKEN, as the SDK
    result = await Runner.run(agent, "task", run_config=RunConfig(sandbox=SandboxRunConfig(
        client=client, options=AgentVMSandboxClientOptions(pause_on_exit=True))))

Moving from another provider changes only ``client=`` and ``options=``.
What agentvm adds: a session paused on exit is a suspended VM (memory,
processes and disk kept, no RAM held) that a later run resumes as it was;
``client.fork(session, n)`` copies a running session into n sessions that
continue from the same state; ``client.snapshot(session)`` saves one that
``options.from_snapshot`` starts from.

Install with ``pip install 'agentvm-sdk[agents]'``.
"""

from __future__ import annotations

import asyncio
import io
import shlex
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from agents.sandbox.errors import (
    ExecTimeoutError,
    ExecTransportError,
    ExposedPortUnavailableError,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
)
from agents.sandbox.manifest import Manifest
from agents.sandbox.session import SandboxSession, SandboxSessionState
from agents.sandbox.session.base_sandbox_session import BaseSandboxSession
from agents.sandbox.session.pty_output import collect_pty_output
from agents.sandbox.session.pty_types import (
    PTY_PROCESSES_MAX,
    PtyExecUpdate,
    allocate_pty_process_id,
    clamp_pty_yield_time_ms,
    process_id_to_prune_from_meta,
    resolve_pty_write_yield_time_ms,
)
from agents.sandbox.session.sandbox_client import BaseSandboxClient, BaseSandboxClientOptions
from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot
from agents.sandbox.types import ExecResult, ExposedPortEndpoint, User

from . import AsyncAgentVM, AsyncProcess, AsyncTerminal
from .errors import AgentVMError, NotFound
from .vm import VM

__all__ = ["AgentVMSandboxClient", "AgentVMSandboxClientOptions", "AgentVMSandboxSession", "AgentVMSandboxSessionState"]


class AgentVMSandboxClientOptions(BaseSandboxClientOptions):
    """How a session's VM is made."""

    type: Literal["agentvm"] = "agentvm"
    #: agentvm image ("default", "code-interpreter", "browser")
    image: str | None = None
    #: start from this agentvm snapshot (id or name) instead of an image
    from_snapshot: str | None = None
    name: str | None = None
    cpus: int | None = None
    #: MiB, or a size such as "2G"
    memory: int | str | None = None
    disk: int | str | None = None
    env: dict[str, str] | None = None
    labels: dict[str, str] | None = None
    #: suspend the VM when the run ends (a later run resumes it with its
    #: processes); otherwise the VM is deleted
    pause_on_exit: bool = False
    #: ports the agent may publish; resolved to preview URLs
    exposed_ports: tuple[int, ...] = ()
    #: previews answer without a token; otherwise each endpoint carries a
    #: preview-only token of its VM in its query (needs an admin client)
    public_ports: bool = False
    network: str | None = None
    #: the VM's egress policy, e.g. {"mode": "deny", "allow": ["pypi.org"]}
    egress: dict[str, Any] | None = None
    #: agentvm idle timeout ("15m"): an idle VM suspends itself
    idle_timeout: str | None = None


class AgentVMSandboxSessionState(SandboxSessionState):
    """What a later run needs to find the session's VM again (serialized)."""

    type: Literal["agentvm"] = "agentvm"
    vm_id: str
    options: AgentVMSandboxClientOptions = AgentVMSandboxClientOptions()


@dataclass
class _Pty:
    """A process started by exec_command that outlives the tool call."""

    proc: AsyncProcess | None = None
    term: AsyncTerminal | None = None
    term_name: str | None = None
    chunks: deque[bytes] = field(default_factory=deque)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    notify: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    exit_code: int | None = None
    reader: asyncio.Task[None] | None = None
    last_used: float = field(default_factory=time.monotonic)


# The preview token of a session's private ports lives an hour and is
# renewed when less than ten minutes of it are left.
PREVIEW_TTL, PREVIEW_TTL_S, PREVIEW_RENEW_S = "1h", 3600.0, 600.0


def _split_user(argv: list[str]) -> tuple[list[str], str | None]:
    """The base session prefixes `sudo -u USER --` for a user; agentvm runs
    a command as a user itself, so the prefix becomes the request's user."""
    if len(argv) >= 4 and argv[0] == "sudo" and argv[1] == "-u" and argv[3] == "--":
        return argv[4:], argv[2]
    return argv, None


def _timeout_arg(timeout: float | None) -> str | None:
    if timeout is None:
        return None
    return f"{max(timeout, 0.001):.3f}s"


class AgentVMSandboxSession(BaseSandboxSession):
    """A sandbox session on one agentvm VM."""

    state: AgentVMSandboxSessionState

    def __init__(self, *, state: AgentVMSandboxSessionState, av: AsyncAgentVM) -> None:
        self.state = state
        self._av = av
        self._ptys: dict[int, _Pty] = {}
        self._pty_lock = asyncio.Lock()
        # The preview token of this session's private ports: kept here, not
        # in the state (which applications store), short-lived, renewed
        # when it runs low; every token minted is revoked at shutdown.
        self._preview: tuple[str, float] | None = None  # (secret, expiry)
        self._preview_ids: list[str] = []
        self._preview_lock = asyncio.Lock()
        self._shut = False

    @property
    def vm(self) -> VM:
        """The agentvm VM under this session (async handle)."""
        return self._av.vm(self.state.vm_id)

    # --- lifecycle ---------------------------------------------------------

    async def _ensure_backend_started(self) -> None:
        # A suspended or paused VM is woken (as any request would).
        await self.vm.wake()

    async def _shutdown_backend(self) -> None:
        await self.pty_terminate_all()
        await self._revoke_preview()
        try:
            if self.state.options.pause_on_exit:
                await self.vm.suspend()
            else:
                await self.vm.delete()
        except NotFound:
            pass

    async def running(self) -> bool:
        try:
            info = await self.vm.refresh()
        except AgentVMError:
            return False
        return getattr(info.state, "root", info.state) == "running"

    # --- exec --------------------------------------------------------------

    async def _env(self) -> dict[str, str]:
        return {**(self.state.options.env or {}), **await self.state.manifest.environment.resolve()}

    def _cwd(self) -> str | None:
        return self.state.manifest.root if self.state.workspace_root_ready else None

    async def _exec_internal(self, *command: str | Path, timeout: float | None = None) -> ExecResult:
        argv, user = _split_user([str(c) for c in command])
        try:
            # The streaming path: the output as bytes, whole (a buffered
            # exec's is text, and bounded).
            r = await self.vm.run(argv, env=await self._env(), cwd=self._cwd(), user=user, timeout=_timeout_arg(timeout))
        except AgentVMError as err:
            raise ExecTransportError(command=argv, cause=err) from err
        if r.timed_out:
            raise ExecTimeoutError(command=argv, timeout_s=timeout)
        return ExecResult(stdout=r.stdout, stderr=r.stderr, exit_code=r.exit_code)

    def supports_pty(self) -> bool:
        return True

    async def pty_exec_start(
        self,
        *command: str | Path,
        timeout: float | None = None,
        shell: bool | list[str] = True,
        user: str | User | None = None,
        tty: bool = False,
        yield_time_s: float | None = None,
        max_output_tokens: int | None = None,
    ) -> PtyExecUpdate:
        argv, run_as = _split_user(self._prepare_exec_command(*command, shell=shell, user=user))
        entry = _Pty()
        try:
            if tty:
                # A terminal of the VM: a real PTY, listed by `agentvm term ls`.
                name = f"agent-{uuid.uuid4().hex[:10]}"
                line = shlex.join(argv)
                if timeout is not None:
                    line = f"exec timeout -k 5 {max(timeout, 0.001):.3f}s {line}"
                if (cwd := self._cwd()) is not None:
                    line = f"cd {shlex.quote(cwd)} && {line}"
                await self.vm.terminals.create(name, argv=["sh", "-c", line], env=await self._env() or None, user=run_as, cols=80, rows=24)
                entry.term_name = name
                try:
                    entry.term = await self.vm.terminals.attach(name)
                except AgentVMError:
                    await self._end(entry)
                    raise
            else:
                entry.proc = await self.vm.spawn(argv, env=await self._env(), cwd=self._cwd(), user=run_as, timeout=_timeout_arg(timeout))
        except AgentVMError as err:
            raise ExecTransportError(command=argv, cause=err) from err
        entry.reader = asyncio.create_task(self._pump(entry))
        async with self._pty_lock:
            pruned = self._prune() if len(self._ptys) >= PTY_PROCESSES_MAX else None
            pid = allocate_pty_process_id(set(self._ptys))
            self._ptys[pid] = entry
        if pruned is not None:
            await self._end(pruned)
        ms = 10_000 if yield_time_s is None else int(yield_time_s * 1000)
        return await self._update(pid, entry, clamp_pty_yield_time_ms(ms), max_output_tokens)

    async def pty_write_stdin(self, *, session_id: int, chars: str, yield_time_s: float | None = None, max_output_tokens: int | None = None) -> PtyExecUpdate:
        async with self._pty_lock:
            entry = self._resolve_pty_session_entry(pty_processes=self._ptys, session_id=session_id)
            entry.last_used = time.monotonic()
        if chars:
            data = chars.encode()
            try:
                if entry.term is not None:
                    await entry.term.write(data)
                elif entry.proc is not None:
                    await entry.proc.write(data)
            except AgentVMError as err:  # StreamLost included: the process is gone
                raise ExecTransportError(command=["write_stdin"], cause=err) from err
        ms = 250 if yield_time_s is None else int(yield_time_s * 1000)
        return await self._update(session_id, entry, resolve_pty_write_yield_time_ms(yield_time_ms=ms, input_empty=chars == ""), max_output_tokens)

    async def pty_terminate_all(self) -> None:
        async with self._pty_lock:
            entries = list(self._ptys.values())
            self._ptys.clear()
        for e in entries:
            await self._end(e)

    async def _pump(self, e: _Pty) -> None:
        """Moves a process's output into its chunks until it exits."""
        try:
            if e.proc is not None:
                async for _kind, data in e.proc:
                    async with e.lock:
                        e.chunks.append(data)
                    e.notify.set()
                st = e.proc.exit_status
                e.exit_code = st.exit_code if st else None
            elif e.term is not None:
                async for data in e.term:
                    async with e.lock:
                        e.chunks.append(data)
                    e.notify.set()
                e.exit_code = int(e.term.exit["exit_code"]) if e.term.exit else -1
        except AgentVMError:
            e.exit_code = -1 if e.exit_code is None else e.exit_code
        finally:
            if e.exit_code is None:
                e.exit_code = -1
            e.done.set()
            e.notify.set()

    async def _update(self, pid: int, e: _Pty, yield_ms: int, max_tokens: int | None) -> PtyExecUpdate:
        out, tokens, closed = await collect_pty_output(
            output_chunks=e.chunks,
            output_lock=e.lock,
            output_notify=e.notify,
            is_done=e.done.is_set,
            yield_time_ms=yield_ms,
            max_output_tokens=max_tokens,
        )
        live: int | None = pid
        code = e.exit_code if closed else None
        if closed:
            async with self._pty_lock:
                self._ptys.pop(pid, None)
            await self._end(e)
            live = None
        return PtyExecUpdate(process_id=live, output=out, exit_code=code, original_token_count=tokens)

    def _prune(self) -> _Pty | None:
        """The session to end for room, chosen as the SDK's own providers
        do: a finished one, else the least recently used that is not among
        the newest few."""
        meta = [(pid, e.last_used, e.done.is_set()) for pid, e in self._ptys.items()]
        pid = process_id_to_prune_from_meta(meta)
        return self._ptys.pop(pid) if pid is not None else None

    async def _end(self, e: _Pty) -> None:
        """Ends a session's process and everything of it, whatever fails."""
        try:
            if e.proc is not None:
                await e.proc.kill()
            if e.term is not None:
                await e.term.close()
        finally:
            if e.reader is not None and not e.reader.done():
                e.reader.cancel()
                await asyncio.gather(e.reader, return_exceptions=True)
            if e.term_name is not None:
                try:
                    await self.vm.terminals.kill(e.term_name)
                except AgentVMError:
                    pass

    # --- files -------------------------------------------------------------

    async def read(self, path: Path, *, user: str | User | None = None) -> io.IOBase:
        p = self.normalize_path(path)
        try:
            return io.BytesIO(await self.vm.files.read(str(p), user=_user_name(user)))
        except NotFound as err:
            raise WorkspaceReadNotFoundError(path=path, cause=err) from err
        except AgentVMError as err:
            raise WorkspaceArchiveReadError(path=path, cause=err) from err

    async def write(self, path: Path, data: io.IOBase, *, user: str | User | None = None) -> None:
        p = self.normalize_path(path, for_write=True)
        payload = data.read()
        if isinstance(payload, str):
            payload = payload.encode()
        try:
            await self.vm.files.write(str(p), payload, user=_user_name(user), mkdirs=True)
        except AgentVMError as err:
            raise WorkspaceArchiveWriteError(path=p, cause=err) from err

    async def persist_workspace(self) -> io.IOBase:
        """A tar of the workspace, names relative to its root, without the
        manifest's ephemeral paths."""
        root = self.state.manifest.root
        argv = ["tar", "-C", root, "-cf", "-"]
        for rel in sorted(p.as_posix() for p in self._persist_workspace_skip_relpaths()):
            argv.append(f"--exclude=./{rel}")
        argv.append(".")
        try:
            r = await self.vm.run(argv)
        except AgentVMError as err:
            raise WorkspaceArchiveReadError(path=Path(root), cause=err) from err
        if r.exit_code != 0:
            raise WorkspaceArchiveReadError(path=Path(root), context={"stderr": r.stderr.decode(errors="replace")[-2000:]})
        return io.BytesIO(r.stdout)

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        root = self.state.manifest.root
        payload = data.read()
        if isinstance(payload, str):
            payload = payload.encode()
        try:
            await self.vm.files.write_tar(root, payload)
        except AgentVMError as err:
            raise WorkspaceArchiveWriteError(path=Path(root), cause=err) from err

    # --- ports -------------------------------------------------------------

    async def _resolve_exposed_port(self, port: int) -> ExposedPortEndpoint:
        opts = self.state.options

        def unavailable(why: str) -> ExposedPortUnavailableError:
            return ExposedPortUnavailableError(port=port, exposed_ports=self.state.exposed_ports, reason="backend_unavailable", context={"error": why})

        try:
            p = await self.vm.ports.expose(port, public=opts.public_ports)
        except AgentVMError as err:
            raise unavailable(str(err)) from err
        u = urlsplit(p.url or "")
        if not u.hostname:
            raise unavailable("no preview URL")
        tls = u.scheme == "https"
        q = ""
        if not opts.public_ports:
            try:
                q = "agentvm_token=" + await self._preview_token()
            except AgentVMError as err:
                raise unavailable(f"a private preview's endpoint carries a preview token, and minting one failed ({err}); use an admin client or public_ports=True") from err
        return ExposedPortEndpoint(host=u.hostname, port=u.port or (443 if tls else 80), tls=tls, query=q)

    async def _preview_token(self) -> str:
        """This session's preview-only token of its VM, minted on first use
        and renewed when less than PREVIEW_RENEW_S of it are left (the old
        one stays valid to its end, for the endpoints that carry it)."""
        async with self._preview_lock:
            if self._shut:
                raise ExposedPortUnavailableError(port=0, exposed_ports=self.state.exposed_ports, reason="backend_unavailable", context={"error": "the session is shut down"})
            if self._preview is None or self._preview[1] - time.monotonic() < PREVIEW_RENEW_S:
                tok = await self._av.tokens.create(vm=self.state.vm_id, allow=["preview"], ttl=PREVIEW_TTL, name="openai-agents-preview")
                self._preview_ids.append(tok.id)
                self._preview = (tok.token or "", time.monotonic() + PREVIEW_TTL_S)
            return self._preview[0]

    async def _revoke_preview(self) -> None:
        async with self._preview_lock:
            self._shut = True
            ids, self._preview_ids, self._preview = self._preview_ids, [], None
        for token_id in ids:
            try:
                await self._av.tokens.revoke(token_id)
            except AgentVMError:
                pass  # gone already, or the VM with it


def _user_name(user: str | User | None) -> str | None:
    if isinstance(user, User):
        return user.name
    return user


class AgentVMSandboxClient(BaseSandboxClient[AgentVMSandboxClientOptions]):
    """Makes sessions on agentvm VMs. Without a client it makes an
    AsyncAgentVM from AGENTVM_URL and AGENTVM_TOKEN (or url= and token=)."""

    backend_id = "agentvm"
    supports_default_options = True

    def __init__(self, client: AsyncAgentVM | None = None, *, url: str | None = None, token: str | None = None) -> None:
        super().__init__()
        self.av = client or AsyncAgentVM(url, token)

    async def _make_vm(self, o: AgentVMSandboxClientOptions) -> VM:
        return await self.av.vms.create(
            o.name, image=o.image, from_snapshot=o.from_snapshot, cpus=o.cpus, memory=o.memory, disk=o.disk,
            env=o.env, labels=o.labels, network=o.network, egress=o.egress, idle_timeout=o.idle_timeout,
        )  # fmt: skip

    async def create(self, *, snapshot: SnapshotSpec | SnapshotBase | None = None, manifest: Manifest | None = None, options: AgentVMSandboxClientOptions | None = None) -> SandboxSession:
        options = options or AgentVMSandboxClientOptions()
        manifest = manifest if manifest is not None else Manifest()
        self._validate_manifest_for_create(manifest)
        vm = await self._make_vm(options)
        sid = uuid.uuid4()
        state = AgentVMSandboxSessionState(
            session_id=sid, manifest=manifest, snapshot=resolve_snapshot(snapshot, str(sid)),
            vm_id=vm.id, options=options, exposed_ports=tuple(options.exposed_ports),
        )  # fmt: skip
        return self._wrap_session(AgentVMSandboxSession(state=state, av=self.av))

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        if not isinstance(state, AgentVMSandboxSessionState):
            raise TypeError(f"AgentVMSandboxClient.resume needs an AgentVMSandboxSessionState, got {type(state).__name__}")
        state.assert_path_grants_rebound()
        try:
            # Waking brings a suspended VM back with its processes.
            await self.av.vm(state.vm_id).wake()
            kept = True
        except NotFound:
            # The VM is gone: a new one, which start() fills from the snapshot
            # (or the manifest).
            vm = await self._make_vm(state.options.model_copy(update={"name": None}))
            state.vm_id = vm.id
            state.workspace_root_ready = False
            kept = False
        inner = AgentVMSandboxSession(state=state, av=self.av)
        inner._set_start_state_preserved(kept, system=kept)
        return self._wrap_session(inner)

    async def delete(self, session: SandboxSession) -> SandboxSession:
        # The VM went with the session's shutdown (deleted, or suspended
        # with pause_on_exit).
        return session

    def deserialize_session_state(self, payload: dict[str, object]) -> SandboxSessionState:
        return self._deserialize_session_state_payload(payload, AgentVMSandboxSessionState)

    # --- agentvm's own ---------------------------------------------------

    async def fork(self, session: SandboxSession, count: int = 1) -> list[SandboxSession]:
        """Copies the session's running VM into count new VMs (memory,
        processes and disk, while it keeps running) and returns a started
        session on each: they continue from the same state and diverge."""
        state = _state_of(session)
        res = await self.av.vm(state.vm_id).fork(count)
        out = []
        for child in res.children:
            sid = uuid.uuid4()
            cs = state.model_copy(deep=True, update={"session_id": sid, "vm_id": child.id, "snapshot": resolve_snapshot(None, str(sid))})
            cs.options = state.options.model_copy(update={"name": None})
            inner = AgentVMSandboxSession(state=cs, av=self.av)
            inner._set_start_state_preserved(True, system=True)
            s = self._wrap_session(inner)
            await s.start()
            out.append(s)
        return out

    async def snapshot(self, session: SandboxSession, name: str | None = None) -> str:
        """Saves the session's VM (memory, processes, disk) as an agentvm
        snapshot while it runs; returns its id, for options.from_snapshot."""
        snap = await self.av.vm(_state_of(session).vm_id).snapshot(name)
        return snap.id


def _state_of(session: SandboxSession) -> AgentVMSandboxSessionState:
    st = getattr(session, "state", None)
    if not isinstance(st, AgentVMSandboxSessionState):
        raise TypeError("not an agentvm sandbox session")
    return st

