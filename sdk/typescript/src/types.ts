// Names for the API's types. Everything here comes from the types that
// openapi-typescript generates from api/openapi.yaml (src/generated), so the
// SDK's request and response shapes follow the contract; field names are the
// API's own (snake_case).
import type { components, operations } from './generated/openapi.js'

type Schemas = components['schemas']
type JSONBody<Op extends keyof operations> = operations[Op] extends { requestBody?: { content: { 'application/json': infer B } } } ? B : never
type JSONAnswer<Op extends keyof operations, S extends number> = operations[Op]['responses'] extends Record<S, { content: { 'application/json': infer B } }> ? B : never

export type { components, operations, paths } from './generated/openapi.js'

export type VMInfo = Schemas['VM']
export type VMState = Schemas['VMState']
export type CreateVMRequest = Schemas['CreateVMRequest']
export type ResizeRequest = Schemas['ResizeRequest']
export type OpStats = Schemas['OpStats']
export type Size = Schemas['Size']
export type Duration = Schemas['Duration']
export type Health = Schemas['Health']
export type Snapshot = Schemas['Snapshot']
export type BuiltTemplate = Schemas['BuiltTemplate']
export type BuildEvent = Schemas['BuildEvent']
export type ForkResponse = Schemas['ForkResponse']
export type ExecRequest = Schemas['ExecRequest']
export type ExecResult = Schemas['ExecResult']
export type ExecEvent = Schemas['ExecEvent']
export type ExitStatus = Schemas['ExitStatus']
export type Token = Schemas['Token']
export type Repo = Schemas['Repo']
export type RepoHook = Schemas['RepoHook']
export type Recording = Schemas['Recording']
export type DiffResponse = Schemas['DiffResponse']
export type DiffEntry = Schemas['DiffEntry']
export type CreateTokenRequest = Schemas['CreateTokenRequest']
export type SSHInfo = Schemas['SSHInfo']
export type TermCreate = Schemas['TermCreate']
export type TermInfo = Schemas['TermInfo']
export type FileInfo = Schemas['FileInfo']
export type Port = Schemas['Port']
export type Domain = Schemas['Domain']
export type Egress = Schemas['Egress']
export type NetworkInfo = Schemas['NetworkInfo']
export type ServiceInfo = Schemas['ServiceInfo']
export type JobInfo = Schemas['JobInfo']
export type Event = Schemas['Event']
export type APIErrorBody = Schemas['Error']
export type RunCodeRequest = Schemas['RunCodeRequest']
export type CodeEvent = Schemas['CodeEvent']
export type CodeContext = Schemas['CodeContext']

export type ExposeRequest = JSONBody<'exposePort'>
export type CreateNetworkRequest = JSONBody<'createNetwork'>
export type PolicyRequest = JSONBody<'setPolicy'>
export type ServiceCreate = JSONBody<'createService'>
export type MkdirRequest = JSONBody<'mkdir'>
export type RenameRequest = JSONBody<'rename'>
export type FileList = JSONAnswer<'listDir', 200>
export type TarResult = JSONAnswer<'writeTar', 200>
export type ProcessInfo = NonNullable<JSONAnswer<'listProcesses', 200>['processes']>[number]

/**
 * A text message on a terminal WebSocket (described in the API's terminal
 * attach operation): resize and signal from the client, exit from the server.
 */
export interface TermControl {
  type: 'resize' | 'signal' | 'exit'
  cols?: number
  rows?: number
  signal?: string
  exit_code?: number
}
