// Files: atomic writes (buffered and streamed), reads (whole, ranges,
// streamed), metadata, directories, users, errors, and tar streams.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createHash, randomBytes } from 'node:crypto'
import { Readable } from 'node:stream'
import { ConflictError, ForbiddenError, NotFoundError } from '../dist/index.js'
import { cleanup, createVM, needsDaemon, readAll, uniq } from './helpers.mjs'

let vm
before(async () => {
  if (!needsDaemon) vm = await createVM({ name: uniq('tsfiles') })
})
after(() => cleanup(vm))

const sha = (b) => createHash('sha256').update(b).digest('hex')

test('write and read text, stat, exists, ranges', { skip: needsDaemon }, async () => {
  const fi = await vm.files.write('/root/ts/notes/a.txt', 'hello files\n', { mkdirs: true, mode: 0o640 })
  assert.equal(fi.size, 12)
  assert.equal(fi.mode, 0o640)
  assert.equal(fi.type, 'file')
  assert.equal(await vm.files.readText('/root/ts/notes/a.txt'), 'hello files\n')
  assert.equal((await vm.exec('cat /root/ts/notes/a.txt; stat -c %a /root/ts/notes/a.txt')).stdout, 'hello files\n640\n')
  const st = await vm.files.stat('/root/ts/notes/a.txt')
  assert.equal(st.size, 12)
  assert.equal(st.owner, 'root')
  assert.equal(await vm.files.exists('/root/ts/notes/a.txt'), true)
  assert.equal(await vm.files.exists('/root/ts/notes/none'), false)
  assert.equal(new TextDecoder().decode(await vm.files.read('/root/ts/notes/a.txt', { offset: 6, length: 5 })), 'files')
  // a replaced file keeps its mode
  await vm.files.write('/root/ts/notes/a.txt', new TextEncoder().encode('v2'))
  assert.equal((await vm.files.stat('/root/ts/notes/a.txt')).mode, 0o640)
})

test('streamed upload and download of a binary file', { skip: needsDaemon }, async () => {
  const data = randomBytes(5 << 20)
  // A Node Readable (an async iterable) is streamed without a known length.
  const fi = await vm.files.write('/root/ts/big.bin', Readable.from((function* () {
    for (let off = 0; off < data.length; off += 256 << 10) yield data.subarray(off, off + (256 << 10))
  })()))
  assert.equal(fi.size, data.length)
  assert.equal((await vm.exec('sha256sum /root/ts/big.bin | cut -d" " -f1')).stdout.trim(), sha(data))
  const { stream, info } = await vm.files.stream('/root/ts/big.bin')
  assert.equal(info.size, data.length)
  assert.equal(sha(await readAll(stream)), sha(data))
  // A web ReadableStream and a Blob upload too.
  const web = await vm.files.write('/root/ts/web.bin', new Blob([data.subarray(0, 1000)]).stream())
  assert.equal(web.size, 1000)
  const blob = await vm.files.write('/root/ts/blob.bin', new Blob([data.subarray(0, 777)]))
  assert.equal(blob.size, 777)
  assert.equal(sha(await vm.files.read('/root/ts/blob.bin')), sha(data.subarray(0, 777)))
})

test('directories: mkdir, list, rename, remove', { skip: needsDaemon }, async () => {
  const d = await vm.files.mkdir('/root/ts/tree/a/b', { mode: 0o750 })
  assert.equal(d.type, 'dir')
  await vm.files.write('/root/ts/tree/a/one.txt', '1')
  await vm.files.write('/root/ts/tree/a/two.txt', '22')
  const l = await vm.files.list('/root/ts/tree/a')
  assert.deepEqual(l.entries.map((e) => [e.name, e.type]), [['b', 'dir'], ['one.txt', 'file'], ['two.txt', 'file']])
  const moved = await vm.files.rename('/root/ts/tree/a/one.txt', '/root/ts/tree/a/b/uno.txt')
  assert.equal(moved.path, '/root/ts/tree/a/b/uno.txt')
  await assert.rejects(vm.files.rename('/root/ts/tree/a/two.txt', '/root/ts/tree/a/b/uno.txt'), ConflictError)
  await vm.files.rename('/root/ts/tree/a/two.txt', '/root/ts/tree/a/b/uno.txt', { overwrite: true })
  assert.equal(await vm.files.readText('/root/ts/tree/a/b/uno.txt'), '22')
  await assert.rejects(vm.files.remove('/root/ts/tree'), (err) => err instanceof ConflictError && err.code === 'not_empty')
  await vm.files.remove('/root/ts/tree', { recursive: true })
  assert.equal(await vm.files.exists('/root/ts/tree'), false)
  await assert.rejects(vm.files.read('/root/ts/tree/a/b/uno.txt'), (err) => err instanceof NotFoundError && err.code === 'not_found')
})

