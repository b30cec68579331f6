'use strict';
// agentvm code interpreter: JavaScript runtime for one context.
//
// Started by server.py as `node jskernel.js` with CODEINTERP_FDS="<in>,<out>":
// it reads JSON-line commands from fd <in> and writes JSON-line events to fd
// <out>.  stdout/stderr of this process carry only raw output of child
// processes; console output and process.stdout/stderr writes of user code are
// sent as events, so their order is preserved.
//
//   in:  {"op":"execute","id":N,"code":"...","env":{"K":"V"}}   (env: this run only)
//        {"op":"setenv","env":{"K":"V"},"unset":["K2"]}            (persistent)
//   out: {"ev":"ready","node":"v18.x","acorn":bool,"typescript":bool,"tsc":"4.8.4"?}
//        {"ev":"stdout"|"stderr","id":N|null,"text":"..."}
//        {"ev":"result","id":N,"data":{"text/plain":"..."},"main":true}
//        {"ev":"error","id":N,"name":"...","value":"...","traceback":"..."}
//        {"ev":"done","id":N}
//
// Code runs in the process's global context (vm.runInThisContext), so
// globals persist across executions.  Top-level declarations are turned into
// global assignments (re-running `const x = ...` works), top-level await and
// static `import` are supported (rewritten with acorn: node's own copy, which
// server.py exposes by starting node with --expose-internals).  SIGINT interrupts the running
// execution (vm breakOnSigint, or by rejecting a pending top-level await);
// the context and its globals survive.

const fs = require('fs');
const net = require('net');
const path = require('path');
const util = require('util');
const vm = require('vm');
const Module = require('module');
const { StringDecoder } = require('string_decoder');
const { pathToFileURL } = require('url');

const [IN_FD, OUT_FD] = (process.env.CODEINTERP_FDS || '').split(',').map((s) => parseInt(s, 10));
const LANG = process.env.CODEINTERP_LANG || 'javascript';
delete process.env.CODEINTERP_FDS;
delete process.env.CODEINTERP_LANG;
if (!Number.isInteger(IN_FD) || !Number.isInteger(OUT_FD)) {
  process.stderr.write('jskernel.js must be started by the code interpreter server\n');
  process.exit(2);
}

// ---------------------------------------------------------------------------
// Event channel
// ---------------------------------------------------------------------------

const sleepBuf = new Int32Array(new SharedArrayBuffer(4));

function send(obj) {
  const buf = Buffer.from(JSON.stringify(obj) + '\n', 'utf8');
  let off = 0;
  while (off < buf.length) {
    try {
      off += fs.writeSync(OUT_FD, buf, off, buf.length - off);
    } catch (e) {
      if (e.code === 'EAGAIN') {
        Atomics.wait(sleepBuf, 0, 0, 5);
        continue;
      }
      process.exit(0); // the server is gone
    }
  }
}

let currentId = null;

function captureStream(stream, name) {
  const decoder = new StringDecoder('utf8');
  stream.write = function write(chunk, encoding, cb) {
    if (typeof encoding === 'function') {
      cb = encoding;
      encoding = undefined;
    }
    let text;
    if (typeof chunk === 'string') {
      text = encoding && encoding !== 'utf8' && encoding !== 'utf-8'
        ? Buffer.from(chunk, encoding).toString('utf8') : chunk;
    } else if (chunk instanceof Uint8Array) {
      text = decoder.write(Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength));
    } else {
      text = String(chunk);
    }
    if (text) send({ ev: name, id: currentId, text });
    if (typeof cb === 'function') process.nextTick(cb);
    return true;
  };
}
captureStream(process.stdout, 'stdout');
captureStream(process.stderr, 'stderr');

// ---------------------------------------------------------------------------
// Code transformation (acorn)
// ---------------------------------------------------------------------------

