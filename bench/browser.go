package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/cdp"
	"github.com/agentvm/agentvm/pkg/client"
)

// The browser benchmark, each figure against a baseline measured in the
// same run:
//   - create of a browser VM to Chromium's answer to Browser.getVersion over
//     CDP (through the API's TCP tunnel), from the template and from the warm
//     pool, against starting Chromium in a running VM (what a create would
//     cost if it booted the browser instead of restoring it) and against
//     create-to-first-exec of a default VM;
//   - a screenshot of the display through the API (PNG), against CDP's
//     Page.captureScreenshot of the page through the tunnel;
//   - a live fork of a VM with an open page to both children answering CDP
//     (with the page), against the fork of a default VM to both children
//     answering an exec.

// BrowserReport is the result of -browser.
type BrowserReport struct {
	CreateTemplate  Stats   `json:"create_to_cdp_template"`
	CreatePool      Stats   `json:"create_to_cdp_warm_pool"`
	ChromiumStart   Stats   `json:"chromium_start_to_cdp"`
	CreateExec      Stats   `json:"create_to_first_exec_default_image"`
	StartRatio      float64 `json:"chromium_start_over_create_ratio"`
	Screenshot      Stats   `json:"screenshot_api"`
	ScreenshotHalf  Stats   `json:"screenshot_api_scale_0_5"`
	CDPScreenshot   Stats   `json:"cdp_page_capture_screenshot"`
	ForkBrowser     Stats   `json:"fork_open_page_to_children_cdp"`
	ForkDefault     Stats   `json:"fork_default_to_children_exec"`
	ForkPauseMs     Stats   `json:"fork_parent_pause_ms"`
	ScreenshotBytes int     `json:"screenshot_png_bytes"`
}

var browserShape = api.CreateVMRequest{Image: "browser", Memory: 1 << 30}

// browserOf is a CDP client of a VM's Chromium through c's TCP tunnel.
func browserOf(c *client.Client, id string) *cdp.Browser {
	return cdp.New(func(ctx context.Context) (net.Conn, error) { return c.DialTCP(ctx, id, client.BrowserCDPPort) })
}

