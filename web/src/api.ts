// The API client of the console: same-origin fetch with the session cookie
// (a random session id, sent by the browser, never seen by this code) and
// the CSRF token on every call, GETs included (the server refuses a
// cookie request without it, except event streams, WebSockets and
// downloads).

export interface Session {
  admin: boolean;
  token_id?: string;
  vm_id?: string;
  allow?: string[];
  user?: string;
  expires_at?: string;
  csrf_token: string;
}

export class ApiError extends Error {
  constructor(public status: number, public code: string, message: string) {
    super(message);
  }
}

let session: Session | null = null;
let onSignedOut: () => void = () => {};

export function currentSession(): Session | null { return session; }
export function setSession(s: Session | null): void { session = s; }
export function whenSignedOut(fn: () => void): void { onSignedOut = fn; }

export function csrfHeaders(): Record<string, string> {
  return session ? { 'X-CSRF-Token': session.csrf_token } : {};
}

async function errorOf(resp: Response): Promise<ApiError> {
  let code = 'error';
  let msg = `${resp.status} ${resp.statusText}`;
  try {
    const b = await resp.json();
    if (b?.error) { code = b.error.code; msg = b.error.message; }
  } catch { /* not JSON */ }
  return new ApiError(resp.status, code, msg);
}

export async function raw(method: string, path: string, body?: BodyInit | null, headers: Record<string, string> = {}): Promise<Response> {
  const h: Record<string, string> = { ...headers, ...csrfHeaders() };
  const resp = await fetch(path, { method, headers: h, body: body ?? undefined, credentials: 'same-origin', cache: 'no-store' });
  if (resp.status === 401 && !path.startsWith('/console/')) {
    session = null;
    onSignedOut();
  }
  if (!resp.ok) throw await errorOf(resp);
  return resp;
}

export async function api<T = unknown>(method: string, path: string, body?: unknown): Promise<T> {
  const headers: Record<string, string> = { Accept: 'application/json' };
  let b: string | undefined;
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    b = JSON.stringify(body);
  }
  const resp = await raw(method, path, b, headers);
  if (resp.status === 204) return undefined as T;
  const ct = resp.headers.get('Content-Type') ?? '';
  return (ct.includes('json') ? await resp.json() : await resp.text()) as T;
}

export const enc = encodeURIComponent;
export const vmPath = (id: string, rest = ''): string => `/v1/vms/${enc(id)}${rest}`;

export async function loadSession(): Promise<Session | null> {
  const resp = await fetch('/console/session', { credentials: 'same-origin', cache: 'no-store' });
  if (resp.status === 401) { session = null; return null; }
  if (!resp.ok) throw await errorOf(resp);
  session = await resp.json();
  return session;
}

export async function signIn(token: string): Promise<Session> {
  const resp = await fetch('/console/session', {
    method: 'POST', credentials: 'same-origin',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ token }),
  });
  if (!resp.ok) throw await errorOf(resp);
  session = await resp.json();
  return session!;
}

// signOut ends the session on the server; it throws when the server did
// not (the page then stays signed in and says so).
export async function signOut(): Promise<void> {
  const resp = await fetch('/console/session', { method: 'DELETE', credentials: 'same-origin', headers: csrfHeaders() });
  if (!resp.ok && resp.status !== 401) throw await errorOf(resp);
  session = null;
}

// Streams a response body line by line (followed logs and events).
export async function streamLines(path: string, signal: AbortSignal, onLine: (line: string) => void): Promise<void> {
  const resp = await fetch(path, { credentials: 'same-origin', signal, cache: 'no-store', headers: csrfHeaders() });
  if (!resp.ok) throw await errorOf(resp);
  const reader = resp.body!.getReader();
  const dec = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let i: number;
    while ((i = buf.indexOf('\n')) >= 0) {
      onLine(buf.slice(0, i));
      buf = buf.slice(i + 1);
    }
  }
  if (buf) onLine(buf);
}
