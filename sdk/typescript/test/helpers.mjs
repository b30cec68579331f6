// Shared by the tests: a client from AGENTVM_URL / AGENTVM_TOKEN, unique
// names, and waits on conditions with generous deadlines (guests may run
// under TCG emulation, where everything is slow).
import { AgentVM } from '../dist/index.js'

export const live = Boolean(process.env.AGENTVM_URL)
/** The `skip` option of daemon tests: a reason when no daemon is given. */
export const needsDaemon = live ? false : 'set AGENTVM_URL and AGENTVM_TOKEN to run the tests against an agentvm daemon'
export const av = live ? new AgentVM() : undefined

const suffix = (Date.now() % 1e8).toString(36)
/** A VM, snapshot or network name unique to this run (a DNS label). */
export const uniq = (prefix) => `${prefix}-${suffix}`

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

/** Polls fn until it returns a truthy value (returned) or the deadline passes. */
export async function until(what, fn, { timeout = 120_000, interval = 250 } = {}) {
  const deadline = Date.now() + timeout
  let last
  for (;;) {
    try {
      const v = await fn()
      if (v) return v
      last = v
    } catch (err) {
      last = err
    }
    if (Date.now() > deadline) throw new Error(`timed out after ${timeout} ms waiting for ${what}; last: ${last instanceof Error ? last.stack : JSON.stringify(last)}`)
    await sleep(interval)
  }
}

/** Creates a small VM (512 MiB) for a test file. */
export function createVM(req = {}) {
  return av.vms.create({ memory: 512, ...req })
}

/** Deletes VMs, ignoring those already gone. */
export async function cleanup(...vms) {
  for (const v of vms) if (v) await v.delete().catch(() => {})
}

/** Collects a terminal's output in the background. */
export function collect(term) {
  const c = { text: '', done: null }
  c.done = (async () => {
    for await (const chunk of term) c.text += Buffer.from(chunk).toString('utf8')
  })()
  c.waitFor = (s, timeout = 60_000) => until(`terminal output containing ${JSON.stringify(s)} (got ${JSON.stringify(c.text.slice(-300))})`, () => c.text.includes(s), { timeout, interval: 50 })
  return c
}

/** Reads a web ReadableStream (or any async iterable of bytes) into one Buffer. */
export async function readAll(stream) {
  const chunks = []
  for await (const c of stream) chunks.push(Buffer.from(c))
  return Buffer.concat(chunks)
}
