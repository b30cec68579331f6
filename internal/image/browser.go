package image

// The browser image: Chromium on a virtual X display, for browser and QA
// agents. The template is saved with the display, the window manager and
// Chromium already running, so a create restores a live browser.
//
// Everything listens on the guest's loopback only: the daemon reaches those
// ports through the guest agent (vm.Service.DialPort falls back to a dial
// from inside the guest), so neither the DevTools protocol nor VNC is open
// to the VM's network peers (other VMs on a private network).

// Browser is the name of the browser image.
const Browser = "browser"

// Where the browser image's services listen (on the guest's 127.0.0.1).
const (
	// BrowserCDPPort is Chromium's DevTools protocol port.
	BrowserCDPPort = 9222
	// BrowserVNCPort is the display's VNC port (x11vnc, started per
	// connection by a systemd socket).
	BrowserVNCPort = 5900
)

// BrowserFramebuffer is the display's framebuffer as an XWD file (Xvfb
// -fbdir maps its screen there): a screenshot is a read of this file.
const BrowserFramebuffer = "/run/agentvm-display/Xvfb_screen0"

// BrowserProfile is Chromium's user data dir (profile, cookies, local
// storage, session); downloads go to /home/user/Downloads.
const BrowserProfile = "/home/user/.config/agentvm-browser"

const browserDisplay = ":99"

const xvfbUnit = `[Unit]
Description=agentvm display :99 (Xvfb; its framebuffer in /run/agentvm-display for screenshots)

[Service]
User=user
Group=user
RuntimeDirectory=agentvm-display
RuntimeDirectoryMode=0755
# -s 0 -dpms: never blank the screen. -fbdir: the screen as an XWD file.
ExecStart=/usr/bin/Xvfb ` + browserDisplay + ` -screen 0 1280x800x24 -fbdir /run/agentvm-display -nolisten tcp -s 0 -dpms -noreset
ExecStartPost=/bin/sh -c 'for i in $(seq 300); do [ -S /tmp/.X11-unix/X99 ] && exit 0; sleep 0.1; done; exit 1'
Restart=always
RestartSec=500ms

[Install]
WantedBy=multi-user.target
`

const wmUnit = `[Unit]
Description=agentvm window manager on :99 (openbox)
After=agentvm-xvfb.service
BindsTo=agentvm-xvfb.service

[Service]
User=user
Group=user
Environment=HOME=/home/user DISPLAY=:99
ExecStart=/usr/bin/openbox
Restart=always
RestartSec=500ms

[Install]
WantedBy=multi-user.target
`

// chromiumFlags: DevTools on loopback, a profile that is not the default
// one (Chromium ignores --remote-debugging-port for the default data dir),
// no first-run or keyring prompts, no background traffic or updates, no
// GPU (there is none), and background tabs that keep running (an agent
// drives several; throttled timers make them look hung).
var chromiumFlags = []string{
	"--remote-debugging-port=9222",
	"--user-data-dir=" + BrowserProfile,
	"--no-first-run", "--no-default-browser-check", "--password-store=basic",
	"--disable-gpu", "--force-device-scale-factor=1", "--start-maximized",
	"--disable-background-networking", "--disable-component-update", "--disable-sync",
	"--disable-breakpad", "--disable-domain-reliability", "--no-pings", "--noerrdialogs",
	"--disable-features=Translate,MediaRouter,OptimizationHints,DialMediaRouteProvider,AutofillServerCommunication",
	// The network service (and with it the cookie store) in the browser
	// process: one process less to run, and its writes finish before the
	// browser exits (as with Puppeteer's own launches).
	"--enable-features=NetworkServiceInProcess2",
	"--disable-background-timer-throttling", "--disable-renderer-backgrounding",
	"--disable-backgrounding-occluded-windows", "--hide-crash-restore-bubble",
}