function loadAcorn() {
  // The parser node itself uses (reachable with --expose-internals; Debian's
  // node resolves it to its node-acorn package), then public copies.
  const candidates = ['internal/deps/acorn/acorn/dist/acorn', 'acorn', '/usr/share/nodejs/acorn', '/usr/lib/nodejs/acorn',
    '/usr/lib/node_modules/acorn', '/usr/local/lib/node_modules/acorn',
    path.join(__dirname, 'node_modules', 'acorn')];
  for (const c of candidates) {
    try {
      const a = require(c);
      if (a && typeof a.parse === 'function') return a;
    } catch (_) { /* try next */ }
  }
  return null;
}
const acorn = loadAcorn();

function patternNames(p, out) {
  if (!p) return;
  switch (p.type) {
    case 'Identifier': out.push(p.name); break;
    case 'ObjectPattern':
      for (const prop of p.properties) patternNames(prop.type === 'RestElement' ? prop.argument : prop.value, out);
      break;
    case 'ArrayPattern': for (const el of p.elements) patternNames(el, out); break;
    case 'RestElement': patternNames(p.argument, out); break;
    case 'AssignmentPattern': patternNames(p.left, out); break;
    default: break;
  }
}

const FUNCTION_TYPES = new Set(['FunctionDeclaration', 'FunctionExpression', 'ArrowFunctionExpression']);

// Visits all nodes; calls fn(node, insideFunction).
function walk(node, fn, inFn) {
  if (!node || typeof node.type !== 'string') return;
  fn(node, inFn);
  const nowInFn = inFn || FUNCTION_TYPES.has(node.type);
  for (const key of Object.keys(node)) {
    if (key === 'loc' || key === 'start' || key === 'end') continue;
    const v = node[key];
    if (Array.isArray(v)) {
      for (const c of v) if (c && typeof c.type === 'string') walk(c, fn, nowInFn);
    } else if (v && typeof v.type === 'string') {
      walk(v, fn, nowInFn);
    }
  }
}

function parse(code) {
  const opts = { ecmaVersion: 'latest', allowAwaitOutsideFunction: true, allowHashBang: true };
  try {
    return acorn.parse(code, { ...opts, sourceType: 'script' });
  } catch (e1) {
    try {
      return acorn.parse(code, { ...opts, sourceType: 'module' });
    } catch (e2) {
      return null;
    }
  }
}

