// The HTTP layer. Calls whose answer is read whole (JSON, text) and HTTP
// Upgrade (exec frames, terminal WebSockets, TCP tunnels) go through
// node:http with a keep-alive agent: it costs a third of fetch's CPU per
// call, and fetch cannot hand over a connection. Streamed bodies (file
// uploads and downloads, followed logs and events) use fetch, for web
// streams both ways.
import { readFileSync } from 'node:fs'
import * as http from 'node:http'
import * as https from 'node:https'
import { homedir } from 'node:os'
import { join } from 'node:path'
import type { Duplex } from 'node:stream'
import { AgentVMError, ConnectionError, errorFromBody } from './errors.js'

/** Options of the AgentVM client. */
export interface ClientOptions {
  /** Server URL; default `$AGENTVM_URL`, else http://127.0.0.1:7070. */
  url?: string
  /**
   * API token (admin or scoped); default `$AGENTVM_TOKEN`, else the admin
   * token in `<data dir>/admin.token` when it is readable.
   */
  token?: string
  /** Data dir for the admin token fallback; default `$AGENTVM_DATA_DIR`, else ~/.local/share/agentvm. */
  dataDir?: string
  /** Headers added to every request. */
  headers?: Record<string, string>
}

/** A query string's values; undefined and false are left out, true is "1". */
export type Query = Record<string, string | number | boolean | undefined | null | Array<string>>

/** Per-call options. */
export interface CallOptions {
  /** Aborts the call (and ends a stream it opened). */
  signal?: AbortSignal
}

/** A request body for streaming uploads. */
export type BodySource = string | Uint8Array | ArrayBuffer | Blob | ReadableStream<Uint8Array> | AsyncIterable<Uint8Array | string>

interface RequestInit {
  body?: unknown
  raw?: BodySource
  query?: Query
  headers?: Record<string, string>
  signal?: AbortSignal
}

function defaultToken(dataDir?: string): string {
  if (process.env.AGENTVM_TOKEN) return process.env.AGENTVM_TOKEN
  const dir = dataDir || process.env.AGENTVM_DATA_DIR || join(homedir(), '.local', 'share', 'agentvm')
  try {
    return readFileSync(join(dir, 'admin.token'), 'utf8').trim()
  } catch {
    return ''
  }
}

export function encodeQuery(q?: Query): string {
  if (!q) return ''
  const p = new URLSearchParams()
  for (const [k, v] of Object.entries(q)) {
    if (v === undefined || v === null || v === false) continue
    if (Array.isArray(v)) for (const x of v) p.append(k, x)
    else p.set(k, v === true ? '1' : String(v))
  }
  const s = p.toString()
  return s ? '?' + s : ''
}

/** Escapes one path segment (a VM id or name, a terminal name, ...). */
export const seg = (s: string | number): string => encodeURIComponent(String(s))

/** The connection to one agentvm server. */
export class Transport {
  readonly url: string
  readonly token: string
  private readonly headers: Record<string, string>
  private readonly agent: http.Agent
  private readonly mod: typeof http | typeof https

  constructor(o: ClientOptions = {}) {
    this.url = (o.url || process.env.AGENTVM_URL || 'http://127.0.0.1:7070').replace(/\/+$/, '')
    this.token = o.token ?? defaultToken(o.dataDir)
    this.headers = { ...o.headers }
    if (this.token) this.headers['Authorization'] = 'Bearer ' + this.token
    const tls = this.url.startsWith('https:')
    this.mod = tls ? https : http
    // Idle sockets are unref'd by the agent: they do not keep a process alive.
    this.agent = tls ? new https.Agent({ keepAlive: true }) : new http.Agent({ keepAlive: true })
  }

  private unreachable(err: unknown): AgentVMError {
    const cause = (err as { cause?: { message?: string } })?.cause
    const why = cause?.message || (err as Error)?.message || String(err)
    return new ConnectionError(0, 'connection_failed', `cannot reach agentvm at ${this.url} (is \`agentvm serve\` running?): ${why}`, { cause: err })
  }