func chromiumUnit() string {
	flags := ""
	for _, f := range chromiumFlags {
		flags += " " + f
	}
	return `[Unit]
Description=agentvm browser (Chromium on :99; DevTools protocol on 127.0.0.1:9222)
After=agentvm-xvfb.service agentvm-wm.service
BindsTo=agentvm-xvfb.service

[Service]
User=user
Group=user
WorkingDirectory=/home/user
# No system D-Bus: when the power button is pressed logind announces the
# shutdown there, and Chromium then exits at once as on SIGTERM (below);
# it also aborts when the bus goes away. It needs nothing from it.
Environment=HOME=/home/user DISPLAY=:99 DBUS_SYSTEM_BUS_ADDRESS=unix:path=/nonexistent
# A lock left by the last boot names another host (the template's, or the
# VM's before a rename): Chromium would refuse the profile.
ExecStartPre=/bin/rm -f ` + BrowserProfile + `/SingletonLock ` + BrowserProfile + `/SingletonSocket ` + BrowserProfile + `/SingletonCookie
ExecStart=/usr/bin/chromium` + flags + ` about:blank
# Chromium writes cookies every 30 s, and when it quits. On SIGTERM it
# assumes the session is ending, saves its tabs and exits at once, without
# the cookies of the last 30 s (measured: a cookie set just before a stop
# was gone after the start); SIGINT quits it the way a user does.
KillSignal=SIGINT
KillMode=mixed
TimeoutStopSec=20
Restart=always
RestartSec=1s

[Install]
WantedBy=multi-user.target
`
}

// chromiumPolicy: reopen the last session's tabs at start (after a stop and
// start of the VM), download without asking, no sign-in or password prompts,
// no on-device AI model (Chromium 156 starts loading one a few minutes after
// start, at a cost in CPU that emulation makes large).
const chromiumPolicy = `{
  "RestoreOnStartup": 1,
  "DownloadDirectory": "/home/user/Downloads",
  "PromptForDownloadLocation": false,
  "DefaultBrowserSettingEnabled": false,
  "MetricsReportingEnabled": false,
  "BrowserSignin": 0,
  "SyncDisabled": true,
  "TranslateEnabled": false,
  "PasswordManagerEnabled": false,
  "BackgroundModeEnabled": false,
  "HardwareAccelerationModeEnabled": false,
  "GenAILocalFoundationalModelSettings": 1
}
`

const vncSocket = `[Unit]
Description=agentvm VNC of display :99 (127.0.0.1:5900; x11vnc per connection)

[Socket]
ListenStream=127.0.0.1:5900
Accept=yes

[Install]
WantedBy=sockets.target
`

// One x11vnc per viewer, started on connection: nothing polls the screen
// while nobody watches (under emulation an idle poller costs real CPU).
const vncUnit = `[Unit]
Description=agentvm VNC session on :99
After=agentvm-xvfb.service

[Service]
User=user
Group=user
Environment=HOME=/home/user
ExecStart=/usr/bin/x11vnc -inetd -quiet -display :99 -nopw -shared -noxrecord -nodpms -xkb -norc
StandardInput=socket
StandardOutput=socket
StandardError=journal
`

// browserReady: the framebuffer file exists and Chromium answers the
// DevTools protocol over its WebSockets, a tab evaluating JavaScript and the
// browser its version. The template is saved once it does; a warm-pool VM
// runs it too, so the first CDP session of a VM claimed from the pool finds
// that code already translated by its QEMU (under emulation the first
// session in a fresh QEMU process takes seconds).
const browserReady = `test -s ` + BrowserFramebuffer + ` && python3 ` + browserReadyScript + ` >/dev/null`

// browserReadyScript is the DevTools round trip of browserReady, in
// Python's standard library (which has no WebSocket client: it speaks the
// few frames it needs). It prints the browser's product.
const browserReadyScript = "/usr/local/lib/agentvm/browser-ready.py"

