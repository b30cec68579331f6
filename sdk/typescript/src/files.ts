// Files inside a VM: streamed reads and atomic writes, metadata, directory
// operations and tar streams of whole trees.
import { type BodySource, type CallOptions, type Transport, seg } from './http.js'
import { isNotFound } from './errors.js'
import type { FileInfo, FileList, TarResult } from './types.js'

/** Options common to file calls. */
export interface FileOptions extends CallOptions {
  /** Guest user the operation runs as (default root, or the token's user). */
  user?: string
}

export interface ReadOptions extends FileOptions {
  /** Start at this byte. */
  offset?: number
  /** Read at most this many bytes (default to the end). */
  length?: number
}

export interface WriteOptions extends FileOptions {
  /** Permission bits, e.g. 0o755 (default: keep a replaced file's mode, else 0644). */
  mode?: number
  /** Create missing parent directories. */
  mkdirs?: boolean
}

/** A file's content as a stream, with what the response headers say about the file. */
export interface FileStream {
  stream: ReadableStream<Uint8Array>
  info: FileInfo
}

function infoFromHeaders(path: string, h: Headers): FileInfo {
  const mode = parseInt(h.get('X-File-Mode') ?? '', 8)
  const size = parseInt(h.get('X-File-Size') ?? '', 10)
  const info: FileInfo = { path, name: path.split('/').pop() || path, type: (h.get('X-File-Type') as FileInfo['type']) || 'file' }
  if (!Number.isNaN(mode)) info.mode = mode
  if (!Number.isNaN(size)) info.size = size
  const mtime = h.get('X-File-Mtime')
  if (mtime) info.mtime = mtime
  return info
}

/** A VM's files. Relative paths start in the user's home directory. */
export class Files {
  /** @internal */
  constructor(
    private readonly t: Transport,
    private readonly vm: string,
  ) {}

  private path(rest = ''): string {
    return `/v1/vms/${seg(this.vm)}/files${rest}`
  }

  /** Streams a file (or a range of it). */
  async stream(path: string, o: ReadOptions = {}): Promise<FileStream> {
    const resp = await this.t.fetch('GET', this.path(), {
      query: { path, user: o.user, offset: o.offset || undefined, length: o.length },
      signal: o.signal,
    })
    return { stream: resp.body ?? new ReadableStream({ start: (c) => c.close() }), info: infoFromHeaders(path, resp.headers) }
  }

  /** Reads a file (or a range of it) into memory. */
  async read(path: string, o: ReadOptions = {}): Promise<Uint8Array> {
    const resp = await this.t.fetch('GET', this.path(), {
      query: { path, user: o.user, offset: o.offset || undefined, length: o.length },
      signal: o.signal,
    })
    return new Uint8Array(await resp.arrayBuffer())
  }

  /** Reads a file as UTF-8 text. */
  async readText(path: string, o: ReadOptions = {}): Promise<string> {
    return new TextDecoder().decode(await this.read(path, o))
  }

  /**
   * Replaces a file atomically with data (streamed when it is a stream or
   * an async iterable): readers in the VM see the old or the new file.
   */
  write(path: string, data: BodySource, o: WriteOptions = {}): Promise<FileInfo> {
    return this.t.json('PUT', this.path(), {
      query: { path, user: o.user, mode: o.mode ? o.mode.toString(8).padStart(4, '0') : undefined, mkdirs: o.mkdirs },
      raw: data,
      signal: o.signal,
    })
  }

  /** Describes a file (lstat: a symlink is itself). */
  stat(path: string, o: FileOptions = {}): Promise<FileInfo> {
    return this.t.json('GET', this.path('/stat'), { query: { path, user: o.user }, signal: o.signal })
  }

  /** True when the path exists. */
  async exists(path: string, o: FileOptions = {}): Promise<boolean> {
    try {
      await this.stat(path, o)
      return true
    } catch (err) {
      if (isNotFound(err)) return false
      throw err
    }
  }

  /** Lists a directory (sorted by name). */
  list(path: string, o: FileOptions = {}): Promise<FileList> {
    return this.t.json('GET', this.path('/list'), { query: { path, user: o.user }, signal: o.signal })
  }

  /** Creates a directory and its missing parents. */
  mkdir(path: string, o: FileOptions & { mode?: number } = {}): Promise<FileInfo> {
    return this.t.json('POST', this.path('/mkdir'), { body: { path, mode: o.mode, user: o.user }, signal: o.signal })
  }

  /** Renames (moves) a file or directory. */
  rename(from: string, to: string, o: FileOptions & { overwrite?: boolean } = {}): Promise<FileInfo> {
    return this.t.json('POST', this.path('/rename'), { body: { from, to, overwrite: o.overwrite, user: o.user }, signal: o.signal })
  }

  /** Removes a file, or a directory (recursive is needed for a non-empty one). */
  remove(path: string, o: FileOptions & { recursive?: boolean } = {}): Promise<void> {
    return this.t.json('DELETE', this.path(), { query: { path, user: o.user, recursive: o.recursive }, signal: o.signal })
  }

  /** A tar stream of a file or directory tree (entry names relative to path). */
  async readTar(path: string, o: FileOptions = {}): Promise<FileStream> {
    const resp = await this.t.fetch('GET', this.path('/tar'), { query: { path, user: o.user }, signal: o.signal })
    return { stream: resp.body ?? new ReadableStream({ start: (c) => c.close() }), info: infoFromHeaders(path, resp.headers) }
  }

  /** Extracts a tar stream into the directory path (created if missing). */
  writeTar(path: string, tar: BodySource, o: FileOptions = {}): Promise<TarResult> {
    return this.t.json('PUT', this.path('/tar'), { query: { path, user: o.user }, raw: tar, signal: o.signal, headers: { 'Content-Type': 'application/x-tar' } })
  }
}
