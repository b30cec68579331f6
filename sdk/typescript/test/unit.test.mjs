// Offline checks of the pieces that need no daemon: the exec frame codec,
// error mapping, signal names and query strings.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { FrameDecoder, encodeFrame, FrameStdout, FrameExit } from '../dist/frames.js'
import { encodeQuery } from '../dist/http.js'
import { AgentVMError, ConflictError, NotFoundError, ForbiddenError, UnavailableError, isNotFound, signalNumber } from '../dist/index.js'
import { errorFromBody } from '../dist/errors.js'

test('frames survive any split of the byte stream', () => {
  const frames = [encodeFrame(FrameStdout, Buffer.from('hello')), encodeFrame(FrameStdout, Buffer.alloc(70000, 7)), encodeFrame(FrameExit, Buffer.from('{"exit_code":3}'))]
  const all = Buffer.concat(frames)
  for (const step of [1, 2, 3, 5, 7, 4096, all.length]) {
    const d = new FrameDecoder()
    const got = []
    for (let i = 0; i < all.length; i += step) got.push(...d.push(all.subarray(i, i + step)))
    assert.equal(got.length, 3, `step ${step}`)
    assert.equal(got[0].data.toString(), 'hello')
    assert.equal(got[1].data.length, 70000)
    assert.ok(got[1].data.every((b) => b === 7))
    assert.deepEqual(JSON.parse(got[2].data.toString()), { exit_code: 3 })
    assert.equal(d.pending, 0)
  }
  const big = Buffer.alloc(5)
  big[0] = FrameStdout
  big.writeUInt32BE((16 << 20) + 1, 1)
  assert.throws(() => new FrameDecoder().push(big), /larger than/)
})

test('errors carry the API code and pick a class', () => {
  const e = errorFromBody(404, '{"error":{"code":"not_found","message":"no VM named or with id \\"x\\""}}')
  assert.ok(e instanceof NotFoundError && e instanceof AgentVMError && e instanceof Error)
  assert.equal(e.status, 404)
  assert.equal(e.code, 'not_found')
  assert.equal(e.message, 'no VM named or with id "x"')
  assert.equal(e.name, 'NotFoundError')
  assert.ok(isNotFound(e))
  assert.ok(errorFromBody(409, '{"error":{"code":"not_empty","message":"x"}}') instanceof ConflictError)
  assert.ok(errorFromBody(403, '{"error":{"code":"permission_denied","message":"x"}}') instanceof ForbiddenError)
  const plain = errorFromBody(502, 'bad gateway\n')
  assert.ok(plain instanceof UnavailableError)
  assert.equal(plain.code, 'http')
  assert.equal(plain.message, 'bad gateway')
})

test('signals are numbered as on Linux', () => {
  assert.equal(signalNumber('TERM'), 15)
  assert.equal(signalNumber('SIGINT'), 2)
  assert.equal(signalNumber('usr1'), 10)
  assert.equal(signalNumber(9), 9)
  assert.equal(signalNumber('9'), 9)
  assert.throws(() => signalNumber('NOPE'))
})

test('query strings leave out unset values and repeat arrays', () => {
  assert.equal(encodeQuery({ path: '/a b', user: undefined, recursive: false, follow: true, n: 0 }), '?path=%2Fa+b&follow=1&n=0')
  assert.equal(encodeQuery({ label: ['a=b', 'c'] }), '?label=a%3Db&label=c')
  assert.equal(encodeQuery({}), '')
})
