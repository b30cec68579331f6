// The wildcard DNS a deployment gives its preview domain (*.<domain> to
// the proxy), for the process that imports it: names under .localhost resolve
// to 127.0.0.1, as browsers resolve them. Imported before the SDK.
import dns from 'node:dns'

const lookup = dns.lookup
dns.lookup = function (host, opts, cb) {
  if (typeof opts === 'function') {
    cb = opts
    opts = {}
  }
  if (typeof host === 'string' && host.endsWith('.localhost')) {
    if (opts && opts.all) return process.nextTick(cb, null, [{ address: '127.0.0.1', family: 4 }])
    return process.nextTick(cb, null, '127.0.0.1', 4)
  }
  return lookup.call(this, host, opts, cb)
}
