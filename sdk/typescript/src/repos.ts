// Hosted git repositories (admin only): create, list, tokens, webhooks and
// the log of pushes. Clone and push with git at `url + repo.url`, the
// token as the password.
import { type CallOptions, type Transport, seg } from './http.js'
import type { Event as AgentEvent, Repo, RepoHook, Token } from './types.js'

/** Options of a repository token. */
export interface RepoTokenOptions extends CallOptions {
  /** `read` (clone, fetch; the default) or `write` (push too). */
  access?: 'read' | 'write'
  /** With write: the glob the branches pushed to must match (`agent/*`). */
  branches?: string
  /** e.g. `1h` (default), at most `8760h`. */
  ttl?: string
  name?: string
}

export class Repos {
  /** @internal */
  constructor(private readonly t: Transport) {}

  /** Creates a repository: empty, or a copy of every branch and tag at `fromUrl` (http or https). */
  create(name: string, o: CallOptions & { fromUrl?: string; allowPrivate?: boolean } = {}): Promise<Repo> {
    return this.t.json('POST', '/v1/repos', { body: { name, from_url: o.fromUrl, allow_private: o.allowPrivate }, signal: o.signal })
  }

  async list(o: CallOptions = {}): Promise<Repo[]> {
    return (await this.t.json<{ repos?: Repo[] }>('GET', '/v1/repos', o)).repos ?? []
  }

  get(name: string, o: CallOptions = {}): Promise<Repo> {
    return this.t.json('GET', '/v1/repos/' + seg(name), o)
  }

  /** Deletes a repository; its tokens end, with their clones and pushes under way. */
  delete(name: string, o: CallOptions = {}): Promise<void> {
    return this.t.json('DELETE', '/v1/repos/' + seg(name), o)
  }

  /** Issues a token that opens this repository only; revoke it with `tokens.revoke(id)`. */
  token(name: string, o: RepoTokenOptions = {}): Promise<Token> {
    return this.t.json('POST', '/v1/repos/' + seg(name) + '/tokens', {
      body: { access: o.access, branches: o.branches, ttl: o.ttl, name: o.name },
      signal: o.signal,
    })
  }

  /** Adds a webhook, POSTed after each push and signed with the secret in the answer. */
  addHook(name: string, url: string, o: CallOptions & { allowPrivate?: boolean } = {}): Promise<RepoHook> {
    return this.t.json('POST', '/v1/repos/' + seg(name) + '/hooks', { body: { url, allow_private: o.allowPrivate }, signal: o.signal })
  }

  removeHook(name: string, id: string, o: CallOptions = {}): Promise<void> {
    return this.t.json('DELETE', '/v1/repos/' + seg(name) + '/hooks/' + seg(id), o)
  }

  /** The pushes (who, each ref's old and new commit) and webhook deliveries, oldest first. */
  async events(name: string, o: CallOptions & { after?: number } = {}): Promise<AgentEvent[]> {
    return (await this.t.json<{ events?: AgentEvent[] }>('GET', '/v1/repos/' + seg(name) + '/events', { query: { after: o.after }, signal: o.signal })).events ?? []
  }
}
