// The code interpreter: live Python, JavaScript and bash kernels ("contexts")
// in VMs made from the code-interpreter image.
import { type CallOptions, type Transport, lines, seg } from './http.js'
import { AgentVMError } from './errors.js'
import type { CodeContext, CodeEvent, RunCodeRequest } from './types.js'

/** Options of run: the request's fields and callbacks for its events. */
export interface RunCodeOptions extends Omit<RunCodeRequest, 'code'>, CallOptions {
  /** Called with every event as it arrives. */
  onEvent?: (e: CodeEvent) => void
}

/** What a run produced. */
export interface Execution {
  stdout: string
  stderr: string
  /** Every `result` event; `main` marks the value of the last expression. */
  results: CodeEvent[]
  /** The `error` event when the code raised. */
  error?: CodeEvent
  executionCount: number
  /** The main result's text/plain representation, if any. */
  text?: string
}

/** The code contexts of one VM, and running code in them. */
export class Code {
  /** @internal */
  constructor(
    private readonly t: Transport,
    private readonly vm: string,
  ) {}

  private path(rest = ''): string {
    return `/v1/vms/${seg(this.vm)}/code${rest}`
  }

  /** Runs code and yields its events (stdout, stderr, result, error, count, end) as produced. */
  async *stream(code: string, o: RunCodeOptions = {}): AsyncGenerator<CodeEvent> {
    const { onEvent: _onEvent, signal, ...req } = o
    const resp = await this.t.fetch('POST', this.path(), { body: { ...req, code }, signal })
    for await (const line of lines(resp)) {
      if (line.trim() !== '') yield JSON.parse(line) as CodeEvent
    }
  }

  /**
   * Runs code and collects its events. An exception in the code is
   * `error` in the answer; a run that ends abnormally throws.
   */
  async run(code: string, o: RunCodeOptions = {}): Promise<Execution> {
    const ex: Execution = { stdout: '', stderr: '', results: [], executionCount: 0 }
    for await (const e of this.stream(code, o)) {
      o.onEvent?.(e)
      switch (e.type) {
        case 'stdout':
          ex.stdout += e.text ?? ''
          break
        case 'stderr':
          ex.stderr += e.text ?? ''
          break
        case 'result':
          ex.results.push(e)
          if (e.main && typeof e.data?.['text/plain'] === 'string') ex.text = e.data['text/plain'] as string
          break
        case 'error':
          ex.error = e
          break
        case 'count':
          ex.executionCount = e.execution_count ?? 0
          break
        case 'end':
          if (e.error) throw new AgentVMError(0, 'unavailable', 'run code: ' + e.error)
          return ex
      }
    }
    throw new AgentVMError(0, 'unavailable', 'run code: the stream ended before the run did')
  }

  /** Lists the VM's contexts. */
  async contexts(o: CallOptions = {}): Promise<CodeContext[]> {
    return (await this.t.json<{ contexts?: CodeContext[] }>('GET', this.path('/contexts'), o)).contexts ?? []
  }

  /** Starts a new context (language python, javascript or bash; cwd default /home/user). */
  createContext(req: { language?: string; cwd?: string } = {}, o: CallOptions = {}): Promise<CodeContext> {
    return this.t.json('POST', this.path('/contexts'), { body: req, ...o })
  }

  /** Restarts a context's kernel: its state is lost, its id kept. */
  async restartContext(id: string, o: CallOptions = {}): Promise<void> {
    await this.t.json('POST', this.path('/contexts/' + seg(id) + '/restart'), o)
  }

  /** Stops and removes a context. */
  async deleteContext(id: string, o: CallOptions = {}): Promise<void> {
    await this.t.json('DELETE', this.path('/contexts/' + seg(id)), o)
  }
}
