// A small WebSocket client (RFC 6455) over an upgraded node:http
// connection. Node 18 and 20 have no WebSocket global, and this keeps the
// package free of runtime dependencies. It speaks what terminals need:
// text and binary messages (fragmented or not), ping/pong and the closing
// handshake; no extensions.
import { createHash, randomBytes, randomFillSync } from 'node:crypto'
import { AgentVMError } from './errors.js'
import type { Transport, Upgraded } from './http.js'

const GUID = '258EAFA5-E914-47DA-95CA-C5AB0DC85B11'

const OpContinuation = 0x0
const OpText = 0x1
const OpBinary = 0x2
const OpClose = 0x8
const OpPing = 0x9
const OpPong = 0xa

export interface WebSocketHandlers {
  message(data: Buffer, binary: boolean): void
  close(code: number, reason: string): void
}

/** Opens a WebSocket to path on the server (with the client's token). */
export async function openWebSocket(t: Transport, path: string, handlers: WebSocketHandlers, signal?: AbortSignal, maxMessage = 16 << 20): Promise<WSConnection> {
  const key = randomBytes(16).toString('base64')
  const up = await t.upgrade('GET', path, 'websocket', {
    headers: { 'Sec-WebSocket-Key': key, 'Sec-WebSocket-Version': '13' },
    signal,
  })
  const want = createHash('sha1').update(key + GUID).digest('base64')
  if (up.headers['sec-websocket-accept'] !== want) {
    up.socket.destroy()
    throw new AgentVMError(0, 'http', 'WebSocket handshake failed: bad Sec-WebSocket-Accept')
  }
  return new WSConnection(up, handlers, maxMessage)
}

/** One client WebSocket connection. */
export class WSConnection {
  private readonly socket: Upgraded['socket']
  private buf: Buffer = Buffer.alloc(0)
  private msgType = 0
  private msgParts: Buffer[] = []
  private msgSize = 0
  private closeSent = false
  private closed = false
  private readonly closedP: Promise<void>
  private onClosed!: () => void

  constructor(
    up: Upgraded,
    private readonly h: WebSocketHandlers,
    private readonly maxMessage: number,
  ) {
    this.socket = up.socket
    this.closedP = new Promise((r) => (this.onClosed = r))
    let code = 1006
    let reason = ''
    const onData = (b: Buffer) => {
      try {
        const c = this.onData(b)
        if (c) [code, reason] = c
      } catch (err) {
        code = 1002
        reason = (err as Error).message
        this.socket.destroy()
      }
    }
    this.socket.on('data', onData)
    this.socket.on('error', () => {})
    this.socket.on('close', () => {
      this.closed = true
      this.h.close(code, reason)
      this.onClosed()
    })
    if (up.head.length) onData(up.head)
  }

  /** Resolves once the connection is gone. */
  get done(): Promise<void> {
    return this.closedP
  }

  get isOpen(): boolean {
    return !this.closed && !this.closeSent
  }

  private onData(chunk: Buffer): [number, string] | undefined {
    this.buf = this.buf.length ? Buffer.concat([this.buf, chunk]) : chunk
    let result: [number, string] | undefined
    for (;;) {
      const b = this.buf
      if (b.length < 2) return result
      const fin = (b[0] & 0x80) !== 0
      if (b[0] & 0x70) throw new Error('WebSocket frame with reserved bits set')
      const op = b[0] & 0x0f
      const masked = (b[1] & 0x80) !== 0
      let len = b[1] & 0x7f
      let off = 2
      if (len === 126) {
        if (b.length < 4) return result
        len = b.readUInt16BE(2)
        off = 4
      } else if (len === 127) {
        if (b.length < 10) return result
        const big = b.readBigUInt64BE(2)
        if (big > BigInt(this.maxMessage)) throw new Error('WebSocket message too large')
        len = Number(big)
        off = 10
      }
      if (len > this.maxMessage) throw new Error('WebSocket message too large')
      const maskOff = off
      if (masked) off += 4
      if (b.length < off + len) return result
      let payload = b.subarray(off, off + len)
      if (masked) {
        payload = Buffer.from(payload)
        for (let i = 0; i < payload.length; i++) payload[i] ^= b[maskOff + (i & 3)]
      }
      this.buf = b.subarray(off + len)
      const r = this.frame(fin, op, payload)
      if (r) result = r
    }
  }

