package outboxmysql

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/outboxkit/outbox/internal/confval"
	"github.com/outboxkit/outbox/outboxdriver"
)

// URLError is the error of ParseURL and DSN: what is wrong with a
// mysql:// URL.
type URLError struct {
	// URL is the URL with its password hidden.
	URL string
	// Reason says what is wrong, on one line.
	Reason string
}

// Error returns "invalid MySQL URL <url>: <reason>".
func (e *URLError) Error() string { return "invalid MySQL URL " + e.URL + ": " + e.Reason }

// redactURL hides a URL's password.
func redactURL(raw string) string { return confval.RedactURL(raw) }

// ParseURL turns mysql://user:password@host:port/database?params into a
// go-sql-driver configuration. The port defaults to 3306; the database is
// required (it is the default schema of the outbox and inbox tables). Query
// parameters are the driver's DSN parameters (tls, timeout, ...), checked
// by the driver; parseTime and interpolateParams are on and the connect
// timeout is 10s unless the URL says otherwise. Errors are *URLError.
func ParseURL(raw string) (*mysql.Config, error) {
	bad := func(format string, args ...any) error {
		return &URLError{URL: redactURL(raw), Reason: fmt.Sprintf(format, args...)}
	}
	u, err := url.Parse(raw)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // without the URL, which may hold a password
		}
		return nil, bad("%v", err)
	}
	if u.Scheme != "mysql" {
		return nil, bad("the scheme is %q; use mysql://user:password@host:3306/database", u.Scheme)
	}
	host, port := u.Hostname(), u.Port()
	if host == "" {
		return nil, bad("no host; use mysql://user:password@host:3306/database")
	}
	if port == "" {
		port = "3306"
	}
	db := u.Path
	if len(db) > 0 && db[0] == '/' {
		db = db[1:]
	}
	if db == "" {
		return nil, bad("no database; use mysql://user:password@host:3306/database")
	}
	if err := outboxdriver.ValidateIdent("database", db); err != nil {
		return nil, bad("%v", err)
	}
	// Parse the query as DSN parameters, so the driver checks them.
	cfg, err := mysql.ParseDSN("/?" + u.RawQuery)
	if err != nil {
		return nil, bad("%v", err)
	}
	cfg.Net, cfg.Addr, cfg.DBName = "tcp", net.JoinHostPort(host, port), db
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	q := u.Query()
	if !q.Has("parseTime") {
		cfg.ParseTime = true
	}
	if !q.Has("interpolateParams") {
		cfg.InterpolateParams = true // one round trip per statement
	}
	if !q.Has("timeout") {
		cfg.Timeout = 10 * time.Second
	}
	return cfg, nil
}

// DSN converts a mysql:// URL (see ParseURL) to a go-sql-driver DSN for
// sql.Open("mysql", dsn).
func DSN(raw string) (string, error) {
	cfg, err := ParseURL(raw)
	if err != nil {
		return "", err
	}
	return cfg.FormatDSN(), nil
}
