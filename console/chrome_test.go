package console_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
)

// chrome is a headless Chromium driven by a browser test, with
// screenshots saved for the documentation.
type chrome struct {
	t     *testing.T
	r     *rig
	ctx   context.Context
	shots string
}

// newChrome starts Chromium for the test (stopped when it ends); it
// accepts every confirmation a form asks for.
func newChrome(t *testing.T, r *rig) *chrome {
	t.Helper()
	exe := chromium(t)
	shots := os.Getenv(EnvScreenshots)
	if shots == "" {
		shots = t.TempDir()
	} else if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(r.ctx, 2*time.Minute)
	t.Cleanup(cancel)
	alloc, cancelAlloc := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(exe), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck, chromedp.WindowSize(1280, 860),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("user-data-dir", t.TempDir()))
	t.Cleanup(cancelAlloc)
	bctx, cancelBrowser := chromedp.NewContext(alloc)
	t.Cleanup(cancelBrowser)
	if err := chromedp.Do(bctx); err != nil { // start the browser
		t.Fatalf("start %s: %v", exe, err)
	}
	// Accept the confirmations a retry or an approval asks for.
	dialogs := chromedp.Events(bctx, page.JavascriptDialogOpening)
	go func() {
		for _, err := range dialogs {
			if err != nil {
				return
			}
			_, _ = chromedp.Call(bctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
		}
	}()
	return &chrome{t: t, r: r, ctx: bctx, shots: shots}
}

func (c *chrome) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	c.t.Helper()
	if err := chromedp.Do(c.ctx, steps...); err != nil {
		c.t.Fatalf("%s: %v", what, err)
	}
}

// shot saves a screenshot of the whole page as name.
func (c *chrome) shot(name string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		png, err := chromedp.FullScreenshot(100)(ctx, tg)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(c.shots, name), png, 0o644)
	})
}

func (c *chrome) signIn(u testUser) chromedp.Action[chromedp.Void] {
	return chromedp.Steps(
		chromedp.Navigate(c.r.url+"/"),
		chromedp.WaitVisible(chromedp.ID("login")),
		chromedp.SendKeys(chromedp.ID("name"), u.name),
		chromedp.SendKeys(chromedp.ID("password"), u.password),
		chromedp.Submit(chromedp.ID("login")),
		chromedp.WaitVisible(chromedp.ID("overview")),
	)
}

func (c *chrome) eval(what, js string) string {
	c.t.Helper()
	v, err := chromedp.Run(c.ctx, chromedp.Evaluate[string](js, chromedp.EvalAwaitPromise))
	if err != nil {
		c.t.Fatalf("%s: %v", what, err)
	}
	return v
}

// post sends a form POST from the page, as a script on the console's own
// origin could, and returns the status.
func (c *chrome) post(path string, withCSRF bool) string {
	c.t.Helper()
	csrf := `document.querySelector('input[name=csrf]').value`
	if !withCSRF {
		csrf = `""`
	}
	return c.eval("POST "+path, fmt.Sprintf(`fetch(%q, {method: "POST", headers: {"Content-Type": "application/x-www-form-urlencoded"},
		body: "csrf=" + encodeURIComponent(%s)}).then(r => String(r.status))`, path, csrf))
}
