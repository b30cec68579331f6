"""The clients: one agentvm server, with its resources (VMs, snapshots,
tokens, networks, domains, nodes) and server-wide calls. ``AgentVM`` is
sync, ``AsyncAgentVM`` async; both are the same code over a different
transport."""

from __future__ import annotations

import base64
import json
from typing import Any

from ._streams import LineStream, json_lines, parse, parse_list
from ._transport import AsyncTransport, Call, Op, SyncTransport, drop_none, op, query, seg
from .models import VM as VMInfo
from .models import BuiltTemplate, Event, Health, HostInfo, NetworkInfo, Node, Repo, RepoHook, Snapshot, SSHInfo, Token
from .resources import Domains, _body
from .vm import VM



class VMs:
    """VMs: create, list, open."""

    def __init__(self, t: Any) -> None:
        self._t = t

    @op
    def create(
        self,
        name: str | None = None,
        *,
        image: str | None = None,
        from_snapshot: str | None = None,
        template: str | None = None,
        cpus: int | None = None,
        memory: int | str | None = None,
        disk: int | str | None = None,
        labels: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
        idle_timeout: str | None = None,
        delete_after: str | None = None,
        restart: str | None = None,
        network: str | None = None,
        egress: dict[str, Any] | None = None,
        anti_affinity: str | None = None,
        idempotency_key: str | None = None,
        repo: str | None = None,
        repo_dir: str | None = None,
        no_record: bool = False,
    ) -> Op[VM]:
        """Creates a VM and returns it once it is running: from an image
        ("default", "code-interpreter", "browser"), from a snapshot
        (``from_snapshot``, its id or name) or from a template built from a
        Dockerfile (``template``: its start command already running). memory and disk are MiB or
        sizes such as "2G". ``repo`` ("NAME" or "NAME@BRANCH") clones a hosted
        repository into ``repo_dir`` (default /home/agent/NAME); ``no_record``
        turns off the recording of its terminals and execs. A retry with the
        same idempotency_key returns the VM the first call created."""
        body = drop_none(
            name=name, image=image, template=template, cpus=cpus, memory=memory, disk=disk, labels=labels, env=env, idle_timeout=idle_timeout,
            delete_after=delete_after, restart=restart, network=network, egress=egress, anti_affinity=anti_affinity,
            repo=repo, repo_dir=repo_dir, no_record=no_record or None,
        )  # fmt: skip
        if from_snapshot is not None:
            body["from"] = from_snapshot
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        r = yield Call("POST", "/v1/vms", json=body, headers=headers)
        return VM(self._t, parse(VMInfo, r.json()))

    @op
    def list(self, *, labels: dict[str, str] | list[str] | None = None) -> Op[list[VM]]:
        """VMs, oldest first; labels filter ("key=value" or "key"; all must match)."""
        sel = labels if isinstance(labels, list) else [k if v == "" else f"{k}={v}" for k, v in (labels or {}).items()]
        r = yield Call("GET", "/v1/vms", params=query(label=sel))
        return [VM(self._t, v) for v in parse_list(VMInfo, r.json(), "vms")]

    @op
    def get(self, ref: str) -> Op[VM]:
        """A VM by id or name."""
        r = yield Call("GET", "/v1/vms/" + seg(ref))
        return VM(self._t, parse(VMInfo, r.json()))

    def open(self, ref: str) -> VM:
        """A handle by id or name, without a request (what a scoped token needs)."""
        return VM(self._t, ref)

    @op
    def delete(self, ref: str) -> Op[None]:
        yield Call("DELETE", "/v1/vms/" + seg(ref))


class Snapshots:
    """Snapshots (taken with ``vm.snapshot()``, restored with ``vms.create(from_snapshot=...)``)."""

    def __init__(self, t: Any) -> None:
        self._t = t

    @op
    def list(self) -> Op[list[Snapshot]]:
        r = yield Call("GET", "/v1/snapshots")
        return parse_list(Snapshot, r.json(), "snapshots")

    @op
    def get(self, ref: str) -> Op[Snapshot]:
        r = yield Call("GET", "/v1/snapshots/" + seg(ref))
        return parse(Snapshot, r.json())

    @op
    def delete(self, ref: str) -> Op[None]:
        yield Call("DELETE", "/v1/snapshots/" + seg(ref))


