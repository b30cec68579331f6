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
# Stopped before the D-Bus daemon: Chromium aborts when its bus goes away.
After=agentvm-xvfb.service agentvm-wm.service dbus.service
BindsTo=agentvm-xvfb.service

[Service]
User=user
Group=user
WorkingDirectory=/home/user
Environment=HOME=/home/user DISPLAY=:99
# A lock left by the last boot names another host (the template's, or the
# VM's before a rename): Chromium would refuse the profile.
ExecStartPre=/bin/rm -f ` + BrowserProfile + `/SingletonLock ` + BrowserProfile + `/SingletonSocket ` + BrowserProfile + `/SingletonCookie
ExecStart=/usr/bin/chromium` + flags + ` about:blank
# Chromium writes cookies every 30 s, and at a quit. On a signal it saves
# its tabs but not the cookies of the last 30 s (measured: a cookie set just
# before a stop, under SIGTERM and under SIGINT, was gone after the start);
# the DevTools protocol's Browser.close quits it the way a user does.
ExecStop=/usr/bin/python3 ` + browserCloseScript + `
KillSignal=SIGINT
KillMode=mixed
TimeoutStopSec=20
Restart=always
RestartSec=1s

[Install]
WantedBy=multi-user.target
`
}

// browserCloseScript asks Chromium to quit over its DevTools protocol
// (Browser.close) and waits for it to exit. Python's standard library has
// no WebSocket client: this speaks the one frame it needs.
const browserCloseScript = "/usr/local/lib/agentvm/browser-close.py"

const browserClose = `import base64, json, os, socket, sys, time, urllib.request

def main():
    v = json.load(urllib.request.urlopen("http://127.0.0.1:9222/json/version", timeout=5))
    path = "/" + v["webSocketDebuggerUrl"].split("/", 3)[3]
    s = socket.create_connection(("127.0.0.1", 9222), timeout=5)
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(("GET %s HTTP/1.1\r\nHost: 127.0.0.1:9222\r\nUpgrade: websocket\r\n"
               "Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n" % (path, key)).encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(4096)
        if not chunk:
            return
        head += chunk
    if b" 101 " not in head.split(b"\r\n", 1)[0]:
        return
    payload = json.dumps({"id": 1, "method": "Browser.close"}).encode()
    mask = os.urandom(4)
    s.sendall(bytes([0x81, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))
    s.settimeout(20)
    try:
        while s.recv(4096):
            pass
    except OSError:
        pass
    pid = os.environ.get("MAINPID", "")
    deadline = time.time() + 20
    while pid and os.path.exists("/proc/" + pid) and time.time() < deadline:
        time.sleep(0.1)

try:
    main()
except Exception as e:
    print("browser-close: %s" % e, file=sys.stderr)
`

// chromiumPolicy: reopen the last session's tabs at start (after a stop and
// start of the VM), download without asking, no sign-in or password prompts.
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
  "HardwareAccelerationModeEnabled": false
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

// browserReady: the DevTools protocol answers with a page open, and the
// framebuffer file exists.
const browserReady = `test -s ` + BrowserFramebuffer + ` && curl -sf --max-time 5 http://127.0.0.1:9222/json/list | grep -q '"type": "page"'`

var browserFlavor = flavor{
	name: Browser,
	packages: []string{
		"chromium", "chromium-sandbox", "xvfb", "openbox", "x11vnc",
		"fonts-noto-cjk", "fonts-noto-color-emoji", "fonts-liberation", "fonts-dejavu-core",
		// For QA of apps with a database (README "Browser agents"): installed,
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
		{browserCloseScript, 0o755, browserClose},
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
