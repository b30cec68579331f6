// The VM handle: one VM's lifecycle, exec, and its sub-resources (files,
// terminals, ports, services, processes, jobs, events).
import type { Duplex } from 'node:stream'
import { Code } from './code.js'
import { Events } from './events.js'
import {
  type Command,
  type ExecOptions,
  type ExecProcess,
  type RunResult,
  type SpawnOptions,
  execBuffered,
  execEvents,
  execRequest,
  spawn,
} from './exec.js'
import { Files } from './files.js'
import { type CallOptions, type Transport, seg } from './http.js'
import { Ports } from './ports.js'
import { Recordings } from './recordings.js'
import { Jobs, Processes, Services } from './services.js'
import { Terminals } from './terminals.js'
import type { DiffResponse, Egress, ExecEvent, ExecRequest, ExecResult, ForkResponse, PolicyRequest, ResizeRequest, Snapshot, VMInfo, VMState } from './types.js'

/** Options of run. */
export interface RunOptions extends SpawnOptions {
  /** Called with each chunk of stdout as it arrives. */
  onStdout?: (chunk: Uint8Array) => void
  /** Called with each chunk of stderr as it arrives. */
  onStderr?: (chunk: Uint8Array) => void
}

/** The result of fork: the parent and the new VMs as handles. */
export interface ForkResult extends Omit<ForkResponse, 'parent' | 'children'> {
  parent: VM
  children: VM[]
}

/**
 * A VM. The handle keeps the VM's id (or the name it was opened by) and the
 * last state the API returned in `info`; lifecycle calls refresh it.
 */
export class VM {
  /** The id (`vm-...`) once known, else the name the handle was opened by. */
  readonly id: string
  /** The VM as last returned by the API (undefined for a handle opened by name and not yet fetched). */
  info: VMInfo | undefined
  readonly files: Files
  readonly terminals: Terminals
  readonly ports: Ports
  readonly services: Services
  readonly processes: Processes
  readonly jobs: Jobs
  readonly events: Events
  /** Live kernels of a code-interpreter VM (`image: 'code-interpreter'`). */
  readonly code: Code
  /** Its terminal sessions and execs as the daemon recorded them (admin only). */
  readonly recordings: Recordings

  /** @internal */
  constructor(
    private readonly t: Transport,
    ref: string | VMInfo,
  ) {
    this.id = typeof ref === 'string' ? ref : ref.id
    this.info = typeof ref === 'string' ? undefined : ref
    this.files = new Files(t, this.id)
    this.terminals = new Terminals(t, this.id)
    this.ports = new Ports(t, this.id)
    this.services = new Services(t, this.id)
    this.processes = new Processes(t, this.id)
    this.jobs = new Jobs(t, this.id)
    this.events = new Events(t, this.id)
    this.code = new Code(t, this.id)
    this.recordings = new Recordings(t, this.id)
  }

  /**
   * What changed on the VM's disk since its creation (or `since` a snapshot):
   * paths added, changed and removed, read from its disk layers; `diffs` adds
   * unified diffs of text files.
   */
  diff(o: CallOptions & { since?: string; diffs?: boolean; ignore?: string[]; defaultIgnores?: boolean; maxEntries?: number } = {}): Promise<DiffResponse> {
    return this.t.json('GET', this.path('/diff'), {
      query: { since: o.since, diffs: o.diffs, ignore: o.ignore, default_ignores: o.defaultIgnores === false ? 'false' : undefined, max_entries: o.maxEntries },
      signal: o.signal,
    })
  }

  /** The VM's name (its id until fetched, when opened by id). */
  get name(): string {
    return this.info?.name ?? this.id
  }

  /** The state as last returned by the API. */
  get state(): VMState | undefined {
    return this.info?.state
  }

  private path(rest = ''): string {
    return `/v1/vms/${seg(this.id)}${rest}`
  }

  private async update(p: Promise<VMInfo>): Promise<VMInfo> {
    this.info = await p
    return this.info
  }

  /** Fetches the VM. */
  refresh(o: CallOptions = {}): Promise<VMInfo> {
    return this.update(this.t.json('GET', this.path(), o))
  }

  /** Fetches the VM after resuming it if paused or waking it if suspended. */
  wake(o: CallOptions = {}): Promise<VMInfo> {
    return this.update(this.t.json('GET', this.path(), { query: { wake: 1 }, ...o }))
  }

  /** Deletes the VM (its snapshots are kept). */
  delete(o: CallOptions = {}): Promise<void> {
    return this.t.json('DELETE', this.path(), o)
  }

  /** Boots a stopped or crashed VM from its disk. */
  start(o: CallOptions = {}): Promise<VMInfo> {
    return this.update(this.t.json('POST', this.path('/start'), o))
  }

  /** Shuts the VM down, keeping its disk. */
  stop(o: CallOptions = {}): Promise<VMInfo> {
    return this.update(this.t.json('POST', this.path('/stop'), o))
  }

  /** Freezes the vCPUs (memory stays in RAM). */
  pause(o: CallOptions = {}): Promise<VMInfo> {
    return this.update(this.t.json('POST', this.path('/pause'), o))
  }