class Templates:
    """Templates built from a Dockerfile or a spec (admin only); a VM made
    with ``vms.create(template=...)`` starts with the start command running."""

    def __init__(self, t: Any) -> None:
        self._t = t

    @op
    def build(
        self,
        name: str,
        context: Any,
        *,
        dockerfile: str | None = None,
        spec: str | None = None,
        build_args: dict[str, str] | None = None,
        no_cache: bool = False,
        cpus: int | None = None,
        memory: str | None = None,
        disk: str | None = None,
        ready_timeout: str | None = None,
        timeout: str | None = None,
        tags: list[str] | None = None,
        registry_auth: tuple[str, str] | None = None,
    ) -> Op[LineStream[dict[str, Any]]]:
        """Builds (or rebuilds) template name from context, a tar of the
        build context (bytes, a file object or an iterable of bytes). The
        answer is the build's progress as it happens, a dict per line: a
        step's heading (step, of, instruction, cached), a line of output
        (log), and last {"template": {...}} or {"error": {...}} (for a
        failed step: step, line, exit_code, output). A Dockerfile that does
        not parse is refused at once (InvalidArgument). tags also name the
        build name:tag; registry_auth, (username, password), logs in to the
        registry of an OCI base for that pull only."""
        params = query(
            dockerfile=dockerfile, spec=spec, no_cache=no_cache or None, cpus=cpus, memory=memory, disk=disk,
            ready_timeout=ready_timeout, timeout=timeout,
        )  # fmt: skip
        args = [f"{k}={v}" for k, v in (build_args or {}).items()]
        if args:
            params["build_arg"] = args
        if tags:
            params["tag"] = list(tags)
        headers = {"Content-Type": "application/x-tar"}
        if registry_auth:
            headers["X-Agentvm-Registry-Auth"] = base64.b64encode(f"{registry_auth[0]}:{registry_auth[1]}".encode()).decode()
        r = yield Call(
            "POST", "/v1/templates/" + seg(name) + "/build", params=params, content=_body(self._t, context),
            headers=headers, stream=True,
        )  # fmt: skip
        return LineStream(r, json.loads)

    @op
    def list(self) -> Op[list[BuiltTemplate]]:
        r = yield Call("GET", "/v1/templates")
        return parse_list(BuiltTemplate, r.json(), "templates")

    @op
    def get(self, name: str) -> Op[BuiltTemplate]:
        """A template, with its Dockerfile and its last build's log."""
        r = yield Call("GET", "/v1/templates/" + seg(name))
        return parse(BuiltTemplate, r.json())

    @op
    def tag(self, ref: str, tags: list[str]) -> Op[BuiltTemplate]:
        """Tags the build ref (name, its latest, or name:tag): name:tag then
        restores it, whatever name is built as later."""
        r = yield Call("POST", "/v1/templates/" + seg(ref) + "/tags", json={"tags": list(tags)})
        return parse(BuiltTemplate, r.json())

    @op
    def delete(self, name: str) -> Op[None]:
        """Removes a template (name:tag: that tag only) and the cached steps
        nothing else uses."""
        yield Call("DELETE", "/v1/templates/" + seg(name))

    @op
    def prune(self) -> Op[int]:
        """Removes the cached steps no template uses; returns how many."""
        r = yield Call("POST", "/v1/templates/prune")
        return int(r.json().get("removed", 0))


class Tokens:
    """Scoped tokens (admin only)."""

    def __init__(self, t: Any) -> None:
        self._t = t

    @op
    def create(self, *, vm: str | None = None, admin: bool | None = None, allow: list[str] | None = None, ttl: str | None = None, user: str | None = None, name: str | None = None, ssh_keys: list[str] | None = None, e2b: bool | None = None) -> Op[Token]:
        """Issues a token; its secret is in ``token`` (only in this answer)."""
        r = yield Call("POST", "/v1/tokens", json=drop_none(vm=vm, admin=admin, allow=allow, ttl=ttl, user=user, name=name, ssh_keys=ssh_keys, e2b=e2b))
        return parse(Token, r.json())

    @op
    def list(self, *, vm: str | None = None) -> Op[list[Token]]:
        r = yield Call("GET", "/v1/tokens", params=query(vm=vm))
        return parse_list(Token, r.json(), "tokens")

    @op
    def revoke(self, token_id: str) -> Op[None]:
        """Revokes a token; what it has open is closed."""
        yield Call("DELETE", "/v1/tokens/" + seg(token_id))