const browserReadyPy = `import json, os, socket, sys

PORT = 9222


def connect():
    return socket.create_connection(("127.0.0.1", PORT), timeout=20)


def get(path):
    s = connect()
    s.sendall(("GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % (path, PORT)).encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            raise RuntimeError("%s: closed" % path)
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    if b" 200 " not in lines[0]:
        raise RuntimeError("%s: %r" % (path, lines[0]))
    size = [int(l.split(b":", 1)[1]) for l in lines if l.lower().startswith(b"content-length:")][0]
    while len(body) < size:
        chunk = s.recv(65536)
        if not chunk:
            raise RuntimeError("%s: closed" % path)
        body += chunk
    return json.loads(body)


def call(ws_url, method, params):
    path = "/" + ws_url.split("/", 3)[3]
    s = connect()
    s.sendall(("GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               "Sec-WebSocket-Key: YWdlbnR2bS1icm93c2VyLTE=\r\nSec-WebSocket-Version: 13\r\n\r\n" % (path, PORT)).encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            raise RuntimeError("closed during the handshake")
        data += chunk
    head, _, data = data.partition(b"\r\n\r\n")
    if b" 101 " not in head.split(b"\r\n", 1)[0]:
        raise RuntimeError("no WebSocket: %r" % head[:80])
    payload = json.dumps({"id": 1, "method": method, "params": params}).encode()
    n = len(payload)
    hdr = bytes([0x81, 0x80 | n]) if n < 126 else bytes([0x81, 0xfe]) + n.to_bytes(2, "big")
    mask = os.urandom(4)
    s.sendall(hdr + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def need(k):
        nonlocal data
        while len(data) < k:
            chunk = s.recv(65536)
            if not chunk:
                raise RuntimeError("closed before the answer")
            data += chunk

    while True:
        need(2)
        ln, off = data[1] & 0x7f, 2
        if ln == 126:
            need(4)
            ln, off = int.from_bytes(data[2:4], "big"), 4
        elif ln == 127:
            need(10)
            ln, off = int.from_bytes(data[2:10], "big"), 10
        need(off + ln)
        frame, data = data[off:off + ln], data[off + ln:]
        try:
            m = json.loads(frame)
        except ValueError:
            continue
        if m.get("id") == 1:
            if "error" in m:
                raise RuntimeError("%s: %s" % (method, m["error"]))
            return m["result"]


pages = [t for t in get("/json/list") if t.get("type") == "page"]
if not pages:
    sys.exit("no page open")
r = call(pages[0]["webSocketDebuggerUrl"], "Runtime.evaluate", {"expression": "6 * 7", "returnByValue": True})
if r.get("result", {}).get("value") != 42:
    sys.exit("Runtime.evaluate: %r" % r)
v = call(get("/json/version")["webSocketDebuggerUrl"], "Browser.getVersion", {})
print(v.get("product", ""))
`

var browserFlavor = flavor{
	name: Browser,
	packages: []string{
		"chromium", "chromium-sandbox", "xvfb", "openbox", "x11vnc",
		"fonts-noto-cjk", "fonts-noto-color-emoji", "fonts-liberation", "fonts-dejavu-core",
		// For QA of apps with a database (docs/browser.md): installed,
		// not running; systemctl start postgresql starts it in seconds, where
		// installing it in a VM under emulation takes minutes.
		"postgresql", "python3-psycopg2",
	},
	files: []recipeFile{
		{"/etc/systemd/system/agentvm-xvfb.service", 0o644, xvfbUnit},
		{"/etc/systemd/system/agentvm-wm.service", 0o644, wmUnit},
		{"/etc/systemd/system/agentvm-chromium.service", 0o644, chromiumUnit()},
		{"/etc/systemd/system/agentvm-vnc.socket", 0o644, vncSocket},
		{"/etc/systemd/system/agentvm-vnc@.service", 0o644, vncUnit},
		{"/etc/chromium/policies/managed/agentvm.json", 0o644, chromiumPolicy},
		{browserReadyScript, 0o755, browserReadyPy},
	},
	script: `set -eu
for u in agentvm-xvfb.service agentvm-wm.service agentvm-chromium.service; do
	ln -sf /etc/systemd/system/$u /etc/systemd/system/multi-user.target.wants/$u
done
mkdir -p /etc/systemd/system/sockets.target.wants
ln -sf /etc/systemd/system/agentvm-vnc.socket /etc/systemd/system/sockets.target.wants/agentvm-vnc.socket
rm -f /etc/systemd/system/multi-user.target.wants/postgresql.service
install -d -o user -g user -m 0755 /home/user/Downloads /home/user/.config
install -d -o user -g user -m 0700 ` + BrowserProfile + `
`,
	ready: []string{"sh", "-c", browserReady},
}
