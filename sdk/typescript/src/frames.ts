// The frame codec of the upgraded exec stream (Upgrade: agentvm-exec): 1 byte
// type, 4 bytes big-endian payload length, payload (at most 16 MiB).

export const FrameStdin = 1 // client -> server
export const FrameStdinEOF = 2 // client -> server
export const FrameStdout = 3
export const FrameStderr = 4
export const FrameExit = 5 // JSON ExitStatus; the last frame
export const FrameError = 6 // JSON {"message"}
export const FrameSignal = 7 // client -> server, decimal signal number

export const FrameHeaderLen = 5
export const MaxFramePayload = 16 << 20

export interface Frame {
  type: number
  data: Buffer
}

export function encodeFrame(type: number, payload: Uint8Array = new Uint8Array(0)): Buffer {
  const b = Buffer.allocUnsafe(FrameHeaderLen + payload.length)
  b[0] = type
  b.writeUInt32BE(payload.length, 1)
  b.set(payload, FrameHeaderLen)
  return b
}

/** Splits a byte stream into frames; chunks may cut frames anywhere. */
export class FrameDecoder {
  // Unread chunks are chunks[head..]; head moves instead of shift() so that
  // many small chunks cost linear time.
  private chunks: Buffer[] = []
  private head = 0
  private size = 0

  /** Adds bytes and returns the frames they complete. */
  push(chunk: Buffer): Frame[] {
    if (chunk.length > 0) {
      this.chunks.push(chunk)
      this.size += chunk.length
    }
    const out: Frame[] = []
    while (this.size >= FrameHeaderLen) {
      const h = this.peekHeader()
      const n = h.readUInt32BE(1)
      if (n > MaxFramePayload) throw new Error(`exec frame of ${n} bytes is larger than ${MaxFramePayload}`)
      if (this.size < FrameHeaderLen + n) break
      this.take(FrameHeaderLen)
      out.push({ type: h[0], data: this.take(n) })
    }
    if (this.head > 64 && this.head * 2 > this.chunks.length) {
      this.chunks = this.chunks.slice(this.head)
      this.head = 0
    }
    return out
  }

  /** Bytes buffered that do not yet make a whole frame. */
  get pending(): number {
    return this.size
  }

  private peekHeader(): Buffer {
    const first = this.chunks[this.head]
    if (first.length >= FrameHeaderLen) return first.subarray(0, FrameHeaderLen)
    const h = Buffer.allocUnsafe(FrameHeaderLen)
    let off = 0
    for (let i = this.head; off < FrameHeaderLen; i++) off += this.chunks[i].copy(h, off, 0, Math.min(this.chunks[i].length, FrameHeaderLen - off))
    return h
  }

  private take(n: number): Buffer {
    if (n === 0) return Buffer.alloc(0)
    const first = this.chunks[this.head]
    let out: Buffer
    if (first.length >= n) {
      out = first.subarray(0, n)
      if (first.length === n) this.head++
      else this.chunks[this.head] = first.subarray(n)
    } else {
      out = Buffer.allocUnsafe(n)
      let off = 0
      while (off < n) {
        const c = this.chunks[this.head]
        const k = Math.min(c.length, n - off)
        c.copy(out, off, 0, k)
        off += k
        if (k === c.length) this.head++
        else this.chunks[this.head] = c.subarray(k)
      }
    }
    this.size -= n
    return out
  }
}
