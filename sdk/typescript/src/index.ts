// agentvm: the TypeScript SDK of the agentvm REST API.
export { AgentVM, VMs, Snapshots, Tokens, Networks } from './client.js'
export { VM, type RunOptions, type ForkResult } from './vm.js'
export { ExecProcess, signalNumber, type Command, type ExecOptions, type SpawnOptions, type RunResult, type Signal } from './exec.js'
export { Files, type FileOptions, type ReadOptions, type WriteOptions, type FileStream } from './files.js'
export { Terminal, Terminals, type AttachOptions } from './terminals.js'
export { Ports, Domains } from './ports.js'
export { Services, Processes, Jobs, type JobLogOptions } from './services.js'
export { Events, type EventListOptions } from './events.js'
export { Code, type RunCodeOptions, type Execution } from './code.js'
export { Templates, BuildError, type BuildOptions } from './templates.js'
export { Repos, type RepoTokenOptions } from './repos.js'
export { Recordings } from './recordings.js'
export type { ClientOptions, CallOptions, BodySource } from './http.js'
export {
  AgentVMError,
  InvalidArgumentError,
  UnauthorizedError,
  ForbiddenError,
  NotFoundError,
  ConflictError,
  TooManyRequestsError,
  UnavailableError,
  InsufficientStorageError,
  InternalError,
  ConnectionError,
  isNotFound,
  isConflict,
  type ErrorCode,
} from './errors.js'
export * from './types.js'
