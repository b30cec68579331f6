// Exec in its three shapes: buffered (one ExecResult), NDJSON events as
// they are produced, and the upgraded frame stream with stdin (ExecProcess).
import { Readable } from 'node:stream'
import { AgentVMError } from './errors.js'
import {
  FrameDecoder,
  FrameError,
  FrameExit,
  FrameSignal,
  FrameStderr,
  FrameStdin,
  FrameStdinEOF,
  FrameStdout,
  encodeFrame,
} from './frames.js'
import { type CallOptions, type Transport, type Upgraded, lines, seg } from './http.js'
import type { ExecEvent, ExecRequest, ExecResult, ExitStatus } from './types.js'

/** A command: a shell command line (string) or an argv (array, no shell). */
export type Command = string | string[]

/** Options of exec calls: the ExecRequest fields besides the command. */
export interface ExecOptions extends CallOptions {
  env?: Record<string, string>
  /** Absolute working directory. */
  cwd?: string
  /** Guest user to run as (default root, or the token's user). */
  user?: string
  /** Kill the command after this long: seconds, or a Go duration such as "30s". */
  timeout?: number | string
}

/** Signals by name, numbered as on Linux (the guest's numbering). */
const signalNumbers: Record<string, number> = {
  HUP: 1, INT: 2, QUIT: 3, ILL: 4, TRAP: 5, ABRT: 6, BUS: 7, FPE: 8, KILL: 9, USR1: 10, SEGV: 11,
  USR2: 12, PIPE: 13, ALRM: 14, TERM: 15, STKFLT: 16, CHLD: 17, CONT: 18, STOP: 19, TSTP: 20,
  TTIN: 21, TTOU: 22, URG: 23, XCPU: 24, XFSZ: 25, VTALRM: 26, PROF: 27, WINCH: 28, IO: 29, PWR: 30, SYS: 31,
}

/** A signal: a number, or a name with or without "SIG" ("TERM", "SIGINT"). */
export type Signal = number | string

export function signalNumber(sig: Signal): number {
  if (typeof sig === 'number') return sig
  const name = sig.toUpperCase().replace(/^SIG/, '')
  const n = /^\d+$/.test(name) ? Number(name) : signalNumbers[name]
  if (!n) throw new TypeError(`unknown signal ${sig}`)
  return n
}

export function execRequest(cmd: Command | ExecRequest, o: ExecOptions = {}, stdin?: string): ExecRequest {
  const req: ExecRequest = typeof cmd === 'string' ? { shell: cmd } : Array.isArray(cmd) ? { cmd } : { ...cmd }
  if (o.env !== undefined) req.env = o.env
  if (o.cwd !== undefined) req.cwd = o.cwd
  if (o.user !== undefined) req.user = o.user
  if (o.timeout !== undefined) req.timeout = o.timeout
  if (stdin !== undefined) req.stdin = stdin
  return req
}

const execPath = (vm: string) => `/v1/vms/${seg(vm)}/exec`

/** Runs a command and returns its buffered output once it exits. */
export function execBuffered(t: Transport, vm: string, req: ExecRequest, signal?: AbortSignal): Promise<ExecResult> {
  return t.json<ExecResult>('POST', execPath(vm), { body: req, signal })
}

/** Runs a command and yields its NDJSON events (stdout, stderr, error, exit) as produced. */
export async function* execEvents(t: Transport, vm: string, req: ExecRequest, signal?: AbortSignal): AsyncGenerator<ExecEvent> {
  const resp = await t.fetch('POST', execPath(vm), { body: req, signal, headers: { Accept: 'application/x-ndjson' } })
  for await (const line of lines(resp)) {
    if (line.trim() !== '') yield JSON.parse(line) as ExecEvent
  }
}

/** Options of spawn. */
export interface SpawnOptions extends ExecOptions {
  /**
   * Input written to the command, then closed. Without it stdin stays open:
   * write with `write()` and close with `end()`.
   */
  stdin?: string | Uint8Array | AsyncIterable<string | Uint8Array> | ReadableStream<Uint8Array>
}

/**
 * A running command over the upgraded exec stream: stdin in, stdout and
 * stderr out as produced (Node Readables, buffered until read), and its exit.
 */
export class ExecProcess {
  /** The command's stdout. */
  readonly stdout: Readable
  /** The command's stderr; guest-reported errors (e.g. "command not found") are added as lines. */
  readonly stderr: Readable
  /** Guest-reported error messages. */
  readonly errors: string[] = []
  private readonly socket: Upgraded['socket']
  private readonly decoder = new FrameDecoder()
  private readonly exited: Promise<ExitStatus>
  private status: ExitStatus | undefined
  private settle!: (s: ExitStatus | Error) => void

  /** @internal */
  constructor(up: Upgraded, signal?: AbortSignal) {
    this.socket = up.socket
    this.stdout = new Readable({ read() {} })
    this.stderr = new Readable({ read() {} })
    this.exited = new Promise<ExitStatus>((resolve, reject) => {
      this.settle = (s) => {
        this.settle = () => {}
        this.stdout.push(null)
        this.stderr.push(null)
        signal?.removeEventListener('abort', onAbort)
        if (s instanceof Error) reject(s)
        else resolve(s)
      }
    })
    // A caller that never waits must not see an unhandled rejection.
    this.exited.catch(() => {})
    const onAbort = () => this.kill()
    signal?.addEventListener('abort', onAbort, { once: true })
    this.socket.on('data', (b: Buffer) => this.onData(b))
    this.socket.on('error', () => {}) // reported through close
    this.socket.on('close', () => {
      if (this.status) return
      const last = this.errors.length ? ': ' + this.errors[this.errors.length - 1] : ''
      this.settle(new AgentVMError(0, 'stream_lost', 'exec stream ended before the command exited' + last))
    })
    if (up.head.length) this.onData(up.head)
  }

