// Typed errors. Every non-2xx answer of the API carries
// {"error": {"code": "...", "message": "..."}}; the code is kept as is and
// picks the subclass, so callers can test either `err.code === 'not_found'`
// or `err instanceof NotFoundError`.

/** Error codes the API answers with (api/openapi.yaml, Error.code). */
export type ErrorCode =
  | 'invalid_argument'
  | 'unauthorized'
  | 'forbidden'
  | 'not_found'
  | 'conflict'
  | 'too_many_requests'
  | 'internal'
  | 'unavailable'
  | 'insufficient_storage'
  | 'permission_denied'
  | 'exists'
  | 'not_empty'
  | 'is_directory'
  | 'not_directory'
  | 'no_space'
  // SDK-side codes: the server could not be reached, an answer that is
  // not the API's error JSON, a stream that ended early.
  | 'connection_failed'
  | 'http'
  | 'stream_lost'

/** An error from the agentvm API, or from reaching it (status 0). */
export class AgentVMError extends Error {
  /** HTTP status; 0 when no HTTP answer was received. */
  readonly status: number
  /** The API's error code, e.g. `not_found`, `conflict`. */
  readonly code: ErrorCode | (string & {})

  constructor(status: number, code: string, message: string, options?: { cause?: unknown }) {
    super(message, options)
    this.name = new.target.name
    this.status = status
    this.code = code
  }
}

/** 400 invalid_argument. */
export class InvalidArgumentError extends AgentVMError {}
/** 401 unauthorized: missing or invalid token. */
export class UnauthorizedError extends AgentVMError {}
/** 403 forbidden or permission_denied. */
export class ForbiddenError extends AgentVMError {}
/** 404 not_found. */
export class NotFoundError extends AgentVMError {}
/** 409 conflict (and the file codes exists, not_empty, is_directory, not_directory). */
export class ConflictError extends AgentVMError {}
/** 429 too_many_requests: a token holds too many connections at once. */
export class TooManyRequestsError extends AgentVMError {}
/** 503 unavailable (and 502 for a lost buffered exec stream). */
export class UnavailableError extends AgentVMError {}
/** 507 insufficient_storage or no_space. */
export class InsufficientStorageError extends AgentVMError {}
/** 500 internal. */
export class InternalError extends AgentVMError {}
/** The server could not be reached (status 0, code connection_failed). */
export class ConnectionError extends AgentVMError {}

type ErrorClass = new (status: number, code: string, message: string, options?: { cause?: unknown }) => AgentVMError

const byCode: Record<string, ErrorClass> = {
  invalid_argument: InvalidArgumentError,
  unauthorized: UnauthorizedError,
  forbidden: ForbiddenError,
  permission_denied: ForbiddenError,
  not_found: NotFoundError,
  conflict: ConflictError,
  exists: ConflictError,
  not_empty: ConflictError,
  is_directory: ConflictError,
  not_directory: ConflictError,
  too_many_requests: TooManyRequestsError,
  unavailable: UnavailableError,
  insufficient_storage: InsufficientStorageError,
  no_space: InsufficientStorageError,
  internal: InternalError,
}

const byStatus: Record<number, ErrorClass> = {
  400: InvalidArgumentError,
  401: UnauthorizedError,
  403: ForbiddenError,
  404: NotFoundError,
  409: ConflictError,
  429: TooManyRequestsError,
  500: InternalError,
  502: UnavailableError,
  503: UnavailableError,
  507: InsufficientStorageError,
}

/** Builds the typed error for an HTTP status and code. */
export function apiError(status: number, code: string, message: string): AgentVMError {
  const C = byCode[code] ?? byStatus[status] ?? AgentVMError
  return new C(status, code, message)
}

/** Decodes an error answer's body (the API's JSON, or any text). */
export function errorFromBody(status: number, body: string): AgentVMError {
  try {
    const e = JSON.parse(body)?.error
    if (e && typeof e.message === 'string' && e.message !== '') {
      return apiError(status, typeof e.code === 'string' ? e.code : 'http', e.message)
    }
  } catch {
    // not JSON: fall through
  }
  return apiError(status, 'http', body.trim() || `HTTP ${status}`)
}

/** True when err is the API's 404 not_found. */
export function isNotFound(err: unknown): boolean {
  return err instanceof AgentVMError && (err.code === 'not_found' || err.status === 404)
}

/** True when err is the API's 409 conflict (a state or operation conflict). */
export function isConflict(err: unknown): boolean {
  return err instanceof AgentVMError && (err.code === 'conflict' || err.status === 409)
}
