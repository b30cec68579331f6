// Terminals over the WebSocket: a command round trip, resize, detach and
// reattach with the scrollback, two clients, signals, exit, kill.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { NotFoundError } from '../dist/index.js'
import { cleanup, collect, createVM, needsDaemon, uniq, until } from './helpers.mjs'

let vm
before(async () => {
  if (!needsDaemon) vm = await createVM({ name: uniq('tsterm') })
})
after(() => cleanup(vm))

test('terminal round trip: command, resize, detach, reattach', { skip: needsDaemon }, async () => {
  const info = await vm.terminals.create({ name: 'work', cols: 100, rows: 30 })
  assert.equal(info.name, 'work')
  assert.equal(info.user, 'root')
  let term = await vm.terminals.attach('work')
  let out = collect(term)
  await term.write('echo marker-$((6*7))\n')
  await out.waitFor('marker-42')

  // resize over the WebSocket, seen by the program in the terminal
  await term.resize(132, 43)
  await until('the terminal size to apply', async () => (await vm.terminals.get('work')).cols === 132)
  await term.write('stty size\n')
  await out.waitFor('43 132')
  // and through the REST call
  await vm.terminals.resize('work', 90, 25)
  await term.write('echo size-$(stty size | tr " " x)\n')
  await out.waitFor('size-25x90')

  // detach: the program keeps running and its output is kept
  await term.write('for i in 1 2 3; do echo tick-$i; sleep 0.3; done; echo loop-done; touch /tmp/loop-done\n')
  await term.close()
  await out.done
  assert.equal(term.attached, false)
  assert.equal(term.exit, null)
  await until('the loop to finish with nobody attached', () => vm.files.exists('/tmp/loop-done'), { timeout: 60_000 })
  // (the guest drops the client once the close reaches it)
  await until('the detach to be seen', async () => {
    const listed = await vm.terminals.list()
    return JSON.stringify(listed.map((t) => [t.name, t.clients, t.exited])) === JSON.stringify([['work', 0, false]])
  }, { timeout: 60_000 })

  term = await vm.terminals.attach('work')
  out = collect(term)
  await out.waitFor('loop-done')
  assert.ok(out.text.includes('marker-42') && out.text.includes('tick-3'), 'the scrollback has the earlier output')

  // a second client without the scrollback sees only new output, and both see it
  const other = await vm.terminals.attach('work', { scrollback: false })
  const out2 = collect(other) // attach resolves once the server attached it to the session
  await term.write('echo shared-$((1+1))\n')
  await out.waitFor('shared-2')
  await out2.waitFor('shared-2')
  assert.ok(!out2.text.includes('marker-42'))
  assert.equal((await vm.terminals.get('work')).clients, 2)
  await other.close()

  // signals reach the foreground process group
  await term.write('sleep 600\n')
  await until('sleep to run in the terminal', async () => (await vm.exec('pgrep -x sleep || true')).stdout.trim() !== '', { timeout: 60_000 })
  await term.signal('INT')
  // (an interactive bash drops the rest of a line whose command died of SIGINT)
  await term.write('echo after-int-$?\n')
  await out.waitFor('after-int-130')
  await term.write('sleep 600; echo rest-$?\n')
  await until('sleep to run again', async () => (await vm.exec('pgrep -x sleep || true')).stdout.trim() !== '', { timeout: 60_000 })
  await vm.terminals.signal('work', 'TERM')
  await out.waitFor('rest-143')

  // the program's exit ends the stream with its exit code
  await term.write('exit 3\n')
  await out.done
  assert.deepEqual(term.exit, { type: 'exit', exit_code: 3 })
  const gone = await vm.terminals.get('work')
  assert.equal(gone.exited, true)
  assert.equal(gone.exit_code, 3)
})

test('terminal with a command, attached at a size; kill', { skip: needsDaemon }, async () => {
  await vm.terminals.create({ name: 'py', argv: ['python3', '-q'], user: 'agent', cwd: '/tmp', env: { MY_VAR: 'xyz' } })
  const term = await vm.terminals.attach('py', { cols: 77, rows: 21 })
  const out = collect(term)
  await out.waitFor('>>>')
  await term.write('import os, shutil; print("env", os.environ["MY_VAR"], os.getcwd(), os.getuid(), tuple(shutil.get_terminal_size()))\n')
  await out.waitFor("env xyz /tmp 1000 (77, 21)")
  await vm.terminals.kill('py')
  await out.done
  await assert.rejects(vm.terminals.get('py'), NotFoundError)
  await assert.rejects(vm.terminals.attach('py'), NotFoundError)
})
