// Exposed ports of a VM (HTTP preview URLs through the preview proxy, or
// host TCP ports) and custom domains mapped to VM ports.
import { type CallOptions, type Transport, seg } from './http.js'
import type { Domain, ExposeRequest, Port } from './types.js'

/** A VM's exposed ports. */
export class Ports {
  /** @internal */
  constructor(
    private readonly t: Transport,
    private readonly vm: string,
  ) {}

  private path(rest = ''): string {
    return `/v1/vms/${seg(this.vm)}/ports${rest}`
  }

  /**
   * Exposes a port: an HTTP preview URL (`url` in the answer; `public`
   * answers without a token), or with `tcp` a host TCP port (`host`).
   */
  expose(req: ExposeRequest | number, o: CallOptions = {}): Promise<Port> {
    return this.t.json('POST', this.path(), { body: typeof req === 'number' ? { port: req } : req, ...o })
  }

  async list(o: CallOptions = {}): Promise<Port[]> {
    return (await this.t.json<{ ports?: Port[] }>('GET', this.path(), o)).ports ?? []
  }

  /** Removes an exposure of kind http (default) or tcp. */
  unexpose(port: number, kind: 'http' | 'tcp' = 'http', o: CallOptions = {}): Promise<void> {
    return this.t.json('DELETE', this.path('/' + port), { query: { kind }, ...o })
  }
}

/** Custom host names mapped to VM ports through the preview proxy. */
export class Domains {
  /** @internal */
  constructor(private readonly t: Transport) {}

  add(d: Domain, o: CallOptions = {}): Promise<Domain> {
    return this.t.json('POST', '/v1/domains', { body: d, ...o })
  }

  async list(o: CallOptions = {}): Promise<Domain[]> {
    return (await this.t.json<{ domains?: Domain[] }>('GET', '/v1/domains', o)).domains ?? []
  }

  delete(domain: string, o: CallOptions = {}): Promise<void> {
    return this.t.json('DELETE', '/v1/domains/' + seg(domain), o)
  }
}