  private onData(b: Buffer) {
    let frames
    try {
      frames = this.decoder.push(b)
    } catch (err) {
      this.socket.destroy()
      this.settle(new AgentVMError(0, 'stream_lost', (err as Error).message))
      return
    }
    for (const f of frames) {
      switch (f.type) {
        case FrameStdout:
          this.stdout.push(f.data)
          break
        case FrameStderr:
          this.stderr.push(f.data)
          break
        case FrameError: {
          let msg = ''
          try {
            msg = JSON.parse(f.data.toString('utf8')).message ?? ''
          } catch {
            msg = f.data.toString('utf8')
          }
          if (msg) {
            this.errors.push(msg)
            this.stderr.push(Buffer.from(msg + '\n'))
          }
          break
        }
        case FrameExit:
          try {
            this.status = JSON.parse(f.data.toString('utf8')) as ExitStatus
            this.settle(this.status)
          } catch (err) {
            this.settle(new AgentVMError(0, 'stream_lost', 'exec: bad exit frame: ' + (err as Error).message))
          }
          this.socket.end()
          return
      }
    }
  }

  private send(type: number, payload?: Uint8Array): Promise<void> {
    return new Promise((resolve, reject) => {
      if (this.socket.destroyed || !this.socket.writable) {
        reject(new AgentVMError(0, 'stream_lost', 'exec stream is closed'))
        return
      }
      this.socket.write(encodeFrame(type, payload), (err) => (err ? reject(err) : resolve()))
    })
  }

  /** Writes to the command's stdin (in frames of at most 64 KiB). */
  async write(data: string | Uint8Array): Promise<void> {
    const b = typeof data === 'string' ? Buffer.from(data) : data
    for (let off = 0; off < b.length; off += 64 << 10) {
      await this.send(FrameStdin, b.subarray(off, Math.min(off + (64 << 10), b.length)))
    }
  }

  /** Writes data if given, then closes the command's stdin. */
  async end(data?: string | Uint8Array): Promise<void> {
    if (data !== undefined) await this.write(data)
    await this.send(FrameStdinEOF)
  }

  /** Sends a signal to the command's process group. */
  signal(sig: Signal): Promise<void> {
    return this.send(FrameSignal, Buffer.from(String(signalNumber(sig))))
  }

  /** Closes the stream; a command still running is killed by the guest. */
  kill(): void {
    this.socket.destroy()
  }

  /** The exit status, once the command exited. */
  get exitStatus(): ExitStatus | undefined {
    return this.status
  }

  /**
   * Resolves to the exit status when the command exits (a non-zero exit is
   * not an error); rejects with code stream_lost if the stream ends first.
   */
  wait(): Promise<ExitStatus> {
    return this.exited
  }

  /** Reads stdout and stderr to their end and waits for the exit. */
  async output(): Promise<RunResult> {
    const [stdout, stderr] = await Promise.all([collect(this.stdout), collect(this.stderr)])
    const st = await this.exited
    return { ...st, stdout, stderr }
  }
}

/** The result of run: the exit status with the whole output. */
export type RunResult = ExitStatus & { stdout: string; stderr: string }

// Listens with 'data' rather than iterating, so other 'data' listeners
// (run's onStdout and onStderr) see the same chunks.
function collect(r: Readable): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = []
    r.on('data', (c: Buffer) => chunks.push(c))
    r.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')))
    r.on('error', reject)
  })
}

/** Starts a command over the upgraded exec stream. */
export async function spawn(t: Transport, vm: string, req: ExecRequest, o: SpawnOptions = {}): Promise<ExecProcess> {
  const up = await t.upgrade('POST', execPath(vm), 'agentvm-exec', { body: req, signal: o.signal })
  const p = new ExecProcess(up, o.signal)
  if (o.stdin !== undefined) feed(p, o.stdin)
  return p
}

function feed(p: ExecProcess, src: NonNullable<SpawnOptions['stdin']>) {
  const go = async () => {
    if (typeof src === 'string' || src instanceof Uint8Array) return p.end(src)
    const it: AsyncIterable<string | Uint8Array> =
      typeof (src as ReadableStream).getReader === 'function' ? iterateStream(src as ReadableStream<Uint8Array>) : (src as AsyncIterable<string | Uint8Array>)
    for await (const c of it) await p.write(c)
    await p.end()
  }
  // A command that exits before reading all of its input ends the stream:
  // that is not the caller's error, so it is dropped here.
  go().catch(() => {})
}

async function* iterateStream(s: ReadableStream<Uint8Array>): AsyncGenerator<Uint8Array> {
  const r = s.getReader()
  try {
    for (;;) {
      const { value, done } = await r.read()
      if (done) return
      yield value
    }
  } finally {
    r.releaseLock()
  }
}
