// agentvm code interpreter: the Java runtime of one context, on JShell
// (jdk.jshell, the JDK's own REPL engine).
//
// Started by javacontext.py as `java ... JShellKernel` with
// CODEINTERP_FDS="<in>,<out>": it reads JSON-line commands from fd <in> and
// writes JSON-line events to fd <out> (the protocol of jskernel.js):
//
//   in:  {"op":"execute","id":N,"code":"...","env":{"K":"V"}}   (env: this run only)
//        {"op":"setenv","env":{"K":"V"},"unset":["K2"]}            (persistent)
//   out: {"ev":"ready","java":"17.0.x"}
//        {"ev":"stdout"|"stderr","id":N,"text":"..."}
//        {"ev":"result","id":N,"data":{"text/plain":"..."},"main":true}
//        {"ev":"error","id":N,"name":"...","value":"...","traceback":"..."}
//        {"ev":"done","id":N}
//
// Snippets run in this JVM (JShell's "local" execution engine), so
// System.out and System.err of user code are this process's, turned into
// events here.  Environment variables cannot change inside a running JVM:
// as in E2B's Java kernel, a context's variables (the sandbox's and a run's)
// are Java system properties (System.getProperty("NAME")).  SIGINT stops the
// running snippet (JShell.stop); the context and its state survive.

import java.io.ByteArrayOutputStream;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.io.PrintStream;
import java.io.PrintWriter;
import java.io.StringWriter;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.stream.Collectors;

import jdk.jshell.Diag;
import jdk.jshell.EvalException;
import jdk.jshell.ExpressionSnippet;
import jdk.jshell.JShell;
import jdk.jshell.Snippet;
import jdk.jshell.SnippetEvent;
import jdk.jshell.SourceCodeAnalysis;
import jdk.jshell.UnresolvedReferenceException;
import jdk.jshell.VarSnippet;

class JShellKernel {
    private static OutputStream events;
    private static volatile long currentId = -1;
    private static volatile boolean interrupted;
    private static JShell shell;

