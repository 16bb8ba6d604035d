package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/outboxkit/outbox/console"
	"github.com/outboxkit/outbox/ops"
)

// envOIDCSecret holds the console's OpenID Connect client secret when
// --oidc-client-secret-file does not name a file.
const envOIDCSecret = "OUTBOX_OIDC_CLIENT_SECRET"

// oidcFlags are the console's --oidc flags.
type oidcFlags struct {
	issuer, clientID, secretFile, redirect, rolesClaim, nameClaim string
	roles                                                         []string
}

func (f *oidcFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.issuer, "oidc-issuer", "", "sign users in through this OpenID Connect provider (issuer URL: https, or http on the loopback)")
	fl.StringVar(&f.clientID, "oidc-client-id", "", "the console's client id at the OpenID Connect provider")
	fl.StringVar(&f.secretFile, "oidc-client-secret-file", "", "file holding the console's client secret (or "+envOIDCSecret+"; the file wins)")
	fl.StringVar(&f.redirect, "oidc-redirect-url", "", "the console's callback as the provider knows it, ending in "+console.OIDCCallbackPath+" (default derived from a loopback --addr)")
	fl.StringVar(&f.rolesClaim, "oidc-roles-claim", "groups", "the ID token claim (a string or a list) the roles are mapped from")
	fl.StringVar(&f.nameClaim, "oidc-name-claim", "", "the ID token claim the user's name comes from (default preferred_username, then email, then sub)")
	fl.StringArrayVar(&f.roles, "oidc-role", nil, "CLAIMVALUE=ROLE: users whose roles claim holds CLAIMVALUE get ROLE (viewer, operator or approver; the highest wins); repeatable")
}

// check reports whether OpenID Connect is on, and refuses --oidc flags
// without --oidc-issuer and OpenID Connect with --dev.
func (f *oidcFlags) check(cmd *cobra.Command, dev bool) (bool, error) {
	if f.issuer == "" {
		for _, name := range []string{"oidc-client-id", "oidc-client-secret-file", "oidc-redirect-url", "oidc-roles-claim", "oidc-name-claim", "oidc-role"} {
			if cmd.Flags().Changed(name) {
				return false, fmt.Errorf("--%s needs --oidc-issuer", name)
			}
		}
		return false, nil
	}
	if dev {
		return false, errors.New("--dev signs everyone in without a password, so it does not take --oidc-issuer: drop one of them")
	}
	return true, nil
}

// provider reads the secret and the mapping and discovers the provider;
// an error names the flag to fix.
func (f *oidcFlags) provider(ctx context.Context, addr string, https bool) (*console.OIDC, error) {
	if f.clientID == "" {
		return nil, errors.New("--oidc-client-id: required with --oidc-issuer")
	}
	secret, err := f.secret()
	if err != nil {
		return nil, err
	}
	if len(f.roles) == 0 {
		return nil, fmt.Errorf("--oidc-role: map at least one value of the %s claim to a role (e.g. --oidc-role oncall=operator), or nobody could sign in", f.rolesClaim)
	}
	roles := map[string]ops.Role{}
	for _, m := range f.roles {
		i := strings.LastIndexByte(m, '=')
		if i <= 0 {
			return nil, fmt.Errorf("--oidc-role %q: use CLAIMVALUE=ROLE", m)
		}
		r, err := ops.ParseRole(m[i+1:])
		if err != nil {
			return nil, fmt.Errorf("--oidc-role %s: %w", m, err)
		}
		if prev, ok := roles[m[:i]]; ok && prev != r {
			return nil, fmt.Errorf("--oidc-role %s: %s is mapped to %s already", m, m[:i], prev)
		}
		roles[m[:i]] = r
	}
	redirect := f.redirect
	if redirect == "" {
		if redirect, err = defaultRedirect(addr, https); err != nil {
			return nil, err
		}
	}
	o, err := console.NewOIDC(ctx, &console.OIDCConfig{Issuer: f.issuer, ClientID: f.clientID, ClientSecret: secret, RedirectURL: redirect,
		RolesClaim: f.rolesClaim, NameClaim: f.nameClaim, Roles: roles})
	var ce *console.OIDCConfigError
	if errors.As(err, &ce) {
		flag := map[string]string{"Issuer": "--oidc-issuer", "ClientID": "--oidc-client-id", "ClientSecret": "--oidc-client-secret-file",
			"RedirectURL": "--oidc-redirect-url", "RolesClaim": "--oidc-roles-claim", "NameClaim": "--oidc-name-claim", "Roles": "--oidc-role"}[ce.Field]
		return nil, fmt.Errorf("%s: %w", flag, ce.Err)
	}
	return o, err
}

// secret is the client secret, from --oidc-client-secret-file or the
// environment; never from a flag's value, which other users of the
// machine could read.
func (f *oidcFlags) secret() (string, error) {
	if f.secretFile != "" {
		b, err := os.ReadFile(f.secretFile)
		if err != nil {
			return "", fmt.Errorf("--oidc-client-secret-file: %w", err)
		}
		s := strings.TrimSpace(string(b))
		if s == "" || strings.ContainsAny(s, "\r\n") {
			return "", fmt.Errorf("--oidc-client-secret-file %s: want the secret on one line", f.secretFile)
		}
		return s, nil
	}
	if s := strings.TrimSpace(os.Getenv(envOIDCSecret)); s != "" {
		return s, nil
	}
	return "", fmt.Errorf("--oidc-client-secret-file: required with --oidc-issuer (or set %s)", envOIDCSecret)
}

// defaultRedirect is the callback of a console on a loopback addr with a
// fixed port; elsewhere the URL browsers use is not known here.
func defaultRedirect(addr string, https bool) (string, error) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil || !console.LoopbackAddr(addr) || port == "" || port == "0" {
		return "", fmt.Errorf("--oidc-redirect-url: required with --addr %s (give the URL browsers reach the console at, ending in %s)", addr, console.OIDCCallbackPath)
	}
	scheme := "http"
	if https {
		scheme = "https"
	}
	return scheme + "://" + addr + console.OIDCCallbackPath, nil
}
