# Generated from api/openapi.yaml by scripts/gen.py (datamodel-code-generator); do not edit.

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    RootModel,
    confloat,
    conint,
    constr,
)


class RunCodeRequest(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    code: str
    language: Literal["python", "javascript", "js", "bash"] | str | None = Field(
        None,
        description="run in this language's default context (default python); not with context",
    )
    context: str | None = Field(None, description="a context id from /code/contexts")
    env: dict[str, str] | None = Field(
        None, description="environment variables for this run only"
    )
    timeout: str | None = Field(
        None,
        description="interrupt the run after this long (default 5m, at most 24h); the context survives",
        examples=["30s"],
    )


class CodeEvent(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    type: Literal["stdout", "stderr", "result", "error", "count", "end"] | str
    text: str | None = Field(None, description="stdout and stderr")
    data: dict[str, Any] | None = Field(
        None,
        description="result representations by MIME type: text/plain, text/html, text/markdown, text/latex, image/png, image/jpeg and application/pdf (base64), image/svg+xml, application/json, application/javascript",
    )
    main: bool | None = Field(
        None, description="the value of the code's last expression"
    )
    chart: dict[str, Any] | None = Field(
        None, description="structured data of a matplotlib chart"
    )
    name: str | None = Field(None, description="error: the exception's type")
    value: str | None = Field(None, description="error: its message")
    traceback: str | None = None
    execution_count: int | None = None
    error: str | None = Field(None, description="end: why the run ended abnormally")


class CodeContext(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    id: str
    language: str
    cwd: str


class Template(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    key: str | None = None
    image_hash: str | None = None
    cpus: int | None = None
    memory_mib: int | None = None
    disk_bytes: int | None = None
    accel: str | None = None
    qemu_version: str | None = None
    machine: str | None = None
    cold_boot_ms: int | None = None
    created_at: AwareDatetime | None = None


class Sample(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    time: AwareDatetime | None = None
    cpu_percent: float | None = Field(
        None, description="QEMU's CPU use over the interval"
    )
    rss_bytes: int | None = Field(None, description="QEMU's resident memory")


class VMMetrics(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    vm: str | None = None
    interval_s: int | None = None
    samples: list[Sample] | None = None


class Event(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    seq: int | None = None
    vm: str | None = None
    time: AwareDatetime | None = None
    type: str | None = Field(None, examples=["lifecycle"])
    actor: str | None = Field(None, examples=["admin"])
    message: str | None = None
    data: dict[str, str] | None = None


class ServiceInfo(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    name: str | None = None
    unit: str | None = None
    argv: list[str] | None = None
    user: str | None = None
    restart: str | None = None
    type: str | None = None
    enabled: bool | None = None
    active_state: str | None = None
    sub_state: str | None = None
    main_pid: int | None = None
    exit_code: int | None = None
    restarts: int | None = None
    since: AwareDatetime | None = None


class JobInfo(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    id: str | None = None
    argv: list[str] | None = None
    user: str | None = None
    pid: int | None = None
    started_at: AwareDatetime | None = None
    exited: bool | None = None
    exit_code: int | None = None
    signal: str | None = None
    ended_at: AwareDatetime | None = None


class Port(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    port: int | None = None
    kind: Literal["http", "tcp"] | str | None = None
    public: bool | None = None
    url: str | None = Field(None, description="preview URL (http)")
    host: str | None = Field(None, description="host address (tcp)")
    created_at: AwareDatetime | None = None


class Domain(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    domain: str
    vm: str
    port: int
    created_at: AwareDatetime | None = None


class Egress(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    mode: Literal["public", "deny", "allow"] | str | None = None
    allow: list[str] | None = Field(
        None,
        description="CIDRs, IPs and domain names (a domain admits its subdomains); mode allow",
    )
    allow_host: list[int] | None = Field(
        None,
        description="host loopback ports reachable at host.agentvm.internal; agentvm's own ports never",
    )


class NetworkInfo(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    name: str | None = None
    egress: Egress | None = None
    vms: list[str] | None = None
    created_at: AwareDatetime | None = None


class CreateTokenRequest(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    vm: str | None = Field(
        None, description="VM id or name; required unless admin or e2b is set"
    )
    admin: bool | None = Field(
        None,
        description="An admin token: no vm, allow, user or ssh_keys; the admin's whole access, kept in the database, so that in a cluster it works on every node, and revocable.",
    )
    e2b: bool | None = Field(
        None,
        description="The secret is an E2B API key (e2b_ and 40 hex digits) for the E2B-compatible API. Without a vm it is an admin key (default TTL 8760h).",
    )
    allow: (
        list[Literal["exec", "files", "ssh", "term", "preview", "display"] | str] | None
    ) = Field(None, description="Default all.")
    ttl: str | None = Field(
        None, description="Go duration, default 1h, at most 8760h", examples=["1h"]
    )
    user: str | None = Field(None, description="limit to this guest user, e.g. agent")
    name: str | None = None
    ssh_keys: list[str] | None = None


class Token(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    id: str | None = None
    token: str | None = Field(
        None, description="the secret; only in the create response"
    )
    vm_id: str | None = None
    allow: list[str] | None = None
    user: str | None = None
    name: str | None = None
    created_at: AwareDatetime | None = None
    expires_at: AwareDatetime | None = None
    ssh_keys: list[str] | None = None
    repo: str | None = Field(
        None, description="a repository token's repository (it opens no VM)"
    )
    branches: str | None = Field(
        None,
        description="a repository token's push limit: the glob branches must match",
    )


class DiffEntry(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    path: str | None = None
    kind: Literal["file", "dir", "symlink", "other"] | str | None = None
    size: int | None = None
    old_size: int | None = None
    mode: int | None = Field(None, description="st_mode (type and permission bits)")
    old_mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    what: list[Literal["content", "mode", "owner", "target"] | str] | None = None
    target: str | None = None
    binary: bool | None = None
    diff: str | None = Field(None, description="unified diff of a text file")
    diff_note: str | None = None


class DiffResponse(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    vm: str | None = None
    since: str | None = None
    base: str | None = Field(None, description="what the compared point is")
    added: list[DiffEntry] | None = None
    changed: list[DiffEntry] | None = None
    removed: list[DiffEntry] | None = None
    truncated: bool | None = None
    scanned: int | None = None
    ignored: list[str] | None = None
    took_ms: int | None = None


class Recording(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    id: str | None = None
    kind: Literal["terminal", "exec"] | str | None = None
    title: str | None = None
    user: str | None = None
    actor: str | None = None
    start: AwareDatetime | None = None
    duration_ms: int | None = None
    bytes: int | None = None
    exit_code: int | None = None
    cut: bool | None = Field(
        None, description="the recording stopped at the VM's bound"
    )


class RepoHook(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    id: str | None = None
    url: str | None = None
    secret: str | None = Field(
        None,
        description="the HMAC-SHA256 key of X-Agentvm-Signature; only in the add response",
    )
    allow_private: bool | None = None
    created_at: AwareDatetime | None = None


class SSHInfo(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    enabled: bool | None = None
    listen: str | None = Field(None, examples=["127.0.0.1:2222"])
    host_key: str | None = Field(None, description="authorized_keys format")


class TermCreate(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    name: constr(pattern=r"^[A-Za-z0-9._-]{1,64}$") | None = None
    argv: list[str] | None = None
    env: dict[str, str] | None = None
    cwd: str | None = None
    user: str | None = None
    cols: int | None = None
    rows: int | None = None


class TermInfo(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    name: str | None = None
    pid: int | None = None
    user: str | None = None
    argv: list[str] | None = None
    cols: int | None = None
    rows: int | None = None
    clients: int | None = None
    created_at: AwareDatetime | None = None
    exited: bool | None = None
    exit_code: int | None = None
    signal: str | None = None


class FileInfo(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    name: str | None = None
    path: str | None = None
    type: Literal["file", "dir", "symlink", "other"] | str | None = None
    size: int | None = None
    mode: int | None = Field(None, description="permission bits (07777)")
    uid: int | None = None
    gid: int | None = None
    owner: str | None = None
    group: str | None = None
    mtime: AwareDatetime | None = None
    link_target: str | None = None
    metadata: dict[str, str] | None = Field(
        None,
        description="the file's user.e2b.* extended attributes (E2B file metadata)",
    )


class Error1(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    code: Literal["invalid_argument", "not_found", "conflict", "unauthorized", "insufficient_storage", "unavailable", "internal", "forbidden", "permission_denied", "exists", "not_empty", "is_directory", "not_directory", "no_space", "state_incompatible", "other_node"] | str
    message: str = Field(..., description="Human-readable message.")


class Error(BaseModel):
    """
    Body of every non-2xx response.
    """

    model_config = ConfigDict(
        extra="allow",
    )
    error: Error1


class Health(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    proxy: str | None = Field(None, description="the preview proxy's address")
    proxy_tls: bool | None = Field(
        None, description="the preview proxy serves HTTPS only"
    )
    domain: str | None = Field(None, description="the preview host suffix")
    ssh: str | None = Field(None, description="the SSH gateway's address")
    status: Literal["ok"] | str
    version: str = Field(..., examples=["0.1.0-dev"])
    accel: Literal["kvm", "tcg"] | str = Field(..., description="Accelerator in use.")
    warm_pool: dict[str, int] | None = Field(
        None,
        description='Ready warm-pool VMs per shape, keyed "<cpus>x<memory MiB>" (serve --warm-pool).\nA create of a shape with a ready pool VM only pushes the new identity to it.\n',
        examples=[{"1x1024": 1}],
    )


class VMState(
    RootModel[Literal["creating", "running", "paused", "suspended", "stopped", "crashed", "deleting", "error"] | str]
):
    root: Literal["creating", "running", "paused", "suspended", "stopped", "crashed", "deleting", "error"] | str = (
        Field(
            ...,
            description="VM state. `creating` and `deleting` are transient. `running`: the guest\nruns. `paused`: its vCPUs are frozen, memory stays in RAM (pause).\n`suspended`: its memory and device state are saved to disk and it has\nno QEMU process (suspend, or the server's shutdown); it is woken on\nrequest. `stopped` is a clean shutdown (including a guest power-off);\n`crashed` is an unexpected QEMU exit. `error` is defined (and accepted\nby the state checks) but not currently assigned by the server.\n",
        )
    )


class Node(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    id: str = Field(..., description="the node's data dir identity")
    name: str
    address: str = Field(..., description="where clients reach its API")
    peer_address: str | None = Field(
        None,
        description="its node-to-node listener, where other nodes forward requests for its VMs (TLS with the cluster CA's certificates both ways)",
    )
    generation: int
    alive: bool = Field(..., description="its lease runs (by the database's clock)")
    lease_expires: AwareDatetime
    lease_left_ms: int = Field(..., description="negative once the lease ran out")
    joined_at: AwareDatetime
    self: bool | None = Field(None, description="the node that answered")
    cpus: int
    memory_mib: int
    qemu_version: str
    machine_type: str
    cpu_model: str
    accel: str
    draining: bool | None = Field(
        None, description="the node takes no new VMs (a drain), until it joins again"
    )


class DrainedVM(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    id: str
    name: str
    to: str | None = Field(
        None, description="the node it moved to (absent when it stayed)"
    )
    state: str = Field(..., description="its state after the drain")
    error: str | None = Field(
        None, description="why it stayed (or why its wake on the new node failed)"
    )


class RevivesFrom(BaseModel):
    """
    for a lost node's VM without a stored state of its own: its newest stored snapshot, which any node asked to act on the VM restores it from (what it did since is gone)
    """

    model_config = ConfigDict(
        extra="allow",
    )
    snapshot: str
    taken_at: AwareDatetime


class Size(RootModel[confloat(le=1073741824.0, gt=0.0) | str]):
    root: confloat(le=1073741824.0, gt=0.0) | str = Field(
        ...,
        description="A size. A JSON number is MiB (greater than 0, at most 2^30; fractions\nallowed). A string is a number (parsed as a float, case-insensitive,\nsurrounding spaces trimmed) with an optional binary-unit suffix `K`,\n`M`, `G` or `T`, optionally followed by `B` or `iB` (`512M`, `1.5G`,\n`2048K`, `8GiB`); without a unit letter it is MiB. It must be greater\nthan 0 and at most 2^50 bytes. Invalid sizes give `400`.\n",
        examples=["2G"],
    )


class Duration(RootModel[confloat(ge=0.0) | str]):
    root: confloat(ge=0.0) | str = Field(
        ...,
        description="A duration, as a number of seconds (>= 0, fractions allowed) or a Go duration string such as `30s`, `1m30s`, `500ms`.",
        examples=["30s"],
    )


class CreateVMRequest(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    template: str | None = Field(
        None,
        description="Create from a template built with POST /v1/templates/{name}/build:\na restore of its machine with its start command running; the\ntemplate's ENV is added to env. Not with from or image.\n",
    )
    image: str | None = Field(
        None,
        description="The image: `default` (Debian with Python, Node.js and git) or\n`code-interpreter` (alias `code-interpreter-v1`; also Jupyter\nkernels with numpy, pandas and matplotlib, see /code) or `browser`\n(Chromium on a virtual display, running when the VM is created;\nits DevTools protocol on port 9222 of the VM, see /screenshot and\n/vnc). Each image is built on first use and has its own template.\nNot with `from`.\n",
    )
    idle_timeout: str | None = Field(
        None, description="suspend after this long without activity", examples=["15m"]
    )
    delete_after: str | None = Field(None, examples=["24h"])
    restart: Literal["never", "on-failure", "always"] | str | None = None
    network: str | None = Field(None, description="put the VM on this private network")
    egress: Egress | None = None
    repo: str | None = Field(
        None,
        description="A hosted repository, `NAME` or `NAME@BRANCH`, cloned into\n`repo_dir` as the VM is made (a failed clone fails the create and\nleaves no VM). Inside, the VM pushes to and pulls from\n`http://git.agentvm.internal/NAME.git` with no credential; its\nforks too.\n",
    )
    no_record: bool | None = Field(
        None,
        description="do not record the VM's terminals and execs (its forks' neither)",
    )
    repo_dir: str | None = Field(
        None,
        description="where to clone `repo` (absolute; default /home/agent/NAME); the clone belongs to the owner of its parent directory",
    )
    anti_affinity: str | None = Field(
        None,
        description="On a cluster: one of the VM's `labels`. The VM prefers a node on\nwhich no VM holding memory (creating, running, paused) has the\nsame value of that label, when such a node has room; else the\nroomiest node, as any create. A preference, not a guarantee: two\nsuch creates at the same moment may meet on one node. Outside a\ncluster it is accepted and has no effect.\n",
    )
    name: constr(pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$") | None = Field(
        None,
        description="VM name (a DNS label, used as the hostname). Defaults to the generated id.",
    )
    cpus: conint(ge=0, le=64) | None = Field(
        None,
        description="Number of vCPUs, 1..64; 0 or omitted means 1 (with `from`, the snapshot's).",
    )
    memory: Size | None = Field(
        None,
        description="Guest memory; the value is rounded up to whole MiB and must be at\nleast 128 MiB. Omitted means 1024 MiB (with `from`, the snapshot's).\n",
    )
    disk: Size | None = Field(
        None,
        description="Disk size; at least the base image size. Omitted means 8 GiB (with `from`, the snapshot's disk size, which is also the minimum).",
    )
    labels: dict[str, constr(max_length=256)] | None = Field(
        None,
        description="Keys match `^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$`; values at most 256 bytes.",
    )
    env: dict[str, str] | None = Field(
        None,
        description="Environment variables for the guest. Keys match `^[A-Za-z_][A-Za-z0-9_]*$`; values must not contain NUL.",
    )
    idempotency_key: constr(max_length=200) | None = Field(
        None,
        description="Idempotency key; the `Idempotency-Key` header takes precedence.",
    )
    from_: str | None = Field(
        None,
        alias="from",
        description="Create the VM from this snapshot (id or name) instead of the image.\n`cpus` and `memory`, if given, must equal the snapshot's (`409`\notherwise); `disk` defaults to, and may not be smaller than, the\nsnapshot's; `env` defaults to the snapshot's.\n",
    )


class OpStats(BaseModel):
    """
    Timing of the lifecycle operation that returned the VM; only in the
    responses of pause, resume, suspend and resize.

    """

    model_config = ConfigDict(
        extra="allow",
    )
    name: Literal["pause", "resume", "suspend", "resize"] | str
    took_ms: int = Field(
        ...,
        description="Duration of the operation in milliseconds; 0 for a no-op (already in the target state) and always 0 for resize.",
    )
    paused_ms: int | None = Field(
        None,
        description="Suspend only; how long the guest's vCPUs were stopped for the save. Omitted when 0.",
    )
    bytes: int | None = Field(
        None,
        description="Suspend only; bytes of memory and device state written. Omitted when 0.",
    )
    message: str | None = Field(
        None,
        description="Resize only; what changed now and what waits for the next start.",
    )


class SnapshotRequest(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    name: constr(pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$") | None = Field(
        None,
        description="Snapshot name (a DNS label), unique among snapshots. Defaults to the snapshot id.",
    )


class TagTemplateRequest(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    tags: list[str] = Field(
        ...,
        description="Tags: letters, digits, '_', '.' and '-', 1-128, not starting with '.' or '-'.",
    )


class BuiltTemplate(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    name: str | None = None
    snapshot: str | None = Field(None, description="The snapshot a create restores.")
    base: str | None = Field(None, description="FROM: an image or another template.")
    steps: list[str] | None = Field(
        None, description="The Dockerfile's instructions as written."
    )
    start: list[str] | None = Field(
        None,
        description="The start command (service template-start in every VM made from it).",
    )
    ready: str | None = Field(
        None, description="The HEALTHCHECK command the build waited on."
    )
    env: dict[str, str] | None = None
    workdir: str | None = None
    user: str | None = None
    expose: list[int] | None = None
    cpus: int | None = None
    memory_mib: int | None = None
    disk_bytes: int | None = None
    state_bytes: int | None = None
    build_ms: int | None = None
    created_at: AwareDatetime | None = None
    built_at: AwareDatetime | None = None
    dockerfile: str | None = Field(
        None, description="In GET /v1/templates/{name} only."
    )
    build_log: str | None = Field(
        None,
        description="The last build's output (its last 64 KiB); in GET /v1/templates/{name} only.",
    )


class ListTemplatesResponse(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    templates: list[BuiltTemplate] | None = None


class PruneTemplatesResponse(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    removed: int | None = None


class Error2(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    code: str | None = Field(
        None,
        description="step_failed for a failed step (then step, line, instruction, exit_code -1 when it did not exit, output: its last lines).",
    )
    message: str | None = None
    step: int | None = None
    line: int | None = None
    instruction: str | None = None
    exit_code: int | None = None
    output: str | None = None


class BuildEvent(BaseModel):
    """
    A step's heading (step, of, instruction, cached), a line of output (log), or last the template or the error.
    """

    model_config = ConfigDict(
        extra="allow",
    )
    step: int | None = None
    of: int | None = None
    instruction: str | None = None
    cached: bool | None = None
    log: str | None = None
    template: BuiltTemplate | None = None
    error: Error2 | None = None


class Snapshot(BaseModel):
    """
    A saved VM (memory, processes and disk).
    """

    model_config = ConfigDict(
        extra="allow",
    )
    image: str = Field(..., description="the image of the VM it was taken from")
    id: str = Field(
        ...,
        description="`snap-` followed by 12 hex digits.",
        examples=["snap-0a1b2c3d4e5f"],
    )
    name: str = Field(..., description="The given name, or the id.")
    vm_id: str = Field(..., description="Id of the VM the snapshot was taken from.")
    vm_name: str = Field(
        ..., description="Name of that VM when the snapshot was taken."
    )
    cpus: int = Field(
        ..., description="vCPUs; VMs created from the snapshot keep this."
    )
    memory_mib: int = Field(
        ..., description="Memory in MiB; VMs created from the snapshot keep this."
    )
    disk_bytes: int = Field(
        ...,
        description="Disk size of the VM when the snapshot was taken; the default and minimum disk size of VMs created from it.",
    )
    state_bytes: int = Field(..., description="Bytes of saved memory and device state.")
    paused_ms: int = Field(
        ..., description="How long the VM's vCPUs were stopped for the capture."
    )
    created_at: AwareDatetime
    node: str | None = Field(
        None,
        description="In a cluster, the name of the node that keeps the snapshot's files.",
    )
    node_id: str | None = Field(None, description="In a cluster, the id of that node.")
    stored_at: AwareDatetime | None = Field(
        None,
        description="When the snapshot was all in the object store (serve --objects), from where any node with the same QEMU, machine, CPU model and accelerator restores it; absent until then.",
    )


class ListSnapshotsResponse(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    snapshots: list[Snapshot]


class ForkRequest(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    count: conint(ge=1, le=32) | None = Field(
        1,
        description="Number of children, 1..32; the `count` query parameter overrides it.",
    )


class ResizeRequest(BaseModel):
    """
    Omitted fields keep their value; at least one field must be given.
    """

    model_config = ConfigDict(
        extra="allow",
    )
    cpus: conint(ge=0, le=64) | None = Field(
        None, description="New number of vCPUs, 1..64; 0 or omitted keeps it."
    )
    memory: Size | None = Field(
        None, description="New guest memory, rounded up to whole MiB; at least 128 MiB."
    )
    disk: Size | None = Field(
        None, description="New disk size; may not be smaller than the current one."
    )


class ExecRequest(BaseModel):
    """
    Exactly one of `cmd` or `shell` must be given.
    """

    model_config = ConfigDict(
        extra="allow",
    )
    cmd: list[str] | None = Field(
        None,
        description="argv, run without a shell; `cmd[0]` must not be empty.",
        min_length=1,
    )
    shell: str | None = Field(None, description="A shell command line.")
    env: dict[str, str] | None = Field(
        None,
        description="Extra environment variables. Keys match `^[A-Za-z_][A-Za-z0-9_]*$`; values must not contain NUL.",
    )
    cwd: str | None = Field(None, description="Absolute working directory.")
    user: constr(pattern=r"^[a-z_][a-z0-9_-]{0,31}$") | None = Field(
        None, description="User to run as."
    )
    timeout: Duration | None = Field(
        None,
        description="Kill the command after this long; 0 or omitted means no timeout.",
    )
    stdin: str | None = Field(
        None,
        description="Text written to the process's stdin, which is then closed (JSON and NDJSON modes only; ignored for upgraded exec).",
    )


class ExecResult(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    stdout: str = Field(
        ...,
        description="Stdout, up to 16 MiB (invalid UTF-8 bytes are replaced by U+FFFD in JSON encoding).",
    )
    stderr: str = Field(
        ...,
        description="Stderr, up to 16 MiB, followed by any guest-reported error messages, one per line.",
    )
    exit_code: int
    signal: str | None = Field(
        None,
        description="Name of the signal that killed the process (e.g. `SIGKILL`), if any.",
    )
    timed_out: bool | None = Field(
        None, description="True when the process was killed by the timeout."
    )
    duration_ms: int
    stdout_truncated: bool | None = Field(
        None,
        description="True when stdout exceeded 16 MiB and only its first 16 MiB is in `stdout`.",
    )
    stderr_truncated: bool | None = Field(
        None,
        description="True when stderr exceeded 16 MiB and only its first 16 MiB is in `stderr` (guest-reported error messages are still appended).",
    )


class ExecEvent(BaseModel):
    """
    One line of an NDJSON exec stream. `stdout`/`stderr` carry output in
    `data` as text; a chunk that is not valid UTF-8 is sent as
    `stdout_base64`/`stderr_base64` with standard base64 in `data`. `error`
    carries `message`. `exit` is the last event and carries `exit_code`
    (always present) and `signal`/`timed_out` when set.

    """

    model_config = ConfigDict(
        extra="allow",
    )
    type: Literal["stdout", "stderr", "stdout_base64", "stderr_base64", "exit", "error"] | str
    data: str | None = None
    exit_code: int | None = None
    signal: str | None = None
    timed_out: bool | None = None
    message: str | None = None


class ExitStatus(BaseModel):
    """
    Payload of an exit frame (type 5) on the upgraded exec stream. The
    server forwards the guest's JSON as is, so `signal` and `timed_out`
    are always present there.

    """

    model_config = ConfigDict(
        extra="allow",
    )
    exit_code: int
    signal: str | None = None
    timed_out: bool | None = None
    duration_ms: int


class ExecErrorFrame(BaseModel):
    """
    Payload of an error frame (type 6) on the upgraded exec stream.
    """

    model_config = ConfigDict(
        extra="allow",
    )
    message: str


class HostInfo(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    accel: str | None = None
    memory_total_bytes: int | None = None
    memory_available_bytes: int | None = None
    memory_committed_bytes: int | None = Field(
        None, description="memory of the VMs holding RAM (running"
    )
    disk_free_bytes: int | None = Field(
        None, description="free space of the data dir's file system"
    )
    vms: dict[str, int] | None = Field(None, description="VMs by state")
    running: int | None = None
    suspended: int | None = None
    warm_pool: dict[str, int] | None = None
    templates: list[Template] | None = None


class Repo(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    name: str | None = None
    url: str | None = Field(
        None,
        description="the clone URL's path on the API listener",
        examples=["/git/app.git"],
    )
    branches: dict[str, str] | None = Field(None, description="each branch's commit")
    head: str | None = Field(None, description="the default branch")
    size_bytes: int | None = None
    hooks: list[RepoHook] | None = None
    created_at: AwareDatetime | None = None


class DrainResponse(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    node: str = Field(..., description="the drained node's name")
    vms: list[DrainedVM]


class VM(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    node: str | None = Field(
        None, description="the cluster node the VM runs on (absent outside a cluster)"
    )
    node_id: str | None = None
    node_lost: bool | None = Field(
        None,
        description="the VM's node is gone (its lease ran out): the VM runs nowhere, whatever its state",
    )
    stored_at: AwareDatetime | None = Field(
        None,
        description="when the state of this suspended VM was all in the object store (serve --objects); if its node is lost, any node asked to act on it takes it over and wakes it from that state",
    )
    revives_from: RevivesFrom | None = Field(
        None,
        description="for a lost node's VM without a stored state of its own: its newest stored snapshot, which any node asked to act on the VM restores it from (what it did since is gone)",
    )
    image: Literal["default", "code-interpreter", "browser"] | str = Field(
        ..., description="the image the VM was made from"
    )
    idle_timeout_s: int | None = None
    delete_after_s: int | None = None
    restart: str | None = None
    network: str | None = Field(None, description="the private network the VM is on")
    egress: Egress | None = None
    ports: list[Port] | None = None
    id: str = Field(
        ...,
        description="`vm-` followed by 12 hex digits.",
        examples=["vm-1a2b3c4d5e6f"],
    )
    name: str = Field(
        ..., description="DNS label; also the guest hostname. Defaults to the id."
    )
    state: VMState
    cpus: int
    memory_mib: int
    disk_bytes: int
    labels: dict[str, str] | None = Field(None, description="Omitted when empty.")
    env: dict[str, str] | None = Field(
        None, description="Environment variables set in the guest. Omitted when empty."
    )
    ip: str = Field(..., description="Guest IP address.")
    subnet: str = Field(..., description="The VM's private subnet (CIDR).")
    gateway: str = Field(
        ..., description="Gateway (and DNS) address of the VM's subnet."
    )
    pid: int | None = Field(
        None, description="QEMU process id; omitted when the VM has no process."
    )
    accel: str = Field(..., description="The server's accelerator (kvm or tcg).")
    template: str | None = Field(
        None, description="Key of the template the VM was restored from."
    )
    error: str | None = Field(
        None,
        description="Reason of the last failure (e.g. a crash or failed start), if any.",
    )
    created_at: AwareDatetime
    started_at: AwareDatetime | None = Field(
        None, description="Time of the last successful launch."
    )
    create_ms: int | None = Field(
        None,
        description="Server-side duration of the create (restore plus identity, and the\ntemplate's one-time cold boot when this was the first create of its\nshape), in milliseconds.\n",
    )
    source: str | None = Field(
        None,
        description="What the VM was made from when not from a template: `snapshot <snapshot name>`\n(create with `from`) or `fork of <parent name>`. Omitted otherwise.\n",
        examples=["snapshot base-ready"],
    )
    next_cpus: int | None = Field(
        None,
        description="vCPUs that apply at the next start (set by a resize of a running or paused VM); omitted when none is pending.",
    )
    next_memory_mib: int | None = Field(
        None,
        description="Memory in MiB that applies at the next start (set by a resize of a running or paused VM); omitted when none is pending.",
    )
    state_bytes: int | None = Field(
        None,
        description="Disk space of a suspended VM's saved memory and device state: the\nallocated bytes of all its files (a sparse RAM file's holes count\nnothing). Omitted when the VM is not suspended. `/metrics` reports\nthe same as `agentvm_vm_state_bytes`.\n",
        examples=[309329920],
    )
    op: OpStats | None = None


class ListVMsResponse(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    vms: list[VM]


class ForkResponse(BaseModel):
    model_config = ConfigDict(
        extra="allow",
    )
    parent: VM
    children: list[VM] = Field(..., description="The new VMs, all `running`.")
    parent_pause_ms: int = Field(
        ..., description="How long the parent's vCPUs were stopped for the capture."
    )
    state_bytes: int = Field(
        ..., description="Bytes of memory and device state captured from the parent."
    )
    took_ms: int = Field(..., description="Duration of the whole fork in milliseconds.")