class Networks:
    """Private networks (admin only)."""

    def __init__(self, t: Any) -> None:
        self._t = t

    @op
    def create(self, name: str, *, egress: dict[str, Any] | None = None) -> Op[NetworkInfo]:
        r = yield Call("POST", "/v1/networks", json=drop_none(name=name, egress=egress))
        return parse(NetworkInfo, r.json())

    @op
    def list(self) -> Op[list[NetworkInfo]]:
        r = yield Call("GET", "/v1/networks")
        return parse_list(NetworkInfo, r.json(), "networks")

    @op
    def get(self, name: str) -> Op[NetworkInfo]:
        r = yield Call("GET", "/v1/networks/" + seg(name))
        return parse(NetworkInfo, r.json())

    @op
    def delete(self, name: str) -> Op[None]:
        """Deletes an empty network (Conflict while VMs are on it)."""
        yield Call("DELETE", "/v1/networks/" + seg(name))

    @op
    def set_egress(self, name: str, egress: dict[str, Any]) -> Op[NetworkInfo]:
        """Sets the network's egress policy (its VMs without their own follow it)."""
        r = yield Call("POST", "/v1/networks/" + seg(name) + "/egress", json=egress)
        return parse(NetworkInfo, r.json())


class Nodes:
    """A cluster's nodes (admin only)."""

    def __init__(self, t: Any) -> None:
        self._t = t

    @op
    def list(self) -> Op[list[Node]]:
        r = yield Call("GET", "/v1/nodes")
        return parse_list(Node, r.json(), "nodes")

    @op
    def drain(self, node: str) -> Op[dict[str, Any]]:
        """Moves the node's VMs to other nodes and stops placing VMs on it."""
        r = yield Call("POST", "/v1/nodes/" + seg(node) + "/drain")
        return r.json()

    @op
    def remove(self, node: str) -> Op[None]:
        yield Call("DELETE", "/v1/nodes/" + seg(node))


class Repos:
    """Hosted git repositories (admin only). Clone and push with git at the
    server's URL plus ``repo.url``, a token as the password."""

    def __init__(self, t: Any) -> None:
        self._t = t

    @op
    def create(self, name: str, *, from_url: str | None = None, allow_private: bool = False) -> Op[Repo]:
        """Empty, or a copy of every branch and tag at ``from_url`` (http or https)."""
        r = yield Call("POST", "/v1/repos", json=drop_none(name=name, from_url=from_url, allow_private=allow_private or None))
        return parse(Repo, r.json())

    @op
    def list(self) -> Op[list[Repo]]:
        r = yield Call("GET", "/v1/repos")
        return parse_list(Repo, r.json(), "repos")

    @op
    def get(self, name: str) -> Op[Repo]:
        r = yield Call("GET", "/v1/repos/" + seg(name))
        return parse(Repo, r.json())

    @op
    def delete(self, name: str) -> Op[None]:
        """Deletes it; its tokens end, with their clones and pushes under way."""
        yield Call("DELETE", "/v1/repos/" + seg(name))

    @op
    def token(self, name: str, *, access: str | None = None, branches: str | None = None, ttl: str | None = None, token_name: str | None = None) -> Op[Token]:
        """A token that opens this repository only: ``read`` (default) or
        ``write``, pushes limited to ``branches`` (a glob) when given."""
        r = yield Call("POST", "/v1/repos/" + seg(name) + "/tokens", json=drop_none(access=access, branches=branches, ttl=ttl, name=token_name))
        return parse(Token, r.json())

    @op
    def add_hook(self, name: str, url: str, *, allow_private: bool = False) -> Op[RepoHook]:
        """A webhook POSTed after each push, signed with the secret in the answer."""
        r = yield Call("POST", "/v1/repos/" + seg(name) + "/hooks", json=drop_none(url=url, allow_private=allow_private or None))
        return parse(RepoHook, r.json())

    @op
    def remove_hook(self, name: str, hook: str) -> Op[None]:
        yield Call("DELETE", "/v1/repos/" + seg(name) + "/hooks/" + seg(hook))

    @op
    def events(self, name: str, *, after: int | None = None) -> Op[list[Event]]:
        """The pushes (who, each ref's old and new commit) and webhook deliveries."""
        r = yield Call("GET", "/v1/repos/" + seg(name) + "/events", params=query(after=after))
        return parse_list(Event, r.json(), "events")