    public static void main(String[] args) throws Exception {
        String[] fds = String.valueOf(System.getenv("CODEINTERP_FDS")).split(",");
        if (fds.length != 2) {
            System.err.println("JShellKernel must be started by the code interpreter server");
            System.exit(2);
        }
        java.io.InputStream commands = new java.io.FileInputStream("/proc/self/fd/" + Integer.parseInt(fds[0]));
        events = new FileOutputStream("/proc/self/fd/" + Integer.parseInt(fds[1]));
        // Subclasses (the {}): println then writes its text and its line
        // end apart, two output entries as in E2B's Java kernel
        // (PrintStream itself writes them at once).
        System.setOut(new PrintStream(new EventStream("stdout"), true, StandardCharsets.UTF_8) {});
        System.setErr(new PrintStream(new EventStream("stderr"), true, StandardCharsets.UTF_8) {});
        shell = JShell.builder().executionEngine("local").build();
        sun.misc.Signal.handle(new sun.misc.Signal("INT"), sig -> {
            interrupted = true; // the snippets after the stopped one do not run
            shell.stop();
        });
        // Compile once now, so that the first execution is not the slow one.
        shell.eval("int $warm = 0;");
        shell.drop(shell.snippets().filter(s -> s.source().contains("$warm")).findFirst().get());
        Map<String, Object> ready = new LinkedHashMap<>();
        ready.put("ev", "ready");
        ready.put("java", System.getProperty("java.version"));
        send(ready);

        BufferedReader in = new BufferedReader(new InputStreamReader(commands, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            Map<String, Object> msg;
            try {
                Object v = new Json(line).value();
                if (!(v instanceof Map)) continue;
                @SuppressWarnings("unchecked") Map<String, Object> m = (Map<String, Object>) v;
                msg = m;
            } catch (IllegalArgumentException e) {
                continue;
            }
            Object op = msg.get("op");
            if ("execute".equals(op)) {
                execute(msg);
            } else if ("setenv".equals(op)) {
                setProperties(stringMap(msg.get("env")));
                Object unset = msg.get("unset");
                if (unset instanceof List) {
                    for (Object k : (List<?>) unset) {
                        if (k instanceof String) System.clearProperty((String) k);
                    }
                }
            }
        }
        System.exit(0);
    }

    private static Map<String, String> setProperties(Map<String, String> env) {
        Map<String, String> old = new HashMap<>();
        for (Map.Entry<String, String> e : env.entrySet()) {
            old.put(e.getKey(), System.getProperty(e.getKey()));
            System.setProperty(e.getKey(), e.getValue());
        }
        return old;
    }

    private static Map<String, String> stringMap(Object o) {
        Map<String, String> out = new LinkedHashMap<>();
        if (o instanceof Map) {
            for (Map.Entry<?, ?> e : ((Map<?, ?>) o).entrySet()) {
                if (e.getKey() instanceof String && e.getValue() instanceof String && !((String) e.getKey()).isEmpty()) {
                    out.put((String) e.getKey(), (String) e.getValue());
                }
            }
        }
        return out;
    }

    private static void execute(Map<String, Object> msg) {
        long id = msg.get("id") instanceof Number ? ((Number) msg.get("id")).longValue() : 0;
        Object code = msg.get("code");
        Map<String, String> old = setProperties(stringMap(msg.get("env")));
        interrupted = false;
        currentId = id;
        try {
            run(id, code instanceof String ? (String) code : "");
        } catch (Throwable t) {
            error(id, t.getClass().getSimpleName(), String.valueOf(t.getMessage()), stackTrace(t));
        } finally {
            System.out.flush();
            System.err.flush();
            currentId = -1;
            for (Map.Entry<String, String> e : old.entrySet()) {
                if (e.getValue() == null) System.clearProperty(e.getKey());
                else System.setProperty(e.getKey(), e.getValue());
            }
            Map<String, Object> done = new LinkedHashMap<>();
            done.put("ev", "done");
            done.put("id", id);
            send(done);
        }
    }

    private static void run(long id, String code) {
        SourceCodeAnalysis analysis = shell.sourceCodeAnalysis();
        String rest = code;
        String shown = null;
        while (!rest.isBlank()) {
            if (interrupted) {
                error(id, "KeyboardInterrupt", "Execution interrupted", "");
                return;
            }
            SourceCodeAnalysis.CompletionInfo info = analysis.analyzeCompletion(rest);
            if (info.completeness() == SourceCodeAnalysis.Completeness.EMPTY) break;
            if (!info.completeness().isComplete()) {
                error(id, "CompilationException", "incomplete input: " + rest.strip(), "");
                return;
            }
            shown = null;
            List<SnippetEvent> evs = shell.eval(info.source());
            for (SnippetEvent ev : evs) {
                if (ev.causeSnippet() != null) continue; // updates of dependent snippets
                if (interrupted) break; // stopped: reported below
                Snippet sn = ev.snippet();
                if (ev.status() == Snippet.Status.REJECTED) {
                    String diags = shell.diagnostics(sn).map(JShellKernel::describe)
                            .collect(Collectors.joining("\n"));
                    error(id, "CompilationException", diags.isEmpty() ? "the snippet was rejected" : diags,
                            sn.source().strip());
                    return;
                }
                if (ev.exception() != null) {
                    Throwable t = ev.exception();
                    String name = t instanceof EvalException ? ((EvalException) t).getExceptionClassName()
                            : t instanceof UnresolvedReferenceException ? "UnresolvedReferenceException"
                            : t.getClass().getName();
                    String value = t.getMessage() == null ? "" : t.getMessage();
                    if (t instanceof UnresolvedReferenceException) {
                        value = "unresolved reference in " + sn.source().strip();
                    }
                    String tb = stackTrace(t);
                    if (t instanceof EvalException) { // its first line names EvalException
                        int nl = tb.indexOf('\n');
                        tb = name + (value.isEmpty() ? "" : ": " + value) + (nl >= 0 ? tb.substring(nl) : "");
                    }
                    error(id, name, value, tb);
                    return;
                }
                shown = display(sn, ev.value());
            }
            rest = info.remaining();
        }
        if (interrupted) {
            error(id, "KeyboardInterrupt", "Execution interrupted", "");
            return;
        }
        if (shown != null) {
            Map<String, Object> data = new LinkedHashMap<>();
            data.put("text/plain", shown);
            Map<String, Object> res = new LinkedHashMap<>();
            res.put("ev", "result");
            res.put("id", id);
            res.put("data", data);
            res.put("main", true);
            send(res);
        }
    }

    // The text of an expression's value (a String without its quotes, as
    // E2B's Java kernel shows it), or null for statements and declarations.
    private static String display(Snippet sn, String value) {
        String type;
        if (sn instanceof VarSnippet && sn.subKind() == Snippet.SubKind.TEMP_VAR_EXPRESSION_SUBKIND) {
            type = ((VarSnippet) sn).typeName();
        } else if (sn instanceof ExpressionSnippet) {
            type = ((ExpressionSnippet) sn).typeName();
        } else {
            return null;
        }
        if (value == null || "void".equals(type) || "null".equals(value)) return null;
        if ("String".equals(type) || "java.lang.String".equals(type)) return unquote(value);
        return value;
    }

    private static String unquote(String s) {
        if (s.length() < 2 || s.charAt(0) != '"' || s.charAt(s.length() - 1) != '"') return s;
        StringBuilder b = new StringBuilder();
        for (int i = 1; i < s.length() - 1; i++) {
            char c = s.charAt(i);
            if (c != '\\' || i + 1 >= s.length() - 1) {
                b.append(c);
                continue;
            }
            char n = s.charAt(++i);
            switch (n) {
                case 'n': b.append('\n'); break;
                case 't': b.append('\t'); break;
                case 'r': b.append('\r'); break;
                case 'b': b.append('\b'); break;
                case 'f': b.append('\f'); break;
                case '0': case '1': case '2': case '3': case '4': case '5': case '6': case '7': {
                    // JShell writes other control characters as octal (\ooo).
                    int end = i, v = 0;
                    while (end < s.length() - 1 && end < i + 3 && s.charAt(end) >= '0' && s.charAt(end) <= '7') {
                        v = v * 8 + (s.charAt(end) - '0');
                        end++;
                    }
                    b.append((char) v);
                    i = end - 1;
                    break;
                }
                case 'u':
                    if (i + 4 < s.length() - 1) {
                        try {
                            b.append((char) Integer.parseInt(s.substring(i + 1, i + 5), 16));
                            i += 4;
                            break;
                        } catch (NumberFormatException e) {
                            // as is
                        }
                    }
                    b.append("\\u");
                    break;
                default: b.append(n);
            }
        }
        return b.toString();
    }

    private static String describe(Diag d) {
        return d.getMessage(Locale.ROOT);
    }

    private static String stackTrace(Throwable t) {
        StringWriter w = new StringWriter();
        t.printStackTrace(new PrintWriter(w));
        return w.toString();
    }

    private static void error(long id, String name, String value, String traceback) {
        Map<String, Object> ev = new LinkedHashMap<>();
        ev.put("ev", "error");
        ev.put("id", id);
        ev.put("name", name);
        ev.put("value", value);
        ev.put("traceback", traceback);
        send(ev);
    }

    static synchronized void send(Map<String, Object> ev) {
        try {
            events.write((Json.encode(ev) + "\n").getBytes(StandardCharsets.UTF_8));
            events.flush();
        } catch (IOException e) {
            Runtime.getRuntime().halt(0); // the server is gone
        }
    }

    // System.out / System.err of user code: each write is an event (whole
    // UTF-8 characters; a partial one waits for its remaining bytes).
    static final class EventStream extends OutputStream {
        private final String name;
        private final ByteArrayOutputStream buf = new ByteArrayOutputStream();

        EventStream(String name) {
            this.name = name;
        }

        @Override
        public synchronized void write(int b) {
            buf.write(b);
            if (b == '\n') flush();
        }

        @Override
        public synchronized void write(byte[] b, int off, int len) {
            buf.write(b, off, len);
            flush();
        }

        @Override
        public synchronized void flush() {
            byte[] bytes = buf.toByteArray();
            int end = bytes.length;
            // Keep an incomplete trailing UTF-8 sequence for the next write.
            int i = end - 1, cont = 0;
            while (i >= 0 && (bytes[i] & 0xC0) == 0x80 && cont < 3) {
                i--;
                cont++;
            }
            if (i >= 0 && (bytes[i] & 0x80) != 0) {
                int need = (bytes[i] & 0xE0) == 0xC0 ? 1 : (bytes[i] & 0xF0) == 0xE0 ? 2 : (bytes[i] & 0xF8) == 0xF0 ? 3 : 0;
                if (need > cont) end = i;
            }
            if (end == 0) return;
            Map<String, Object> ev = new LinkedHashMap<>();
            ev.put("ev", name);
            long id = currentId;
            ev.put("id", id < 0 ? null : id);
            ev.put("text", new String(bytes, 0, end, StandardCharsets.UTF_8));
            send(ev);
            buf.reset();
            buf.write(bytes, end, bytes.length - end);
        }
    }

    // A small JSON reader and writer for the command channel.
    static final class Json {
        private final String s;
        private int i;

        Json(String s) {
            this.s = s;
        }

        Object value() {
            Object v = read();
            ws();
            if (i != s.length()) throw new IllegalArgumentException("trailing data");
            return v;
        }

        private void ws() {
            while (i < s.length() && " \t\r\n".indexOf(s.charAt(i)) >= 0) i++;
        }

        private Object read() {
            ws();
            if (i >= s.length()) throw new IllegalArgumentException("end of input");
            char c = s.charAt(i);
            if (c == '{') {
                i++;
                Map<String, Object> m = new LinkedHashMap<>();
                ws();
                if (peek('}')) return m;
                do {
                    ws();
                    String k = string();
                    ws();
                    expect(':');
                    m.put(k, read());
                    ws();
                } while (peek(','));
                expect('}');
                return m;
            }
            if (c == '[') {
                i++;
                List<Object> l = new ArrayList<>();
                ws();
                if (peek(']')) return l;
                do {
                    l.add(read());
                    ws();
                } while (peek(','));
                expect(']');
                return l;
            }
            if (c == '"') return string();
            if (s.startsWith("true", i)) { i += 4; return Boolean.TRUE; }
            if (s.startsWith("false", i)) { i += 5; return Boolean.FALSE; }
            if (s.startsWith("null", i)) { i += 4; return null; }
            int start = i;
            while (i < s.length() && "+-0123456789.eE".indexOf(s.charAt(i)) >= 0) i++;
            try {
                return Double.valueOf(s.substring(start, i));
            } catch (NumberFormatException e) {
                throw new IllegalArgumentException("bad value at " + start);
            }
        }

        private boolean peek(char c) {
            if (i < s.length() && s.charAt(i) == c) {
                i++;
                return true;
            }
            return false;
        }

        private void expect(char c) {
            if (!peek(c)) throw new IllegalArgumentException("expected " + c + " at " + i);
        }

        private String string() {
            expect('"');
            StringBuilder b = new StringBuilder();
            while (true) {
                if (i >= s.length()) throw new IllegalArgumentException("unterminated string");
                char c = s.charAt(i++);
                if (c == '"') return b.toString();
                if (c != '\\') {
                    b.append(c);
                    continue;
                }
                if (i >= s.length()) throw new IllegalArgumentException("unterminated string");
                char e = s.charAt(i++);
                switch (e) {
                    case 'n': b.append('\n'); break;
                    case 't': b.append('\t'); break;
                    case 'r': b.append('\r'); break;
                    case 'b': b.append('\b'); break;
                    case 'f': b.append('\f'); break;
                    case 'u':
                        if (i + 4 > s.length()) throw new IllegalArgumentException("bad escape");
                        try {
                            b.append((char) Integer.parseInt(s.substring(i, i + 4), 16));
                        } catch (NumberFormatException x) {
                            throw new IllegalArgumentException("bad escape");
                        }
                        i += 4;
                        break;
                    default: b.append(e);
                }
            }
        }

        static String encode(Object o) {
            if (o == null) return "null";
            if (o instanceof Boolean || o instanceof Long || o instanceof Integer) return o.toString();
            if (o instanceof Map) {
                StringBuilder b = new StringBuilder("{");
                for (Map.Entry<?, ?> e : ((Map<?, ?>) o).entrySet()) {
                    if (b.length() > 1) b.append(',');
                    b.append(encode(String.valueOf(e.getKey()))).append(':').append(encode(e.getValue()));
                }
                return b.append('}').toString();
            }
            String s = o.toString();
            StringBuilder b = new StringBuilder("\"");
            for (int k = 0; k < s.length(); k++) {
                char c = s.charAt(k);
                if (c == '"' || c == '\\') b.append('\\').append(c);
                else if (c < 0x20 || c == 0x2028 || c == 0x2029) b.append(String.format("\\u%04x", (int) c));
                else b.append(c);
            }
            return b.append('"').toString();
        }
    }
}
