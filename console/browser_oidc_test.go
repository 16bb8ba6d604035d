package console_test

import (
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
)

// A real browser signs in through OpenID Connect: the console (on
// localhost) has no users file, so its sign-in page shows the provider's
// button only; the button leads to the provider's login page (on
// 127.0.0.1, another site), whose redirect back to the console is a
// cross-site navigation that must still carry the attempt's cookie; the
// console verifies it all and lands the browser on the page it first
// asked for, signed in with the role the groups map to. Signing out
// brings the sign-in page back, and the next visit needs a new sign-in.
func TestBrowserOIDC(t *testing.T) {
	t.Parallel()
	p := newProvider(t)
	p.accounts["ada"] = map[string]any{"preferred_username": "ada", "groups": []any{"staff", "oncall"}}
	p.accounts["linus"] = map[string]any{"preferred_username": "linus", "groups": []any{"contractors"}}
	r := newRig(t, &rigOptions{oidc: p.oidc(oidcRoles, ""), localhost: true})
	if !strings.HasPrefix(r.url, "http://localhost:") || !strings.HasPrefix(p.url, "http://127.0.0.1:") {
		t.Fatalf("the console at %s and the provider at %s are not two sites", r.url, p.url)
	}
	c := newChrome(t, r)
	do, eval := c.do, c.eval
	signIn := func(account string) {
		do("sign in as "+account+" at the provider",
			chromedp.Navigate(r.url+"/dead-letters"),
			chromedp.WaitVisible(chromedp.ID("oidc")),
			chromedp.Click(chromedp.ID("oidc")),
			chromedp.WaitVisible(chromedp.ID("idp-login")),
			chromedp.SendKeys(chromedp.ID("idp-account"), account),
			chromedp.Click(chromedp.ID("idp-submit")),
		)
	}
	do("the sign-in page", chromedp.Navigate(r.url+"/"), chromedp.WaitVisible(chromedp.ID("oidc")), c.shot("login-oidc.png"))
	if got := eval("sign-in page", `document.querySelector("#oidc").textContent + "|" + String(document.querySelectorAll("#password").length)`); got != "Sign in with "+strings.TrimPrefix(p.url, "http://")+"|0" {
		t.Fatalf("the sign-in page shows %q; want the provider's button and no password form", got)
	}
	signIn("ada")
	do("land on the dead letters", chromedp.WaitVisible(chromedp.ID("dead-letters")))
	if who := eval("who", `location.host + " " + location.pathname + " " + document.querySelector("#user").textContent + " " + document.querySelector("#role").textContent`); who != strings.TrimPrefix(r.url, "http://")+" /dead-letters ada operator" {
		t.Fatalf("after the sign-in: %q; want the console's /dead-letters as ada operator", who)
	}
	do("sign out", chromedp.Click(chromedp.CSS(`form[action="/logout"] button`)), chromedp.WaitVisible(chromedp.ID("oidc")))
	do("the overview again", chromedp.Navigate(r.url+"/"), chromedp.WaitVisible(chromedp.ID("oidc")))

	// An account whose groups map to no role ends on a page that says so.
	signIn("linus")
	do("the refusal", chromedp.WaitVisible(chromedp.ID("error")))
	if msg := eval("refusal", `document.querySelector("#error").textContent`); !strings.Contains(msg, `Your account linus has no role in this console`) || !strings.Contains(msg, `"groups"`) {
		t.Fatalf("the refusal says %q; want that linus has no role and the claim read", msg)
	}
	do("no session", chromedp.Navigate(r.url+"/"), chromedp.WaitVisible(chromedp.ID("oidc")))
}
