// Terminals: named PTY sessions owned by the guest agent, which keep running
// with nobody attached; attaching is a WebSocket (binary messages carry the
// terminal's bytes, text messages JSON control messages).
import { type CallOptions, type Transport, encodeQuery, seg } from './http.js'
import type { TermControl, TermCreate, TermInfo } from './types.js'
import { type WSConnection, openWebSocket } from './websocket.js'

/** Options of attach. */
export interface AttachOptions extends CallOptions {
  /** Resize on attach (both must be set). */
  cols?: number
  rows?: number
  /** false skips the replay of earlier output. */
  scrollback?: boolean
}

/**
 * An attached terminal. Read its output with `read()` or `for await`; the
 * earlier output (scrollback) comes first. The output ends when the program
 * exits (see `exit`) or the connection is closed; `close()` detaches and
 * leaves the program running.
 */
export class Terminal implements AsyncIterable<Uint8Array> {
  /** The exit message, once the program exited. */
  exit: TermControl | null = null
  private ws!: WSConnection
  private queue: Buffer[] = []
  private waiters: Array<(b: Buffer | null) => void> = []
  private ended = false

  /** @internal */
  static async open(t: Transport, path: string, o: AttachOptions): Promise<Terminal> {
    const term = new Terminal()
    term.ws = await openWebSocket(
      t,
      path,
      {
        message: (data, binary) => term.onMessage(data, binary),
        close: () => term.onEnd(),
      },
      o.signal,
    )
    return term
  }

  private onMessage(data: Buffer, binary: boolean) {
    if (!binary) {
      try {
        const c = JSON.parse(data.toString('utf8')) as TermControl
        if (c.type === 'exit') this.exit = c
      } catch {
        // not a control message: ignored
      }
      return
    }
    const w = this.waiters.shift()
    if (w) w(data)
    else this.queue.push(data)
  }

  private onEnd() {
    this.ended = true
    for (const w of this.waiters.splice(0)) w(null)
  }

  /** The next chunk of output; null once the output has ended. */
  read(): Promise<Uint8Array | null> {
    const b = this.queue.shift()
    if (b) return Promise.resolve(b)
    if (this.ended) return Promise.resolve(null)
    return new Promise((r) => this.waiters.push(r))
  }

  async *[Symbol.asyncIterator](): AsyncIterator<Uint8Array> {
    for (;;) {
      const b = await this.read()
      if (b === null) return
      yield b
    }
  }

  /** Sends input (keystrokes) to the terminal. */
  write(data: string | Uint8Array): Promise<void> {
    return this.ws.send(typeof data === 'string' ? Buffer.from(data) : data, true)
  }

  /** Sets the terminal size. */
  resize(cols: number, rows: number): Promise<void> {
    return this.ws.send(JSON.stringify({ type: 'resize', cols, rows }), false)
  }

  /** Sends a signal ("INT", "TERM", ...) to the foreground process group. */
  signal(sig: string): Promise<void> {
    return this.ws.send(JSON.stringify({ type: 'signal', signal: sig }), false)
  }

  /** True while attached. */
  get attached(): boolean {
    return this.ws.isOpen
  }

  /** Detaches; the program keeps running in the VM. */
  close(): Promise<void> {
    return this.ws.close(1000, 'detach')
  }

  /** Resolves once the connection is gone (detached, or the program exited). */
  get closed(): Promise<void> {
    return this.ws.done
  }
}

/** A VM's terminal sessions. */
export class Terminals {
  /** @internal */
  constructor(
    private readonly t: Transport,
    private readonly vm: string,
  ) {}

  private path(name?: string, rest = ''): string {
    return `/v1/vms/${seg(this.vm)}/terminals` + (name === undefined ? '' : '/' + seg(name) + rest)
  }

  async list(o: CallOptions = {}): Promise<TermInfo[]> {
    const r = await this.t.json<{ terminals?: TermInfo[] }>('GET', this.path(), o)
    return r.terminals ?? []
  }

  /** Starts a session: argv (default the user's login shell) on a PTY. */
  create(req: TermCreate = {}, o: CallOptions = {}): Promise<TermInfo> {
    return this.t.json('POST', this.path(), { body: req, ...o })
  }

  get(name: string, o: CallOptions = {}): Promise<TermInfo> {
    return this.t.json('GET', this.path(name), o)
  }

  /** Ends a session (SIGHUP, then SIGKILL) and removes it. */
  kill(name: string, o: CallOptions = {}): Promise<void> {
    return this.t.json('DELETE', this.path(name), o)
  }

  resize(name: string, cols: number, rows: number, o: CallOptions = {}): Promise<void> {
    return this.t.json('POST', this.path(name, '/resize'), { body: { cols, rows }, ...o })
  }

  /** Sends a signal ("INT", "TERM", "9"...) to the foreground process group. */
  signal(name: string, sig: string, o: CallOptions = {}): Promise<void> {
    return this.t.json('POST', this.path(name, '/signal'), { body: { signal: sig }, ...o })
  }

  /** Attaches to a session over a WebSocket. */
  attach(name: string, o: AttachOptions = {}): Promise<Terminal> {
    const q = encodeQuery({
      cols: o.cols && o.rows ? o.cols : undefined,
      rows: o.cols && o.rows ? o.rows : undefined,
      scrollback: o.scrollback === false ? '0' : undefined,
    })
    return Terminal.open(this.t, this.path(name) + q, o)
  }
}
