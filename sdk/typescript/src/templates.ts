// Templates built from a Dockerfile or a spec (agentvm template build):
// build with the progress as it happens, list, get, delete, prune.
import { AgentVMError } from './errors.js'
import { type BodySource, type CallOptions, type Transport, lines, seg } from './http.js'
import type { BuildEvent, BuiltTemplate } from './types.js'

/** Options of a build. The context is a tar of the build context. */
export interface BuildOptions extends CallOptions {
  /** The Dockerfile's path in the context (default `Dockerfile`). */
  dockerfile?: string
  /** Or a spec's (TOML or JSON) path in the context, instead of a Dockerfile. */
  spec?: string
  buildArgs?: Record<string, string>
  /** Run every step again. */
  noCache?: boolean
  cpus?: number
  /** e.g. `512M`, `2G` (default 1024 MiB). */
  memory?: string
  /** e.g. `16G` (default 8 GiB). */
  disk?: string
  /** How long the start command may take to be ready, e.g. `90s` (default 5m). */
  readyTimeout?: string
  /** The whole build's time limit, e.g. `30m` (default 2h). */
  timeout?: string
  /** Also tag the build `name:tag` for each (a name of the form `name:tag` is one more). */
  tags?: string[]
  /** A login to the registry of an OCI base (`FROM registry.example.com/team/app:tag`), used for that pull only. */
  registryAuth?: { username: string; password: string }
  /** Each step's heading and each line of output, as they happen. */
  onEvent?: (e: BuildEvent) => void
}

/** A build that failed: for a failed step, its number, line, exit code and last output. */
export class BuildError extends AgentVMError {
  readonly step?: number
  readonly line?: number
  readonly exitCode?: number
  readonly output?: string

  constructor(e: NonNullable<BuildEvent['error']>) {
    super(200, e.code ?? 'build_failed', e.message ?? 'the build failed')
    this.step = e.step
    this.line = e.line
    this.exitCode = e.exit_code
    this.output = e.output
  }
}

/** Templates (admin only); a VM made with `vms.create({ template })` starts with its start command running. */
export class Templates {
  /** @internal */
  constructor(private readonly t: Transport) {}

  /**
   * Builds (or rebuilds) the template `name` and resolves to it once it is
   * saved; unchanged steps come from the cache. Rejects with a
   * `BuildError` when a step, the start command or its ready check fails.
   */
  async build(name: string, context: BodySource, o: BuildOptions = {}): Promise<BuiltTemplate> {
    const query = {
      dockerfile: o.dockerfile,
      spec: o.spec,
      build_arg: Object.entries(o.buildArgs ?? {}).map(([k, v]) => `${k}=${v}`),
      no_cache: o.noCache ? 'true' : undefined,
      cpus: o.cpus === undefined ? undefined : String(o.cpus),
      memory: o.memory,
      disk: o.disk,
      ready_timeout: o.readyTimeout,
      timeout: o.timeout,
      tag: o.tags ?? [],
    }
    const headers: Record<string, string> = { 'Content-Type': 'application/x-tar' }
    if (o.registryAuth) {
      headers['X-Agentvm-Registry-Auth'] = Buffer.from(`${o.registryAuth.username}:${o.registryAuth.password}`).toString('base64')
    }
    const resp = await this.t.fetch('POST', '/v1/templates/' + seg(name) + '/build', {
      raw: context,
      query,
      headers,
      signal: o.signal,
    })
    for await (const line of lines(resp)) {
      if (!line) continue
      const e = JSON.parse(line) as BuildEvent
      if (e.template) return e.template
      if (e.error) throw new BuildError(e.error)
      o.onEvent?.(e)
    }
    throw new AgentVMError(0, 'stream_lost', 'the build stream ended before its result (the server stopped?)')
  }

  /** Lists templates, by name. */
  async list(o: CallOptions = {}): Promise<BuiltTemplate[]> {
    return (await this.t.json<{ templates?: BuiltTemplate[] }>('GET', '/v1/templates', o)).templates ?? []
  }

  /** A template, with its Dockerfile and its last build's log. */
  get(name: string, o: CallOptions = {}): Promise<BuiltTemplate> {
    return this.t.json('GET', '/v1/templates/' + seg(name), o)
  }

  /**
   * Tags the build `ref` (`name`, its latest, or `name:tag`): `name:tag`
   * then restores it, whatever `name` is built as later. A tag on another
   * build moves; `latest` makes the build `name`'s latest.
   */
  tag(ref: string, tags: string[], o: CallOptions = {}): Promise<BuiltTemplate> {
    return this.t.json('POST', '/v1/templates/' + seg(ref) + '/tags', { body: { tags }, ...o })
  }

  /** Removes a template (`name:tag`: that tag only) and the cached steps nothing else uses (VMs made from it keep running). */
  delete(name: string, o: CallOptions = {}): Promise<void> {
    return this.t.json('DELETE', '/v1/templates/' + seg(name), o)
  }

  /** Removes the cached steps no template uses; resolves to how many. */
  async prune(o: CallOptions = {}): Promise<number> {
    return (await this.t.json<{ removed?: number }>('POST', '/v1/templates/prune', o)).removed ?? 0
  }
}
