// Supervision inside a VM: systemd services, processes and detached jobs
// (execs whose output is kept in the VM).
import { type Command, type ExecOptions, type Signal, execRequest } from './exec.js'
import { type CallOptions, type Transport, lines, seg } from './http.js'
import type { ExecRequest, JobInfo, ProcessInfo, ServiceCreate, ServiceInfo } from './types.js'

const vmPath = (vm: string, rest: string) => `/v1/vms/${seg(vm)}${rest}`

/** A VM's services (systemd units agentvm-NAME.service). */
export class Services {
  /** @internal */
  constructor(
    private readonly t: Transport,
    private readonly vm: string,
  ) {}

  private path(name?: string, rest = ''): string {
    return vmPath(this.vm, '/services' + (name === undefined ? '' : '/' + seg(name) + rest))
  }

  /** Creates a service; by default it is enabled and started. */
  create(req: ServiceCreate, o: CallOptions = {}): Promise<ServiceInfo> {
    return this.t.json('POST', this.path(), { body: req, ...o })
  }

  async list(o: CallOptions = {}): Promise<ServiceInfo[]> {
    return (await this.t.json<{ services?: ServiceInfo[] }>('GET', this.path(), o)).services ?? []
  }

  get(name: string, o: CallOptions = {}): Promise<ServiceInfo> {
    return this.t.json('GET', this.path(name), o)
  }

  start(name: string, o: CallOptions = {}): Promise<ServiceInfo> {
    return this.t.json('POST', this.path(name, '/start'), o)
  }

  stop(name: string, o: CallOptions = {}): Promise<ServiceInfo> {
    return this.t.json('POST', this.path(name, '/stop'), o)
  }

  restart(name: string, o: CallOptions = {}): Promise<ServiceInfo> {
    return this.t.json('POST', this.path(name, '/restart'), o)
  }

  /** Stops, disables and removes a service. */
  delete(name: string, o: CallOptions = {}): Promise<void> {
    return this.t.json('DELETE', this.path(name), o)
  }

  /** The last lines of the service's journal. */
  logs(name: string, o: CallOptions & { lines?: number } = {}): Promise<string> {
    return this.t.text('GET', this.path(name, '/logs'), { query: { lines: o.lines }, signal: o.signal })
  }

  /**
   * Follows the journal: the last lines, then new lines as they are
   * written, until the signal aborts or the loop is left (either ends the
   * stream without an error).
   */
  async *follow(name: string, o: CallOptions & { lines?: number } = {}): AsyncGenerator<string> {
    const ac = new AbortController()
    const onAbort = () => ac.abort(o.signal?.reason)
    if (o.signal?.aborted) return
    o.signal?.addEventListener('abort', onAbort, { once: true })
    try {
      const resp = await this.t.fetch('GET', this.path(name, '/logs'), { query: { lines: o.lines, follow: true }, signal: ac.signal })
      yield* lines(resp)
    } catch (err) {
      // The caller's abort ends the stream; that is the normal way out.
      if (!o.signal?.aborted) throw err
    } finally {
      o.signal?.removeEventListener('abort', onAbort)
      ac.abort()
    }
  }
}

/** The processes of a VM. */
export class Processes {
  /** @internal */
  constructor(
    private readonly t: Transport,
    private readonly vm: string,
  ) {}

  async list(o: CallOptions = {}): Promise<ProcessInfo[]> {
    return (await this.t.json<{ processes?: ProcessInfo[] }>('GET', vmPath(this.vm, '/processes'), o)).processes ?? []
  }

  /** Sends a signal ("TERM", "KILL", 9...) to a process (pid 1 and the agent are refused). */
  signal(pid: number, sig: Signal = 'TERM', o: CallOptions = {}): Promise<void> {
    return this.t.json('POST', vmPath(this.vm, `/processes/${pid}/signal`), { body: { signal: String(sig) }, ...o })
  }
}

/** Options of Jobs.logs and Jobs.stream. */
export interface JobLogOptions extends CallOptions {
  /** stdout (default), stderr or both. */
  stream?: 'stdout' | 'stderr' | 'both'
  /** Start at this byte. */
  offset?: number
  /** Keep reading until the job exits. */
  follow?: boolean
}

/** Detached execs of a VM: they outlive the client, their output is kept in the VM. */
export class Jobs {
  /** @internal */
  constructor(
    private readonly t: Transport,
    private readonly vm: string,
  ) {}

  private path(id?: string, rest = ''): string {
    return vmPath(this.vm, '/jobs' + (id === undefined ? '' : '/' + seg(id) + rest))
  }

  /** Starts a command as a job. */
  start(cmd: Command | ExecRequest, o: ExecOptions = {}): Promise<JobInfo> {
    return this.t.json('POST', this.path(), { body: execRequest(cmd, o), signal: o.signal })
  }

  async list(o: CallOptions = {}): Promise<JobInfo[]> {
    return (await this.t.json<{ jobs?: JobInfo[] }>('GET', this.path(), o)).jobs ?? []
  }

  get(id: string, o: CallOptions = {}): Promise<JobInfo> {
    return this.t.json('GET', this.path(id), o)
  }

  /** A job's output as a stream (with follow, until the job exits). */
  async stream(id: string, o: JobLogOptions = {}): Promise<ReadableStream<Uint8Array>> {
    const resp = await this.t.fetch('GET', this.path(id, '/logs'), {
      query: { stream: o.stream, offset: o.offset || undefined, follow: o.follow },
      signal: o.signal,
    })
    return resp.body ?? new ReadableStream({ start: (c) => c.close() })
  }

  /** A job's output as text (with follow, once the job exited). */
  logs(id: string, o: JobLogOptions = {}): Promise<string> {
    return this.t.text('GET', this.path(id, '/logs'), { query: { stream: o.stream, offset: o.offset || undefined, follow: o.follow }, signal: o.signal })
  }

  /** Waits until the job exits (or timeoutMs passes; then it is returned still running). */
  wait(id: string, o: CallOptions & { timeoutMs?: number } = {}): Promise<JobInfo> {
    return this.t.json('POST', this.path(id, '/wait'), { query: { timeout_ms: o.timeoutMs }, signal: o.signal })
  }

  /** Signals every process of the job. */
  signal(id: string, sig: Signal = 'TERM', o: CallOptions = {}): Promise<void> {
    return this.t.json('POST', this.path(id, '/signal'), { body: { signal: String(sig) }, ...o })
  }

  /** Kills the job if it runs and removes it with its output. */
  delete(id: string, o: CallOptions = {}): Promise<void> {
    return this.t.json('DELETE', this.path(id), o)
  }
}