// waitCDP waits until the VM's Chromium answers Browser.getVersion (and, with
// page set, until a tab shows a URL starting with it).
func waitCDP(ctx context.Context, c *client.Client, id, page string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	b := browserOf(c, id)
	var last error
	for ctx.Err() == nil {
		last = func() error {
			conn, err := b.Conn(ctx)
			if err != nil {
				return err
			}
			defer conn.Close()
			var v struct {
				Product string `json:"product"`
			}
			if err := conn.Call(ctx, "Browser.getVersion", nil, &v); err != nil {
				return err
			}
			if v.Product == "" {
				return fmt.Errorf("Browser.getVersion: no product")
			}
			if page == "" {
				return nil
			}
			pages, err := b.Pages(ctx)
			if err != nil {
				return err
			}
			for _, p := range pages {
				if len(p.URL) >= len(page) && p.URL[:len(page)] == page {
					return nil
				}
			}
			return fmt.Errorf("no tab shows %s", page)
		}()
		if last == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s: CDP did not answer: %v", id, last)
}

func (b *bench) runBrowser(ctx context.Context) error {
	r := &BrowserReport{}
	b.r.Browser = r
	c := b.c
	logf("browser: first create (builds the image and template when missing; not measured)")
	v, err := c.CreateVM(ctx, browserShape)
	if err != nil {
		return err
	}
	b.track(v.ID, v.PID)
	if err := waitCDP(ctx, c, v.ID, ""); err != nil {
		return err
	}

	// Screenshots: the display through the API, the page through CDP.
	const page = "data:text/html,<title>bench</title><body style='margin:0;background:linear-gradient(90deg,red,blue)'><h1>agentvm bench</h1>"
	br := browserOf(c, v.ID)
	pages, err := br.Pages(ctx)
	if err != nil || len(pages) == 0 {
		return fmt.Errorf("pages: %v (%d)", err, len(pages))
	}
	pc, err := br.Page(ctx, pages[0].ID)
	if err != nil {
		return err
	}
	defer pc.Close()
	if err := pc.Call(ctx, "Page.navigate", map[string]any{"url": page}, nil); err != nil {
		return err
	}
	if err := waitCDP(ctx, c, v.ID, "data:text/html,<title>bench"); err != nil {
		return err
	}
	logf("browser: %d screenshots through the API and through CDP", b.o.execs)
	var api1, apiHalf, viaCDP []float64
	for i := 0; i < 3+b.o.execs; i++ {
		t0 := time.Now()
		png, err := c.Screenshot(ctx, v.ID, 0)
		if err != nil {
			return err
		}
		t1 := time.Now()
		if _, err := c.Screenshot(ctx, v.ID, 0.5); err != nil {
			return err
		}
		t2 := time.Now()
		var shot struct {
			Data string `json:"data"`
		}
		if err := pc.Call(ctx, "Page.captureScreenshot", map[string]any{"format": "png"}, &shot); err != nil {
			return err
		}
		if i >= 3 {
			api1 = append(api1, millis(t1.Sub(t0)))
			apiHalf = append(apiHalf, millis(t2.Sub(t1)))
			viaCDP = append(viaCDP, millis(time.Since(t2)))
		}
		r.ScreenshotBytes = len(png)
	}
	r.Screenshot, r.ScreenshotHalf, r.CDPScreenshot = summarize(api1), summarize(apiHalf), summarize(viaCDP)

	// Starting Chromium in a running VM: the work a create skips.
	logf("browser: 3 Chromium starts in a running VM (baseline)")
	var starts []float64
	for range 3 {
		t0 := time.Now()
		if _, err := c.Exec(ctx, v.ID, api.ExecRequest{Cmd: []string{"systemctl", "restart", "agentvm-chromium"}}); err != nil {
			return err
		}
		if err := waitCDP(ctx, c, v.ID, ""); err != nil {
			return err
		}
		starts = append(starts, millis(time.Since(t0)))
	}
	r.ChromiumStart = summarize(starts)

	// Fork with an open page, against a default VM's fork.
	logf("browser: 3 forks of a VM with an open page, and of a default VM")
	pc.Call(ctx, "Page.navigate", map[string]any{"url": page}, nil)
	if err := waitCDP(ctx, c, v.ID, "data:text/html,<title>bench"); err != nil {
		return err
	}
	d, err := c.CreateVM(ctx, api.CreateVMRequest{Memory: 1 << 30})
	if err != nil {
		return err
	}
	b.track(d.ID, d.PID)
	var forkB, forkD, pause []float64
	for range 3 {
		ms, p, err := b.forkTo(ctx, v.ID, func(id string) error { return waitCDP(ctx, c, id, "data:text/html,<title>bench") })
		if err != nil {
			return err
		}
		forkB, pause = append(forkB, ms), append(pause, p)
		ms, _, err = b.forkTo(ctx, d.ID, func(id string) error {
			_, err := c.Exec(ctx, id, api.ExecRequest{Cmd: []string{"true"}})
			return err
		})
		if err != nil {
			return err
		}
		forkD = append(forkD, ms)
	}
	r.ForkBrowser, r.ForkDefault, r.ForkPauseMs = summarize(forkB), summarize(forkD), summarize(pause)
	pc.Close()
	for _, id := range []string{v.ID, d.ID} {
		if err := b.remove(id); err != nil {
			return err
		}
	}

	logf("browser: %d creates to a CDP answer from the template (and default creates to first exec)", b.o.creates)
	var tpl, plain []float64
	for i := 0; i < b.o.creates; i++ {
		t0 := time.Now()
		v, err := c.CreateVM(ctx, browserShape)
		if err != nil {
			return err
		}
		b.track(v.ID, v.PID)
		if err := waitCDP(ctx, c, v.ID, ""); err != nil {
			return err
		}
		tpl = append(tpl, millis(time.Since(t0)))
		if err := b.remove(v.ID); err != nil {
			return err
		}
		t0 = time.Now()
		d, err := c.CreateVM(ctx, api.CreateVMRequest{Memory: 1 << 30})
		if err != nil {
			return err
		}
		b.track(d.ID, d.PID)
		if _, err := c.Exec(ctx, d.ID, api.ExecRequest{Cmd: []string{"true"}}); err != nil {
			return err
		}
		plain = append(plain, millis(time.Since(t0)))
		if err := b.remove(d.ID); err != nil {
			return err
		}
	}
	r.CreateTemplate, r.CreateExec = summarize(tpl), summarize(plain)
	if r.CreateTemplate.P50 > 0 {
		r.StartRatio = r.ChromiumStart.P50 / r.CreateTemplate.P50
	}

	logf("browser: %d creates to a CDP answer from the warm pool", b.o.creates)
	srv, err := b.startPoolServer(ctx, "browserpool")
	if err != nil {
		return err
	}
	defer srv.stop()
	pcl := srv.client
	first, err := pcl.CreateVM(ctx, browserShape) // a miss that starts the refill
	if err != nil {
		return err
	}
	defer pcl.DeleteVM(context.Background(), first.ID)
	var pool []float64
	for i := 0; i < b.o.creates; i++ {
		if err := waitPool(ctx, pcl.Health, "browser/1x1024"); err != nil {
			return err
		}
		t0 := time.Now()
		v, err := pcl.CreateVM(ctx, browserShape)
		if err != nil {
			return err
		}
		if err := waitCDP(ctx, pcl, v.ID, ""); err != nil {
			pcl.DeleteVM(context.Background(), v.ID)
			return err
		}
		pool = append(pool, millis(time.Since(t0)))
		if err := pcl.DeleteVM(ctx, v.ID); err != nil {
			return err
		}
	}
	r.CreatePool = summarize(pool)
	return nil
}

// forkTo forks id into two children and times the call until ready says
// both answer; it returns that time and the parent's pause, and deletes the
// children.
func (b *bench) forkTo(ctx context.Context, id string, ready func(id string) error) (float64, float64, error) {
	t0 := time.Now()
	fr, err := b.c.Fork(ctx, id, 2)
	if err != nil {
		return 0, 0, err
	}
	for _, k := range fr.Children {
		b.track(k.ID, k.PID)
	}
	defer func() {
		for _, k := range fr.Children {
			b.remove(k.ID)
		}
	}()
	errs := make(chan error, len(fr.Children))
	for _, k := range fr.Children {
		go func() { errs <- ready(k.ID) }()
	}
	for range fr.Children {
		if err := <-errs; err != nil {
			return 0, 0, err
		}
	}
	return millis(time.Since(t0)), float64(fr.ParentPauseMs), nil
}

// PrintBrowser writes the -browser report.
func (r *Report) PrintBrowser(w io.Writer) {
	br := r.Browser
	if br == nil {
		return
	}
	fmt.Fprintln(w, "Browser image (1 vCPU, 1 GiB), same server, same run")
	statsLine(w, "create -> CDP getVersion (template)", br.CreateTemplate)
	statsLine(w, "create -> CDP getVersion (warm pool)", br.CreatePool)
	statsLine(w, "Chromium start -> CDP (baseline)", br.ChromiumStart)
	statsLine(w, "default create -> first exec", br.CreateExec)
	ratioLine(w, "Chromium start / create from template", br.StartRatio)
	statsLine(w, "screenshot, API (PNG of display)", br.Screenshot)
	statsLine(w, "screenshot, API, scale 0.5", br.ScreenshotHalf)
	statsLine(w, "CDP Page.captureScreenshot (base)", br.CDPScreenshot)
	ratioLine(w, "API screenshot / CDP page screenshot p50", ratio(br.Screenshot.P50, br.CDPScreenshot.P50))
	statsLine(w, "fork, open page -> 2 children CDP", br.ForkBrowser)
	statsLine(w, "fork, default -> 2 children exec", br.ForkDefault)
	statsLine(w, "fork parent pause (browser VM)", br.ForkPauseMs)
	ratioLine(w, "browser fork / default fork p50", ratio(br.ForkBrowser.P50, br.ForkDefault.P50))
	fmt.Fprintf(w, "  screenshot PNG: %d bytes (1280x800)\n", br.ScreenshotBytes)
}
