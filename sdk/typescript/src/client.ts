// The client: one agentvm server, with its resources (VMs, snapshots,
// tokens, networks, domains) and server-wide calls.
import { type CallOptions, type ClientOptions, Transport, seg } from './http.js'
import { Domains } from './ports.js'
import { Repos } from './repos.js'
import { Templates } from './templates.js'
import type {
  CreateNetworkRequest,
  CreateTokenRequest,
  CreateVMRequest,
  Egress,
  Health,
  NetworkInfo,
  Snapshot,
  SSHInfo,
  Token,
  VMInfo,
} from './types.js'
import { VM } from './vm.js'

/** VMs: create, list, open. */
export class VMs {
  /** @internal */
  constructor(private readonly t: Transport) {}

  /**
   * Creates a VM and resolves once it is running. `from` creates it from a
   * snapshot; `idempotencyKey` (or `idempotency_key`) makes a retry return
   * the VM the first call created.
   */
  async create(req: CreateVMRequest = {}, o: CallOptions & { idempotencyKey?: string } = {}): Promise<VM> {
    const headers: Record<string, string> = o.idempotencyKey ? { 'Idempotency-Key': o.idempotencyKey } : {}
    const v = await this.t.json<VMInfo>('POST', '/v1/vms', { body: req, headers, signal: o.signal })
    return new VM(this.t, v)
  }

  /** Lists VMs, oldest first; labels filter ("key=value" or "key", all must match). */
  async list(o: CallOptions & { labels?: string[] | Record<string, string> } = {}): Promise<VM[]> {
    const labels = Array.isArray(o.labels) ? o.labels : Object.entries(o.labels ?? {}).map(([k, v]) => (v === '' ? k : `${k}=${v}`))
    const r = await this.t.json<{ vms?: VMInfo[] }>('GET', '/v1/vms', { query: { label: labels }, signal: o.signal })
    return (r.vms ?? []).map((v) => new VM(this.t, v))
  }

  /** Fetches a VM by id or name. */
  async get(idOrName: string, o: CallOptions = {}): Promise<VM> {
    const v = await this.t.json<VMInfo>('GET', '/v1/vms/' + seg(idOrName), o)
    return new VM(this.t, v)
  }

  /** A handle for a VM by id or name, without a request (what a scoped token needs). */
  open(idOrName: string): VM {
    return new VM(this.t, idOrName)
  }

  /** Deletes a VM by id or name. */
  delete(idOrName: string, o: CallOptions = {}): Promise<void> {
    return this.t.json('DELETE', '/v1/vms/' + seg(idOrName), o)
  }
}

/** Snapshots (taken with `vm.snapshot()`; restored with `vms.create({ from })`). */
export class Snapshots {
  /** @internal */
  constructor(private readonly t: Transport) {}

  async list(o: CallOptions = {}): Promise<Snapshot[]> {
    return (await this.t.json<{ snapshots?: Snapshot[] }>('GET', '/v1/snapshots', o)).snapshots ?? []
  }

  get(idOrName: string, o: CallOptions = {}): Promise<Snapshot> {
    return this.t.json('GET', '/v1/snapshots/' + seg(idOrName), o)
  }

  delete(idOrName: string, o: CallOptions = {}): Promise<void> {
    return this.t.json('DELETE', '/v1/snapshots/' + seg(idOrName), o)
  }
}

/** Scoped tokens (admin only). */
export class Tokens {
  /** @internal */
  constructor(private readonly t: Transport) {}

  /** Issues a token; its secret is in `token` (only in this answer). */
  create(req: CreateTokenRequest, o: CallOptions = {}): Promise<Token> {
    return this.t.json('POST', '/v1/tokens', { body: req, ...o })
  }

  /** Lists live tokens (without secrets), of one VM when vm is given. */
  async list(o: CallOptions & { vm?: string } = {}): Promise<Token[]> {
    return (await this.t.json<{ tokens?: Token[] }>('GET', '/v1/tokens', { query: { vm: o.vm }, signal: o.signal })).tokens ?? []
  }

  /** Revokes a token; what it has open is closed. */
  revoke(id: string, o: CallOptions = {}): Promise<void> {
    return this.t.json('DELETE', '/v1/tokens/' + seg(id), o)
  }
}

/** Private networks (admin only). */
export class Networks {
  /** @internal */
  constructor(private readonly t: Transport) {}

  create(req: CreateNetworkRequest, o: CallOptions = {}): Promise<NetworkInfo> {
    return this.t.json('POST', '/v1/networks', { body: req, ...o })
  }

  async list(o: CallOptions = {}): Promise<NetworkInfo[]> {
    return (await this.t.json<{ networks?: NetworkInfo[] }>('GET', '/v1/networks', o)).networks ?? []
  }

  get(name: string, o: CallOptions = {}): Promise<NetworkInfo> {
    return this.t.json('GET', '/v1/networks/' + seg(name), o)
  }

  /** Deletes an empty network (409 while VMs are on it). */
  delete(name: string, o: CallOptions = {}): Promise<void> {
    return this.t.json('DELETE', '/v1/networks/' + seg(name), o)
  }

  /** Sets the network's egress policy (its VMs without their own follow it). */
  setEgress(name: string, egress: Egress, o: CallOptions = {}): Promise<NetworkInfo> {
    return this.t.json('POST', '/v1/networks/' + seg(name) + '/egress', { body: egress, ...o })
  }
}

/**
 * The agentvm client. Without options it uses AGENTVM_URL (default
 * http://127.0.0.1:7070) and AGENTVM_TOKEN, else the admin token in the
 * data dir, as the CLI does.
 *
 * ```ts
 * const av = new AgentVM()
 * const vm = await av.vms.create({ name: 'box1' })
 * const r = await vm.exec('uname -a')
 * ```
 */
export class AgentVM {
  readonly vms: VMs
  readonly snapshots: Snapshots
  readonly templates: Templates
  /** Hosted git repositories. */
  readonly repos: Repos
  readonly tokens: Tokens
  readonly networks: Networks
  readonly domains: Domains
  /** @internal */
  readonly transport: Transport

  constructor(o: ClientOptions = {}) {
    this.transport = new Transport(o)
    this.vms = new VMs(this.transport)
    this.snapshots = new Snapshots(this.transport)
    this.templates = new Templates(this.transport)
    this.repos = new Repos(this.transport)
    this.tokens = new Tokens(this.transport)
    this.networks = new Networks(this.transport)
    this.domains = new Domains(this.transport)
  }

  /** The server URL. */
  get url(): string {
    return this.transport.url
  }

  /** A VM handle by id or name, without a request. */
  vm(idOrName: string): VM {
    return this.vms.open(idOrName)
  }

  /** Checks the server (no token needed). */
  health(o: CallOptions = {}): Promise<Health> {
    return this.transport.json('GET', '/v1/health', o)
  }

  /** The SSH gateway's address and host key. */
  ssh(o: CallOptions = {}): Promise<SSHInfo> {
    return this.transport.json('GET', '/v1/ssh', o)
  }

  /** Prometheus metrics (admin token). */
  metrics(o: CallOptions = {}): Promise<string> {
    return this.transport.text('GET', '/metrics', o)
  }

  /** The PEM certificate of the server's local CA (serve --tls auto). */
  ca(o: CallOptions = {}): Promise<string> {
    return this.transport.text('GET', '/v1/tls/ca', o)
  }
}