  /** Sends a request and returns the response when it is 2xx; throws the API's error otherwise. */
  async fetch(method: string, path: string, init: RequestInit = {}): Promise<Response> {
    const headers: Record<string, string> = { ...this.headers, ...init.headers }
    let body: unknown
    let duplex: 'half' | undefined
    if (init.raw !== undefined) {
      headers['Content-Type'] ??= 'application/octet-stream'
      body = toBody(init.raw)
      if (typeof body === 'object' && body !== null && !(body instanceof Uint8Array) && !(body instanceof Blob)) duplex = 'half'
    } else if (init.body !== undefined) {
      headers['Content-Type'] = 'application/json'
      body = JSON.stringify(init.body)
    }
    let resp: Response
    try {
      resp = await fetch(this.url + path + encodeQuery(init.query), {
        method,
        headers,
        body: body as never,
        signal: init.signal,
        ...(duplex ? { duplex } : {}),
      } as globalThis.RequestInit)
    } catch (err) {
      if ((err as Error)?.name === 'AbortError' || init.signal?.aborted) throw err
      throw this.unreachable(err)
    }
    if (resp.status >= 300) {
      const text = await resp.text().catch(() => '')
      throw errorFromBody(resp.status, text)
    }
    return resp
  }

  /** A JSON call; resolves to the decoded answer (undefined for 204). */
  async json<T>(method: string, path: string, init: RequestInit = {}): Promise<T> {
    let text: string
    if (init.raw !== undefined) {
      const resp = await this.fetch(method, path, init)
      text = await resp.text()
    } else {
      text = await this.call(method, path, init)
    }
    return (text ? JSON.parse(text) : undefined) as T
  }

  /** A call whose answer is text. */
  text(method: string, path: string, init: RequestInit = {}): Promise<string> {
    return this.call(method, path, init)
  }

  /** A request with an optional JSON body whose answer is read whole, over node:http. */
  private call(method: string, path: string, init: RequestInit): Promise<string> {
    const payload = init.body === undefined ? undefined : Buffer.from(JSON.stringify(init.body))
    const headers: Record<string, string> = { ...this.headers, ...init.headers }
    if (payload) {
      headers['Content-Type'] = 'application/json'
      headers['Content-Length'] = String(payload.length)
    }
    const attempt = (retry: boolean) =>
      new Promise<string>((resolve, reject) => {
        const req = this.mod.request(this.url + path + encodeQuery(init.query), { method, headers, agent: this.agent, signal: init.signal }, (res) => {
          const chunks: Buffer[] = []
          res.on('data', (c: Buffer) => chunks.push(c))
          res.on('error', (err) => reject(init.signal?.aborted ? abortError(init.signal) : this.unreachable(err)))
          res.on('end', () => {
            const body = Buffer.concat(chunks).toString('utf8')
            const status = res.statusCode ?? 0
            if (status >= 300) reject(errorFromBody(status, body))
            else resolve(body)
          })
        })
        req.on('error', (err) => {
          if (init.signal?.aborted) reject(abortError(init.signal))
          else if (retry && isStale(req, err)) attempt(false).then(resolve, reject)
          else reject(this.unreachable(err))
        })
        req.end(payload)
      })
    return attempt(true)
  }