// Returns {prelude, body, isAsync, hasValue} or null when the code should run as is.
function transform(code) {
  if (!acorn) return null;
  let src = code;
  let ast = null;
  // `{ a: 1 }` is an object literal, not a block (like the Node REPL).
  if (/^\s*{/.test(src) && !/;\s*$/.test(src)) {
    const wrapped = `(${src.trim()})\n`;
    ast = parse(wrapped);
    if (ast && ast.body.length === 1 && ast.body[0].type === 'ExpressionStatement') src = wrapped;
    else ast = null;
  }
  if (!ast) ast = parse(src);
  if (!ast) return null;

  const edits = [];
  const names = new Set();
  let isAsync = false;
  walk(ast, (node, inFn) => {
    if (node.type === 'ImportExpression') {
      edits.push({ start: node.start, end: node.start + 6, text: '__codeinterp_import' });
    } else if (!inFn && (node.type === 'AwaitExpression' || (node.type === 'ForOfStatement' && node.await))) {
      isAsync = true;
    }
  }, false);

  const body = ast.body;
  const fnHoist = [];
  body.forEach((stmt) => {
    if (stmt.type === 'VariableDeclaration') {
      const ids = [];
      for (const d of stmt.declarations) patternNames(d.id, ids);
      ids.forEach((n) => names.add(n));
      const decls = stmt.declarations.filter((d) => d.init || stmt.kind !== 'var');
      if (decls.length === 0) {
        edits.push({ start: stmt.start, end: stmt.end, text: ';' });
        return;
      }
      edits.push({ start: stmt.start, end: stmt.declarations[0].start, text: ';(' });
      stmt.declarations.forEach((d, i) => {
        if (!d.init) edits.push({ start: d.id.end, end: d.id.end, text: stmt.kind === 'var' ? '' : ' = undefined' });
        if (i === stmt.declarations.length - 1) edits.push({ start: d.end, end: d.end, text: ')' });
      });
    } else if (stmt.type === 'ClassDeclaration') {
      names.add(stmt.id.name);
      edits.push({ start: stmt.start, end: stmt.start, text: `;${stmt.id.name} = ` });
      edits.push({ start: stmt.end, end: stmt.end, text: ';' });
    } else if (stmt.type === 'FunctionDeclaration') {
      names.add(stmt.id.name);
      fnHoist.push(stmt.id.name);
    } else if (stmt.type === 'ImportDeclaration') {
      isAsync = true;
      const parts = [`const __ci_m = await __codeinterp_import(${stmt.source.raw});`];
      for (const s of stmt.specifiers) {
        names.add(s.local.name);
        if (s.type === 'ImportDefaultSpecifier') {
          parts.push(`${s.local.name} = ('default' in __ci_m) ? __ci_m.default : __ci_m;`);
        } else if (s.type === 'ImportNamespaceSpecifier') {
          parts.push(`${s.local.name} = __ci_m;`);
        } else {
          const imported = s.imported.type === 'Identifier' ? s.imported.name : s.imported.value;
          parts.push(`${s.local.name} = __ci_m[${JSON.stringify(imported)}];`);
        }
      }
      edits.push({ start: stmt.start, end: stmt.end, text: `;{ ${parts.join(' ')} }` });
    } else if (stmt.type === 'ExportNamedDeclaration' || stmt.type === 'ExportDefaultDeclaration'
      || stmt.type === 'ExportAllDeclaration') {
      throw new SyntaxError("'export' is not supported in a code cell");
    }
  });

  const last = body[body.length - 1];
  const hasValue = !!last && last.type === 'ExpressionStatement';
  if (isAsync) {
    if (hasValue) {
      edits.push({ start: last.start, end: last.start, text: 'return { value: (' });
      edits.push({ start: last.expression.end, end: last.expression.end, text: ') };' });
    }
    // Function declarations are hoisted inside the async wrapper; publish them.
    if (fnHoist.length) {
      const text = fnHoist.map((n) => `globalThis[${JSON.stringify(n)}] = ${n};`).join(' ');
      edits.push({ start: 0, end: 0, text });
    }
  }
  fnHoist.forEach((n) => names.delete(n));

  edits.sort((a, b) => a.start - b.start || (a.end - a.start) - (b.end - b.start));
  let out = '';
  let pos = 0;
  for (const e of edits) {
    out += src.slice(pos, e.start) + e.text;
    pos = Math.max(pos, e.end);
  }
  out += src.slice(pos);
  // Without top-level declarations-as-values, the completion value of a
  // trailing declaration would be the assigned value; keep it undefined.
  if (!isAsync && !hasValue) out += '\n;void 0';
  const prelude = names.size ? `var ${[...names].join(', ')};` : '';
  if (isAsync) {
    return { prelude, body: `(async () => {${out}\n})()`, isAsync, hasValue };
  }
  return { prelude: '', body: prelude + out, isAsync, hasValue };
}

// ---------------------------------------------------------------------------
// Globals for user code
// ---------------------------------------------------------------------------

let userRequire = Module.createRequire(path.join(process.cwd(), '__codeinterp__.js'));
const builtins = new Set(Module.builtinModules);

function resolveSpecifier(spec) {
  if (typeof spec !== 'string') return spec;
  if (spec.startsWith('node:') || builtins.has(spec)) return spec;
  if (/^[a-zA-Z][a-zA-Z0-9+.-]*:/.test(spec)) return spec; // file:, data:, ...
  if (spec.startsWith('.') || spec.startsWith('/')) return pathToFileURL(path.resolve(process.cwd(), spec)).href;
  try {
    return pathToFileURL(userRequire.resolve(spec)).href;
  } catch (_) {
    return spec;
  }
}

function defineHidden(name, value) {
  Object.defineProperty(globalThis, name, { value, writable: true, configurable: true, enumerable: false });
}
defineHidden('__codeinterp_import', (spec) => import(resolveSpecifier(spec)));
defineHidden('require', userRequire);
defineHidden('module', { exports: {}, require: userRequire, id: '<cell>', filename: null, loaded: true, paths: [] });
defineHidden('exports', globalThis.module.exports);
defineHidden('__filename', path.join(process.cwd(), '<cell>'));
defineHidden('__dirname', process.cwd());

// ---------------------------------------------------------------------------
// Execution
// ---------------------------------------------------------------------------

let cellNo = 0;
let interruptCurrent = null;

class KeyboardInterrupt extends Error {
  constructor() {
    super('Execution interrupted');
    this.name = 'KeyboardInterrupt';
  }
}

process.on('SIGINT', () => {
  if (interruptCurrent) interruptCurrent(new KeyboardInterrupt());
});
process.on('uncaughtException', (err) => {
  process.stderr.write(`Uncaught ${formatError(err).traceback || String(err)}\n`);
});
process.on('unhandledRejection', (reason) => {
  process.stderr.write(`Unhandled promise rejection: ${formatError(reason).traceback || util.inspect(reason)}\n`);
});

function cleanStack(stack) {
  const lines = String(stack).split('\n');
  const out = [];
  for (const line of lines) {
    if (/^\s+at /.test(line) && (line.includes('node:vm') || line.includes(__filename)
      || line.includes('node:internal/') || line.includes('(node:'))) break;
    out.push(line);
  }
  return out.join('\n');
}

function formatError(err) {
  if (err && err.code === 'ERR_SCRIPT_EXECUTION_INTERRUPTED') {
    return { name: 'KeyboardInterrupt', value: 'Execution interrupted', traceback: '' };
  }
  if (err instanceof KeyboardInterrupt) {
    return { name: err.name, value: err.message, traceback: '' };
  }
  if (err !== null && typeof err === 'object' && ('message' in err || 'stack' in err)) {
    const name = String(err.name || (err.constructor && err.constructor.name) || 'Error');
    const value = String(err.message === undefined ? '' : err.message);
    const traceback = err.stack ? cleanStack(err.stack) : `${name}: ${value}`;
    return { name, value, traceback };
  }
  return { name: 'Error', value: typeof err === 'string' ? err : util.inspect(err), traceback: '' };
}

function display(value) {
  if (typeof value === 'string') return value;
  return util.inspect(value, { colors: false });
}

// TypeScript: node's own type stripping where it has it (Node >= 22.13),
// else the TypeScript compiler (Debian's node-typescript) as a transpiler
// only: types are erased, not checked, as node does.
const typescript = LANG === 'typescript' && typeof Module.stripTypeScriptTypes !== 'function'
  ? loadTypeScript() : null;

function loadTypeScript() {
  for (const id of ['typescript', '/usr/share/nodejs/typescript']) {
    try {
      return require(id);
    } catch (_) {
      // next
    }
  }
  return null;
}

function stripTypes(code) {
  if (typeof Module.stripTypeScriptTypes === 'function') {
    const emitWarning = process.emitWarning;
    process.emitWarning = () => {}; // "stripTypeScriptTypes is an experimental feature"
    try {
      return Module.stripTypeScriptTypes(code, { mode: 'strip' });
    } finally {
      process.emitWarning = emitWarning;
    }
  }
  const ts = typescript;
  const out = ts.transpileModule(code, {
    reportDiagnostics: true,
    compilerOptions: {
      target: ts.ScriptTarget.ES2022,
      module: ts.ModuleKind.ESNext,
      isolatedModules: true,
      // An import a cell does not use yet is kept for the cells after it.
      preserveValueImports: true,
      useDefineForClassFields: true,
    },
  });
  const diag = (out.diagnostics || []).find((d) => d.category === ts.DiagnosticCategory.Error);
  if (diag) {
    let where = '';
    if (diag.file && diag.start !== undefined) {
      const { line, character } = diag.file.getLineAndCharacterOfPosition(diag.start);
      where = ` (${line + 1}:${character + 1})`;
    }
    throw new SyntaxError(ts.flattenDiagnosticMessageText(diag.messageText, '\n') + where);
  }
  // A cell with only type imports or exports is made a module with an
  // empty export, which a script cannot have.
  return out.outputText.replace(/^export \{\};\s*$/m, '');
}

function runScript(source, filename) {
  const script = new vm.Script(source, { filename, displayErrors: false });
  return script.runInThisContext({ breakOnSigint: true, displayErrors: false });
}

async function runCell(code) {
  cellNo += 1;
  const filename = `cell-${cellNo}.js`;
  if (LANG === 'typescript') code = stripTypes(code);
  let t = null;
  try {
    t = transform(code);
  } catch (e) {
    if (e instanceof SyntaxError) throw e;
    t = null;
  }
  if (!t) {
    // No acorn, or code it cannot parse: run as is (V8 reports syntax errors).
    try {
      return { value: runScript(code, filename), hasValue: true };
    } catch (e) {
      if (e instanceof SyntaxError && /await|import/.test(e.message) && !acorn) {
        const p = runScript(`(async () => {${code}\n})()`, filename);
        await withInterrupt(p);
        return { hasValue: false };
      }
      throw e;
    }
  }
  if (t.prelude) runScript(t.prelude, filename);
  const result = runScript(t.body, filename);
  if (!t.isAsync) return { value: result, hasValue: t.hasValue };
  const r = await withInterrupt(result);
  if (r && typeof r === 'object' && 'value' in r) return { value: r.value, hasValue: true };
  return { hasValue: false };
}

function withInterrupt(promise) {
  return new Promise((resolve, reject) => {
    interruptCurrent = reject;
    Promise.resolve(promise).then(resolve, reject);
  }).finally(() => {
    interruptCurrent = null;
  });
}

function applyEnv(env) {
  const saved = [];
  for (const [k, v] of Object.entries(env || {})) {
    saved.push([k, Object.prototype.hasOwnProperty.call(process.env, k) ? process.env[k] : undefined]);
    process.env[k] = String(v);
  }
  return () => {
    for (const [k, v] of saved) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  };
}

function setGlobalEnv(msg) {
  for (const k of msg.unset || []) delete process.env[k];
  for (const [k, v] of Object.entries(msg.env || {})) process.env[k] = String(v);
}

async function execute(msg) {
  const id = msg.id;
  currentId = id;
  const restoreEnv = applyEnv(msg.env);
  try {
    const r = await runCell(String(msg.code));
    if (r.hasValue && r.value !== undefined) {
      let text;
      try {
        text = display(r.value);
      } catch (e) {
        text = `[unprintable value: ${e && e.message}]`;
      }
      send({ ev: 'result', id, data: { 'text/plain': text }, main: true });
    }
  } catch (err) {
    send({ ev: 'error', id, ...formatError(err) });
  } finally {
    restoreEnv();
    currentId = null;
    send({ ev: 'done', id });
  }
}

// ---------------------------------------------------------------------------
// Command loop
// ---------------------------------------------------------------------------

let queue = Promise.resolve();
let inBuf = '';
const input = new net.Socket({ fd: IN_FD, readable: true, writable: false });
input.setEncoding('utf8');
input.on('data', (chunk) => {
  inBuf += chunk;
  let i;
  while ((i = inBuf.indexOf('\n')) >= 0) {
    const line = inBuf.slice(0, i);
    inBuf = inBuf.slice(i + 1);
    if (!line.trim()) continue;
    let msg;
    try {
      msg = JSON.parse(line);
    } catch (_) {
      continue;
    }
    if (msg.op === 'execute') queue = queue.then(() => execute(msg));
    else if (msg.op === 'setenv') queue = queue.then(() => setGlobalEnv(msg));
  }
});
input.on('end', () => process.exit(0));
input.on('error', () => process.exit(0));

send({
  ev: 'ready',
  node: process.version,
  acorn: !!acorn,
  typescript: typeof Module.stripTypeScriptTypes === 'function' || typescript !== null,
  tsc: typescript ? typescript.version : undefined,
});