class _Client:
    def __init__(self, t: Any) -> None:
        self._t = t
        self.vms = VMs(t)
        self.snapshots = Snapshots(t)
        self.templates = Templates(t)
        self.repos = Repos(t)
        self.tokens = Tokens(t)
        self.networks = Networks(t)
        self.domains = Domains(t)
        self.nodes = Nodes(t)

    @property
    def url(self) -> str:
        return self._t.url

    def vm(self, ref: str) -> VM:
        """A VM handle by id or name, without a request."""
        return self.vms.open(ref)

    @op
    def health(self) -> Op[Health]:
        """The server's health (no token needed)."""
        r = yield Call("GET", "/v1/health")
        return parse(Health, r.json())

    @op
    def host(self) -> Op[HostInfo]:
        """Capacity and templates."""
        r = yield Call("GET", "/v1/host")
        return parse(HostInfo, r.json())

    @op
    def ssh(self) -> Op[SSHInfo]:
        """The SSH gateway's address and host key."""
        r = yield Call("GET", "/v1/ssh")
        return parse(SSHInfo, r.json())

    @op
    def metrics(self) -> Op[str]:
        """Prometheus metrics (admin token)."""
        r = yield Call("GET", "/metrics")
        return r.text

    @op
    def ca(self) -> Op[str]:
        """The PEM certificate of the server's local CA (serve --tls auto)."""
        r = yield Call("GET", "/v1/tls/ca")
        return r.text

    @op
    def events(self, *, after: int | None = None, limit: int | None = None) -> Op[list[Event]]:
        """Events of every VM (admin)."""
        r = yield Call("GET", "/v1/events", params=query(after=after, limit=limit))
        return parse_list(Event, r.json(), "events")

    @op
    def follow_events(self, *, after: int | None = None) -> Op[LineStream[Event]]:
        """Events of every VM as they happen (admin)."""
        r = yield Call("GET", "/v1/events", params=query(after=after, follow=True), stream=True)
        return LineStream(r, json_lines(Event))


class AgentVM(_Client):
    """The sync client. Without arguments it uses AGENTVM_URL (default
    http://127.0.0.1:7070) and AGENTVM_TOKEN, else the admin token in the
    data dir, as the CLI does::

        av = AgentVM()
        vm = av.vms.create("box1")
        print(vm.exec("uname -a").stdout)
    """

    def __init__(self, url: str | None = None, token: str | None = None, *, data_dir: str | None = None, headers: dict[str, str] | None = None, timeout: float | None = None, verify: Any = None) -> None:
        super().__init__(SyncTransport(url, token, data_dir, headers, timeout, verify))

    def close(self) -> None:
        self._t.close()

    def __enter__(self) -> AgentVM:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncAgentVM(_Client):
    """The async client: the same calls as AgentVM, each a coroutine::

        async with AsyncAgentVM() as av:
            vm = await av.vms.create("box1")
            print((await vm.exec("uname -a")).stdout)
    """

    def __init__(self, url: str | None = None, token: str | None = None, *, data_dir: str | None = None, headers: dict[str, str] | None = None, timeout: float | None = None, verify: Any = None) -> None:
        super().__init__(AsyncTransport(url, token, data_dir, headers, timeout, verify))

    async def close(self) -> None:
        await self._t.close()

    async def __aenter__(self) -> AsyncAgentVM:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