  /**
   * Sends a request asking to switch to `protocol` and resolves to the
   * connection once the server answered 101. A JSON body is sent with a
   * Content-Length, as the exec upgrade requires.
   */
  upgrade(method: string, path: string, protocol: string, init: { body?: unknown; headers?: Record<string, string>; signal?: AbortSignal } = {}, retry = true): Promise<Upgraded> {
    const u = new URL(this.url + path)
    const payload = init.body === undefined ? undefined : Buffer.from(JSON.stringify(init.body))
    const headers: Record<string, string> = { ...this.headers, ...init.headers, Connection: 'Upgrade', Upgrade: protocol }
    if (payload) {
      headers['Content-Type'] = 'application/json'
      headers['Content-Length'] = String(payload.length)
    }
    return new Promise((resolve, reject) => {
      if (init.signal?.aborted) return reject(abortError(init.signal))
      // The agent lends an idle kept-alive connection; after the 101 the
      // connection leaves its pool.
      const req = this.mod.request(u, { method, headers, agent: this.agent })
      const onAbort = () => req.destroy(abortError(init.signal) as Error)
      init.signal?.addEventListener('abort', onAbort, { once: true })
      const done = () => init.signal?.removeEventListener('abort', onAbort)
      req.on('upgrade', (res, socket, head) => {
        done()
        socket.setNoDelay?.(true)
        resolve({ socket, head, headers: res.headers })
      })
      req.on('response', (res) => {
        const chunks: Buffer[] = []
        res.on('data', (c: Buffer) => chunks.push(c))
        res.on('end', () => {
          done()
          const body = Buffer.concat(chunks).toString('utf8')
          if ((res.statusCode ?? 0) >= 300) reject(errorFromBody(res.statusCode ?? 0, body))
          else reject(new AgentVMError(res.statusCode ?? 0, 'http', `the server did not switch to ${protocol} (HTTP ${res.statusCode})`))
        })
        res.on('error', (err) => {
          done()
          reject(this.unreachable(err))
        })
      })
      req.on('error', (err) => {
        done()
        if (init.signal?.aborted) reject(abortError(init.signal))
        else if (retry && isStale(req, err)) this.upgrade(method, path, protocol, init, false).then(resolve, reject)
        else reject(this.unreachable(err))
      })
      req.end(payload)
    })
  }
}

/**
 * Whether a request failed because the kept-alive connection it was sent
 * on had just been closed by the server (its idle timeout): the server
 * read nothing, so the request is sent once more on a new connection.
 */
function isStale(req: http.ClientRequest, err: unknown): boolean {
  const code = (err as { code?: string })?.code
  return req.reusedSocket && (code === 'ECONNRESET' || code === 'EPIPE')
}

/** The error an aborted call rejects with: the signal's reason, as fetch does. */
function abortError(signal?: AbortSignal): unknown {
  return signal?.reason ?? new DOMException('This operation was aborted', 'AbortError')
}

/** An upgraded connection: the socket and the bytes that arrived with the 101. */
export interface Upgraded {
  socket: Duplex & { setNoDelay?: (b: boolean) => unknown }
  head: Buffer
  headers: http.IncomingHttpHeaders
}

function toBody(src: BodySource): unknown {
  if (typeof src === 'string') return new TextEncoder().encode(src)
  if (src instanceof ArrayBuffer) return new Uint8Array(src)
  if (src instanceof Uint8Array || src instanceof Blob) return src
  if (typeof (src as ReadableStream).getReader === 'function') return src
  // Any other async iterable (a Node Readable included): undici takes
  // async iterables of bytes as a streamed body.
  const it = src as AsyncIterable<Uint8Array | string>
  return (async function* () {
    for await (const c of it) yield typeof c === 'string' ? new TextEncoder().encode(c) : c
  })()
}

/** Reads a response body as lines (NDJSON, journal lines). */
export async function* lines(resp: Response): AsyncGenerator<string> {
  if (!resp.body) return
  const reader = resp.body.getReader()
  const dec = new TextDecoder()
  let buf = ''
  try {
    for (;;) {
      const { value, done } = await reader.read()
      if (done) break
      buf += dec.decode(value, { stream: true })
      let i: number
      while ((i = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, i)
        buf = buf.slice(i + 1)
        yield line
      }
    }
    buf += dec.decode()
    if (buf !== '') yield buf
  } finally {
    await reader.cancel().catch(() => {})
  }
}
