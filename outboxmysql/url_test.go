package outboxmysql_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/outboxkit/outbox/outboxmysql"
)

func TestParseURL(t *testing.T) {
	cfg, err := outboxmysql.ParseURL("mysql://app:s%40cret@db.example:3307/shop?tls=preferred")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.User != "app" || cfg.Passwd != "s@cret" || cfg.Net != "tcp" || cfg.Addr != "db.example:3307" || cfg.DBName != "shop" ||
		cfg.TLSConfig != "preferred" || !cfg.ParseTime || !cfg.InterpolateParams || cfg.Timeout != 10*time.Second {
		t.Fatalf("ParseURL = %+v", cfg)
	}
	// The URL's parameters win over the defaults.
	cfg, err = outboxmysql.ParseURL("mysql://root@127.0.0.1/test?parseTime=false&interpolateParams=false&timeout=3s")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Addr != "127.0.0.1:3306" || cfg.ParseTime || cfg.InterpolateParams || cfg.Timeout != 3*time.Second {
		t.Fatalf("ParseURL with parameters = %+v", cfg)
	}
	dsn, err := outboxmysql.DSN("mysql://root@127.0.0.1:3306/test")
	if err != nil {
		t.Fatal(err)
	}
	back, err := mysql.ParseDSN(dsn)
	if err != nil || back.Addr != "127.0.0.1:3306" || back.DBName != "test" || back.User != "root" || !back.ParseTime {
		t.Fatalf("DSN = %q (%+v, %v)", dsn, back, err)
	}
}

func TestParseURLRefusesBadURLs(t *testing.T) {
	for _, c := range []struct{ url, want string }{
		{"mysql://u:secret@%zz/x", "invalid URL escape"},
		{"postgres://u:secret@127.0.0.1/x", `the scheme is "postgres"`},
		{"mysql://u:secret@:3306/x", "no host"},
		{"mysql://u:secret@127.0.0.1:3306/", "no database"},
		{"mysql://u:secret@127.0.0.1:3306/a%60b", "not a valid identifier"},
		{"mysql://u:secret@127.0.0.1:3306/test?timeout=soon", "invalid"},
	} {
		_, err := outboxmysql.DSN(c.url)
		var ue *outboxmysql.URLError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("DSN(%q) = %v, want a URLError mentioning %q", c.url, err, c.want)
			continue
		}
		if strings.Contains(err.Error(), "secret") || strings.Contains(err.Error(), "\n") {
			t.Errorf("DSN(%q): %q leaks the password or spans lines", c.url, err)
		}
	}
}