  /** Continues a paused VM. */
  resume(o: CallOptions = {}): Promise<VMInfo> {
    return this.update(this.t.json('POST', this.path('/resume'), o))
  }

  /** Saves memory and device state to disk and frees the RAM; any request wakes it. */
  suspend(o: CallOptions = {}): Promise<VMInfo> {
    return this.update(this.t.json('POST', this.path('/suspend'), o))
  }

  /** Grows the disk online, hot-adds vCPUs, or sets sizes for the next start. */
  resize(req: ResizeRequest, o: CallOptions = {}): Promise<VMInfo> {
    return this.update(this.t.json('POST', this.path('/resize'), { body: req, ...o }))
  }

  /** Sets the idle timeout, delete-after and restart policy. */
  setPolicy(req: PolicyRequest, o: CallOptions = {}): Promise<VMInfo> {
    return this.update(this.t.json('POST', this.path('/policy'), { body: req, ...o }))
  }

  /** Captures memory, processes and disk while the VM keeps running. */
  snapshot(name?: string, o: CallOptions = {}): Promise<Snapshot> {
    return this.t.json('POST', this.path('/snapshot'), { body: name ? { name } : {}, ...o })
  }

  /** Copies the running VM into count new running VMs; the parent keeps running. */
  async fork(count = 1, o: CallOptions = {}): Promise<ForkResult> {
    const r = await this.t.json<ForkResponse>('POST', this.path('/fork'), { body: { count }, ...o })
    this.info = r.parent
    return { ...r, parent: this, children: r.children.map((c) => new VM(this.t, c)) }
  }

  /** The VM's log (serial console and QEMU output; the last 4 MiB). */
  logs(o: CallOptions = {}): Promise<string> {
    return this.t.text('GET', this.path('/logs'), o)
  }

  /**
   * A PNG of a browser VM's display (`image: 'browser'`); `scale` in (0, 1]
   * shrinks it. Drive its Chromium with the DevTools protocol on port 9222
   * (`connect(9222)`, or the port's preview URL).
   */
  async screenshot(opts: { scale?: number } & CallOptions = {}): Promise<Uint8Array> {
    const resp = await this.t.fetch('GET', this.path('/screenshot'), { query: { scale: opts.scale }, signal: opts.signal })
    return new Uint8Array(await resp.arrayBuffer())
  }

  /** Puts the VM on a private network; null takes it off. */
  setNetwork(network: string | null, o: CallOptions = {}): Promise<VMInfo> {
    return this.update(this.t.json('POST', this.path('/network'), { body: { network: network ?? '' }, ...o }))
  }

  /** Sets the VM's own egress policy; null drops it (its network's applies, else public). */
  setEgress(egress: Egress | null, o: CallOptions = {}): Promise<VMInfo> {
    if (egress === null) return this.update(this.t.json('DELETE', this.path('/egress'), o))
    return this.update(this.t.json('POST', this.path('/egress'), { body: egress, ...o }))
  }

  /**
   * Runs a command and returns its buffered output once it exits (each of
   * stdout and stderr up to 16 MiB). A string is a shell command line, an
   * array an argv. `stdin` is written to the command and then closed.
   */
  exec(cmd: Command | ExecRequest, o: ExecOptions & { stdin?: string } = {}): Promise<ExecResult> {
    return execBuffered(this.t, this.id, execRequest(cmd, o, o.stdin), o.signal)
  }

  /** Runs a command and yields its events (stdout, stderr, error, exit) as they are produced. */
  execStream(cmd: Command | ExecRequest, o: ExecOptions & { stdin?: string } = {}): AsyncGenerator<ExecEvent> {
    return execEvents(this.t, this.id, execRequest(cmd, o, o.stdin), o.signal)
  }

  /**
   * Starts a command with streaming stdin, stdout and stderr (the upgraded
   * exec stream): write to it, read its output as it comes, signal it.
   */
  spawn(cmd: Command | ExecRequest, o: SpawnOptions = {}): Promise<ExecProcess> {
    return spawn(this.t, this.id, execRequest(cmd, o), o)
  }

  /**
   * Runs a command over the streaming path, feeding it `stdin` and
   * collecting its output; resolves with the exit status and the output.
   */
  async run(cmd: Command | ExecRequest, o: RunOptions = {}): Promise<RunResult> {
    const p = await this.spawn(cmd, { ...o, stdin: o.stdin ?? '' })
    if (o.onStdout) p.stdout.on('data', o.onStdout)
    if (o.onStderr) p.stderr.on('data', o.onStderr)
    return p.output()
  }

  /**
   * Opens a raw TCP stream to a port inside the VM through the server (no
   * port is opened on the host). end() half-closes it.
   */
  async connect(port: number, o: CallOptions = {}): Promise<Duplex> {
    const up = await this.t.upgrade('GET', this.path(`/tcp/${port}`), 'agentvm-tcp', { signal: o.signal })
    if (up.head.length) up.socket.unshift(up.head)
    return up.socket
  }
}
