package server

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"image/png"
	"io"
	"net/http"
	"testing"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/budget"
	"github.com/agentvm/agentvm/internal/guest"
	"github.com/agentvm/agentvm/internal/image"
)

// xwd is a 4x2 XWD file of 32-bit pixels (Xvfb's layout on x86).
func xwd() []byte {
	var b bytes.Buffer
	name := []byte("Xvfb test\x00")
	h := []uint32{uint32(100 + len(name)), 7, 2, 24, 4, 2, 0, 0, 32, 0, 32, 32, 16, 4,
		0xff0000, 0xff00, 0xff, 8, 0, 0, 4, 2, 0, 0, 0}
	binary.Write(&b, binary.BigEndian, h)
	b.Write(name)
	for i := 0; i < 8; i++ {
		b.Write([]byte{byte(i * 30), 0x40, 0xc0, 0}) // B, G, R, pad (LSB first)
	}
	return b.Bytes()
}

func TestScreenshot(t *testing.T) {
	fb := xwd()
	agent := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != guest.PathFiles || r.URL.Query().Get("path") != image.BrowserFramebuffer {
			w.WriteHeader(http.StatusNotFound)
			json.NewEncoder(w).Encode(guest.ErrorEnvelope{Error: &guest.APIError{Code: "not_found", Message: "no such file"}})
			return
		}
		w.Write(fb)
	})
	ts := newTestServer(t, agent)
	get := func(path, secret string) (*http.Response, []byte) {
		resp := ts.do(t, "GET", path, secret)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, b
	}
	resp, body := get("/v1/vms/web/screenshot", testAdmin)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "image/png" {
		t.Fatalf("screenshot: %d %s", resp.StatusCode, body)
	}
	img, err := png.Decode(bytes.NewReader(body))
	if err != nil || img.Bounds().Dx() != 4 || img.Bounds().Dy() != 2 {
		t.Fatalf("png: %v %v", err, img)
	}
	if r, g, b, _ := img.At(1, 0).RGBA(); r>>8 != 0xc0 || g>>8 != 0x40 || b>>8 != 30 {
		t.Fatalf("pixel (1,0) = %d %d %d", r>>8, g>>8, b>>8)
	}
	resp, body = get("/v1/vms/web/screenshot?scale=0.5", testAdmin)
	if img, err := png.Decode(bytes.NewReader(body)); resp.StatusCode != 200 || err != nil || img.Bounds().Dx() != 2 {
		t.Fatalf("scale 0.5: %d %v", resp.StatusCode, err)
	}
	for _, bad := range []string{"0", "1.5", "x", "-1"} {
		if resp, _ := get("/v1/vms/web/screenshot?scale="+bad, testAdmin); resp.StatusCode != 400 {
			t.Errorf("scale %s: %d", bad, resp.StatusCode)
		}
	}
	// The display permission, and nothing else, opens it to a VM's token.
	noDisplay := ts.token(t, api.CreateTokenRequest{Allow: []string{api.PermExec, api.PermPreview}})
	if resp, _ := get("/v1/vms/web/screenshot", noDisplay.Secret); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("without display: %d", resp.StatusCode)
	}
	display := ts.token(t, api.CreateTokenRequest{Allow: []string{api.PermDisplay}})
	if resp, _ := get("/v1/vms/web/screenshot", display.Secret); resp.StatusCode != 200 {
		t.Fatalf("with display: %d", resp.StatusCode)
	}
	// A screenshot takes the screen's size from the daemon's memory
	// budget before it decodes it, and gives it back.
	ts.mem = budget.New(512 << 10)
	if resp, body := get("/v1/vms/web/screenshot", testAdmin); resp.StatusCode != http.StatusServiceUnavailable || !bytes.Contains(body, []byte("memory budget")) {
		t.Fatalf("over the budget: %d %s", resp.StatusCode, body)
	}
	ts.mem = budget.New(8 << 20)
	if resp, _ := get("/v1/vms/web/screenshot", testAdmin); resp.StatusCode != 200 || ts.mem.Used() != 0 {
		t.Fatalf("within the budget: %d, %d bytes still held", resp.StatusCode, ts.mem.Used())
	}
	// A VM without a display: 409 naming the image that has one.
	fb = nil
	agentless := newTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNotFound)
		json.NewEncoder(w).Encode(guest.ErrorEnvelope{Error: &guest.APIError{Code: "not_found", Message: "no such file"}})
	}))
	resp = agentless.do(t, "GET", "/v1/vms/web/screenshot", testAdmin)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict || !bytes.Contains(b, []byte("--image browser")) {
		t.Fatalf("no display: %d %s", resp.StatusCode, b)
	}
	// The live view is a WebSocket only.
	if resp, body := get("/v1/vms/web/vnc", testAdmin); resp.StatusCode != 400 {
		t.Fatalf("vnc without upgrade: %d %s", resp.StatusCode, body)
	}
}
