// A VM's event log: who did what, when (lifecycle, exec, terminals, SSH,
// services, policies), listed or followed as it happens.
import { type CallOptions, type Transport, lines, seg } from './http.js'
import type { Event } from './types.js'

export interface EventListOptions extends CallOptions {
  /** Only events with a larger seq (0: from the start). */
  after?: number
  /** At most this many (1..10000, default 1000). */
  limit?: number
}

/** The events of one VM (also of a VM that is gone, by its id). */
export class Events {
  /** @internal */
  constructor(
    private readonly t: Transport,
    private readonly vm: string,
  ) {}

  private get path(): string {
    return `/v1/vms/${seg(this.vm)}/events`
  }

  async list(o: EventListOptions = {}): Promise<Event[]> {
    const r = await this.t.json<{ events?: Event[] }>('GET', this.path, { query: { after: o.after, limit: o.limit }, signal: o.signal })
    return r.events ?? []
  }

  /**
   * Yields the events after `after` and then each new one as it happens,
   * until the signal aborts or the loop is left (either closes the stream
   * without an error).
   */
  async *follow(o: CallOptions & { after?: number } = {}): AsyncGenerator<Event> {
    const ac = new AbortController()
    const onAbort = () => ac.abort(o.signal?.reason)
    if (o.signal?.aborted) return
    o.signal?.addEventListener('abort', onAbort, { once: true })
    try {
      const resp = await this.t.fetch('GET', this.path, { query: { follow: true, after: o.after ?? 0 }, signal: ac.signal })
      for await (const line of lines(resp)) {
        if (line.trim() !== '') yield JSON.parse(line) as Event
      }
    } catch (err) {
      // The caller's abort ends the stream; that is the normal way out.
      if (!o.signal?.aborted) throw err
    } finally {
      o.signal?.removeEventListener('abort', onAbort)
      ac.abort()
    }
  }
}