test('files as another user', { skip: needsDaemon }, async () => {
  const fi = await vm.files.write('notes.txt', 'mine', { user: 'agent' }) // relative: the user's home
  assert.equal(fi.path, '/home/agent/notes.txt')
  assert.equal((await vm.files.stat('/home/agent/notes.txt')).owner, 'agent')
  await assert.rejects(vm.files.write('/root/nope.txt', 'x', { user: 'agent' }), (err) => err instanceof ForbiddenError && err.code === 'permission_denied')
})

// A minimal ustar writer and reader, enough to check the tar endpoints.
function tarHeader(name, size, type = '0', mode = 0o644) {
  const h = Buffer.alloc(512)
  h.write(name, 0, 100)
  h.write(mode.toString(8).padStart(7, '0') + '\0', 100)
  h.write('0000000\0', 108)
  h.write('0000000\0', 116)
  h.write(size.toString(8).padStart(11, '0') + '\0', 124)
  h.write(Math.floor(Date.now() / 1000).toString(8).padStart(11, '0') + '\0', 136)
  h.write('        ', 148)
  h.write(type, 156)
  h.write('ustar\0' + '00', 257)
  let sum = 0
  for (const b of h) sum += b
  h.write(sum.toString(8).padStart(6, '0') + '\0 ', 148)
  return h
}

function makeTar(entries) {
  const parts = []
  for (const [name, content] of entries) {
    if (content === null) {
      parts.push(tarHeader(name, 0, '5', 0o755))
      continue
    }
    const b = Buffer.from(content)
    parts.push(tarHeader(name, b.length), b, Buffer.alloc((512 - (b.length % 512)) % 512))
  }
  parts.push(Buffer.alloc(1024))
  return Buffer.concat(parts)
}

function readTar(buf) {
  const out = new Map()
  for (let off = 0; off + 512 <= buf.length; ) {
    const h = buf.subarray(off, off + 512)
    if (h.every((b) => b === 0)) break
    const str = (a, n) => h.subarray(a, a + n).toString('utf8').replace(/\0.*$/s, '')
    const name = (str(345, 155) ? str(345, 155) + '/' : '') + str(0, 100)
    const size = parseInt(str(124, 12).trim() || '0', 8)
    const type = str(156, 1) || '0'
    off += 512
    out.set(name.replace(/^\.\//, ''), type === '0' ? buf.subarray(off, off + size).toString('utf8') : type)
    off += Math.ceil(size / 512) * 512
  }
  return out
}

test('tar: a tree out, a tree in', { skip: needsDaemon }, async () => {
  await vm.exec('mkdir -p /root/ts/src/sub && echo alpha > /root/ts/src/a.txt && echo beta > /root/ts/src/sub/b.txt && ln -sf a.txt /root/ts/src/link')
  const { stream, info } = await vm.files.readTar('/root/ts/src')
  assert.equal(info.type, 'dir')
  const tar = await readAll(stream)
  const entries = readTar(tar)
  assert.equal(entries.get('a.txt'), 'alpha\n')
  assert.equal(entries.get('sub/b.txt'), 'beta\n')
  assert.equal(entries.get('link'), '2') // a symlink stays a symlink
  // the same archive back in, somewhere else
  const res = await vm.files.writeTar('/root/ts/copy', tar)
  assert.ok(res.files >= 2, JSON.stringify(res))
  assert.equal((await vm.exec('diff -r /root/ts/src /root/ts/copy && readlink /root/ts/copy/link')).stdout, 'a.txt\n')
  // an archive made here, streamed
  const mine = makeTar([['made', null], ['made/here.txt', 'made in node\n']])
  const r2 = await vm.files.writeTar('/root/ts/mine', Readable.from([mine.subarray(0, 700), mine.subarray(700)]))
  assert.equal(r2.files, 1)
  assert.equal(await vm.files.readText('/root/ts/mine/made/here.txt'), 'made in node\n')
  await assert.rejects(vm.files.writeTar('/root/ts/evil', makeTar([['../escape.txt', 'x']])), (err) => err.status === 400)
})
