// Browsers resolve *.localhost to loopback themselves (preview URLs are
// http://<port>-<vm>.localhost:<proxy port>/); Node asks the system
// resolver, which does not here. Imported first, before the libraries
// capture dns.lookup.
import dns from 'node:dns';

const local = (host) => /\.localhost\.?$/i.test(host);
const lookup = dns.lookup;
dns.lookup = function (host, opts, cb) {
  if (typeof opts === 'function') { cb = opts; opts = {}; }
  if (!local(host)) return lookup.call(this, host, opts, cb);
  if (opts && opts.all) return process.nextTick(cb, null, [{ address: '127.0.0.1', family: 4 }]);
  return process.nextTick(cb, null, '127.0.0.1', 4);
};
const lookupP = dns.promises.lookup;
dns.promises.lookup = async function (host, opts) {
  if (!local(host)) return lookupP.call(this, host, opts);
  const r = { address: '127.0.0.1', family: 4 };
  return opts && opts.all ? [r] : r;
};
