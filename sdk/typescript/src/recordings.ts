// A VM's recordings (admin only): every terminal session as asciicast v2
// and every exec as a JSON line, kept by the daemon.
import { type CallOptions, type Transport, seg } from './http.js'
import type { Recording } from './types.js'

export class Recordings {
  /** @internal */
  constructor(
    private readonly t: Transport,
    private readonly vm: string,
  ) {}

  private path(rest = ''): string {
    return '/v1/vms/' + seg(this.vm) + '/recordings' + rest
  }

  /** The recordings, oldest first, and whether the VM is recorded. */
  async list(o: CallOptions = {}): Promise<{ enabled: boolean; recordings: Recording[] }> {
    const r = await this.t.json<{ enabled?: boolean; recordings?: Recording[] }>('GET', this.path(), o)
    return { enabled: r.enabled ?? false, recordings: r.recordings ?? [] }
  }

  /** One recording: a terminal's asciicast v2 text, or an exec's JSON line. */
  async get(id: string, o: CallOptions = {}): Promise<string> {
    return (await this.t.fetch('GET', this.path('/' + seg(id)), o)).text()
  }

  /** Every recording and the VM's events as a .tar.gz. */
  async export(o: CallOptions = {}): Promise<Uint8Array> {
    return new Uint8Array(await (await this.t.fetch('GET', this.path('/export'), o)).arrayBuffer())
  }

  /** Turns the VM's recording on or off (kept recordings stay). */
  async setEnabled(enabled: boolean, o: CallOptions = {}): Promise<void> {
    await this.t.json('POST', this.path('/settings'), { body: { enabled }, ...o })
  }
}
