// The example of docs/typescript-sdk.md, type-checked against the built package (npm run
// build && npm run typecheck). Run it with a daemon: npx tsc -p examples
// is type-only; `node --experimental-strip-types` (Node >= 22.6) runs it.
import { AgentVM, NotFoundError, type ExecResult } from 'agentvm'

const av = new AgentVM() // AGENTVM_URL, AGENTVM_TOKEN (or the admin token in the data dir)
const vm = await av.vms.create({ name: 'box1', memory: '1G', labels: { team: 'ci' } })
try {
  const r: ExecResult = await vm.exec('uname -a')
  console.log(r.exit_code, r.stdout)

  // stdin streamed to a running process, output read as it comes
  const p = await vm.spawn(['sh', '-c', 'while read l; do echo "got $l"; done'])
  p.stdout.on('data', (c: Buffer) => process.stdout.write(c))
  await p.write('hello\n')
  await p.end()
  console.log('exit', (await p.wait()).exit_code)

  await vm.files.write('/root/notes.txt', 'hi\n')
  console.log(await vm.files.readText('/root/notes.txt'))

  await vm.terminals.create({ name: 'main' })
  const term = await vm.terminals.attach('main', { cols: 120, rows: 40 })
  await term.write('ls /\n')
  const first = await term.read()
  if (first) process.stdout.write(first)
  await term.close() // detach; the shell keeps running

  const { children } = await vm.fork(2)
  for (const c of children) await c.delete()

  for await (const e of vm.events.follow({ signal: AbortSignal.timeout(1000) })) console.log(e.type, e.message)
} catch (err) {
  if (err instanceof NotFoundError) console.error('gone:', err.code, err.message)
  else throw err
} finally {
  await vm.delete()
}
