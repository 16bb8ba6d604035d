package console_test

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"html/template"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/coreos/go-oidc/v3/oidc/oidctest"

	"github.com/outboxkit/outbox/console"
	"github.com/outboxkit/outbox/ops"
)

// provider is an OpenID provider in the test's process: discovery and
// JWKS (oidctest), an authorize endpoint with a login page (or
// approving at once as auto), and a token endpoint that checks the
// client's secret, the redirect URI and the PKCE verifier (S256) and
// issues RS256-signed ID tokens.
type provider struct {
	t        *testing.T
	url      string // the issuer
	clientID string
	secret   string
	key      *rsa.PrivateKey
	// accounts are the users who may sign in: name -> their claims.
	accounts map[string]map[string]any
	mu       sync.Mutex
	auto     string // sign in as this account without a login page
	redirect string // the one redirect URI registered
	codes    map[string]grant
	// tamper changes the claims of the next ID tokens (nil: none).
	tamper func(claims map[string]any)
	// signer signs ID tokens (nil: key, the key the JWKS lists).
	signer *rsa.PrivateKey
	// seen counts the successful token requests.
	seen int
}

type grant struct {
	account, nonce, challenge, redirect string
}

var loginForm = template.Must(template.New("login").Parse(`<!doctype html><title>Provider sign-in</title>
<form method="post" action="/auth" id="idp-login">
{{range $k, $v := .}}<input type="hidden" name="{{$k}}" value="{{index $v 0}}">{{end}}
<label>Account <input name="account" id="idp-account"></label>
<button type="submit" id="idp-submit">Sign in</button>
</form>`))

// newProvider starts a provider for client id "outbox-console".
func newProvider(t *testing.T) *provider {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	p := &provider{t: t, clientID: "outbox-console", secret: "s3cret-" + rand.Text(), key: key,
		accounts: map[string]map[string]any{}, codes: map[string]grant{}}
	keys := &oidctest.Server{PublicKeys: []oidctest.PublicKey{{PublicKey: key.Public(), KeyID: "k1", Algorithm: oidc.RS256}}}
	mux := http.NewServeMux()
	mux.Handle("/", keys)
	mux.HandleFunc("/auth", p.authorize)
	mux.HandleFunc("/token", p.token)
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	keys.SetIssuer(hs.URL)
	p.url = hs.URL
	return p
}

// oidc is the console's OIDC for a console at consoleURL, with roles.
func (p *provider) oidc(roles map[string]ops.Role, nameClaim string) func(string) *console.OIDC {
	return func(consoleURL string) *console.OIDC {
		p.redirect = consoleURL + console.OIDCCallbackPath
		o, err := console.NewOIDC(p.t.Context(), &console.OIDCConfig{Issuer: p.url, ClientID: p.clientID, ClientSecret: p.secret,
			RedirectURL: p.redirect, Roles: roles, NameClaim: nameClaim})
		if err != nil {
			p.t.Fatal(err)
		}
		return o
	}
}

func (p *provider) authorize(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f := r.Form
	if f.Get("client_id") != p.clientID || f.Get("redirect_uri") != p.redirect || f.Get("response_type") != "code" {
		http.Error(w, "unknown client or redirect URI", http.StatusBadRequest)
		return
	}
	if f.Get("code_challenge_method") != "S256" || f.Get("code_challenge") == "" || f.Get("nonce") == "" || f.Get("state") == "" {
		http.Error(w, "PKCE S256, a nonce and a state are required", http.StatusBadRequest)
		return
	}
	p.mu.Lock()
	account := p.auto
	p.mu.Unlock()
	if r.Method == http.MethodPost {
		account = f.Get("account")
	}
	if account == "" {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		q := url.Values{}
		for _, k := range []string{"client_id", "redirect_uri", "response_type", "scope", "state", "nonce", "code_challenge", "code_challenge_method"} {
			q.Set(k, f.Get(k))
		}
		_ = loginForm.Execute(w, q)
		return
	}
	p.mu.Lock()
	_, known := p.accounts[account]
	code := rand.Text()
	if known {
		p.codes[code] = grant{account: account, nonce: f.Get("nonce"), challenge: f.Get("code_challenge"), redirect: f.Get("redirect_uri")}
	}
	p.mu.Unlock()
	back, _ := url.Parse(f.Get("redirect_uri"))
	v := url.Values{"state": {f.Get("state")}}
	if known {
		v.Set("code", code)
	} else {
		v.Set("error", "access_denied")
	}
	back.RawQuery = v.Encode()
	http.Redirect(w, r, back.String(), http.StatusSeeOther)
}

func (p *provider) token(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	id, secret, ok := r.BasicAuth()
	if !ok {
		id, secret = r.PostForm.Get("client_id"), r.PostForm.Get("client_secret")
	}
	if id != p.clientID || subtle.ConstantTimeCompare([]byte(secret), []byte(p.secret)) != 1 {
		tokenError(w, http.StatusUnauthorized, "invalid_client")
		return
	}
	p.mu.Lock()
	g, ok := p.codes[r.PostForm.Get("code")]
	delete(p.codes, r.PostForm.Get("code"))
	p.mu.Unlock()
	sum := sha256.Sum256([]byte(r.PostForm.Get("code_verifier")))
	if !ok || r.PostForm.Get("grant_type") != "authorization_code" || r.PostForm.Get("redirect_uri") != g.redirect ||
		base64.RawURLEncoding.EncodeToString(sum[:]) != g.challenge {
		tokenError(w, http.StatusBadRequest, "invalid_grant")
		return
	}
	now := time.Now()
	p.mu.Lock()
	claims := map[string]any{"iss": p.url, "aud": p.clientID, "sub": "sub-" + g.account, "iat": now.Unix(),
		"exp": now.Add(5 * time.Minute).Unix(), "nonce": g.nonce}
	for k, v := range p.accounts[g.account] {
		claims[k] = v
	}
	if p.tamper != nil {
		p.tamper(claims)
	}
	signer := p.key
	if p.signer != nil {
		signer = p.signer
	}
	p.seen++
	p.mu.Unlock()
	b, err := json.Marshal(claims)
	if err != nil {
		p.t.Error(err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"access_token": rand.Text(), "token_type": "Bearer", "expires_in": 300,
		"id_token": oidctest.SignIDToken(signer, "k1", oidc.RS256, string(b))})
}

func tokenError(w http.ResponseWriter, status int, code string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": code})
}

// set changes the provider's state under its lock.
func (p *provider) set(f func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f()
}