  private frame(fin: boolean, op: number, payload: Buffer): [number, string] | undefined {
    switch (op) {
      case OpText:
      case OpBinary:
        if (this.msgType) throw new Error('WebSocket data frame inside a fragmented message')
        if (fin) {
          this.h.message(Buffer.from(payload), op === OpBinary)
          return
        }
        this.msgType = op
        this.msgParts = [Buffer.from(payload)]
        this.msgSize = payload.length
        return
      case OpContinuation: {
        if (!this.msgType) throw new Error('WebSocket continuation without a message')
        this.msgSize += payload.length
        if (this.msgSize > this.maxMessage) throw new Error('WebSocket message too large')
        this.msgParts.push(Buffer.from(payload))
        if (fin) {
          const data = Buffer.concat(this.msgParts, this.msgSize)
          const binary = this.msgType === OpBinary
          this.msgType = 0
          this.msgParts = []
          this.msgSize = 0
          this.h.message(data, binary)
        }
        return
      }
      case OpPing:
        this.write(OpPong, payload)
        return
      case OpPong:
        return
      case OpClose: {
        const code = payload.length >= 2 ? payload.readUInt16BE(0) : 1005
        const reason = payload.length > 2 ? payload.subarray(2).toString('utf8') : ''
        if (!this.closeSent) {
          // Echo the close, then the server ends the TCP connection.
          this.write(OpClose, payload.subarray(0, 2))
          this.closeSent = true
        }
        this.socket.end()
        return [code, reason]
      }
      default:
        throw new Error(`WebSocket frame with unknown opcode ${op}`)
    }
  }

  private write(op: number, payload: Uint8Array, cb?: (err?: Error | null) => void) {
    const n = payload.length
    const ext = n < 126 ? 0 : n < 65536 ? 2 : 8
    const h = Buffer.allocUnsafe(2 + ext + 4 + n)
    h[0] = 0x80 | op
    if (ext === 0) h[1] = 0x80 | n
    else if (ext === 2) {
      h[1] = 0x80 | 126
      h.writeUInt16BE(n, 2)
    } else {
      h[1] = 0x80 | 127
      h.writeBigUInt64BE(BigInt(n), 2)
    }
    const m = 2 + ext
    randomFillSync(h, m, 4)
    for (let i = 0; i < n; i++) h[m + 4 + i] = payload[i] ^ h[m + (i & 3)]
    this.socket.write(h, cb)
  }

  /** Sends one message. */
  send(data: string | Uint8Array, binary = typeof data !== 'string'): Promise<void> {
    return new Promise((resolve, reject) => {
      if (this.closed || this.closeSent) {
        reject(new AgentVMError(0, 'stream_lost', 'WebSocket is closed'))
        return
      }
      this.write(binary ? OpBinary : OpText, typeof data === 'string' ? Buffer.from(data) : data, (err) => (err ? reject(err) : resolve()))
    })
  }

  /**
   * Starts the closing handshake and resolves once the connection is gone
   * (the socket is destroyed after timeoutMs if the server does not answer).
   */
  async close(code = 1000, reason = '', timeoutMs = 5000): Promise<void> {
    if (!this.closed && !this.closeSent) {
      const p = Buffer.alloc(2 + Buffer.byteLength(reason))
      p.writeUInt16BE(code, 0)
      p.write(reason, 2)
      this.closeSent = true
      this.write(OpClose, p)
    }
    if (this.closed) return
    const timer = setTimeout(() => this.socket.destroy(), timeoutMs)
    await this.closedP
    clearTimeout(timer)
  }
}
