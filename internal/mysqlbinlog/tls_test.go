package mysqlbinlog

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/testenv"
)

// TestLiveTLS: with Config.TLS the replication connection is encrypted
// (a MariaDB of the test's own with a certificate made here), streams the
// binary log, and a certificate it cannot verify fails the dial.
func TestLiveTLS(t *testing.T) {
	t.Parallel()
	dir, err := os.MkdirTemp("", "outbox-tls-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755) // the server runs as another OS user
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "outbox test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o644); err != nil {
		t.Fatal(err)
	}
	m := testenv.StartPrivateMariaDB(t, "--ssl-cert="+certFile, "--ssl-key="+keyFile)
	mc := m.Config("test")
	cert, _ := x509.ParseCertificate(der)
	roots := x509.NewCertPool()
	roots.AddCert(cert)
	cfg := Config{Addr: mc.Addr, User: mc.User, TLS: &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"}}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := Dial(ctx, cfg)
	if err != nil {
		t.Fatalf("dial over TLS: %v", err)
	}
	defer c.Close()
	cipher, err := c.QueryValue(ctx, "SELECT VARIABLE_VALUE FROM information_schema.SESSION_STATUS WHERE VARIABLE_NAME = 'SSL_CIPHER'")
	if err != nil || cipher == "" || !c.TLS() {
		t.Fatalf("the connection is not encrypted: cipher %q (%v), TLS %v", cipher, err, c.TLS())
	}
	if err := c.CheckServer(ctx); err != nil {
		t.Fatal(err)
	}
	pos, _, err := c.MasterStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	db := m.DB("test")
	defer db.Close()
	if _, err := db.ExecContext(ctx, "CREATE TABLE tl (id INT PRIMARY KEY, v VARCHAR(20))"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO tl VALUES (1, 'over tls')"); err != nil {
		t.Fatal(err)
	}
	st, err := c.StartDump(ctx, DumpConfig{ServerID: replicaID(), Position: pos})
	if err != nil {
		t.Fatal(err)
	}
	rows := rowsOf(t, st, "test", "tl", 1)
	if got := rows[0].Rows[0]; len(got) != 2 || !equal(got[1], []byte("over tls")) {
		t.Fatalf("row read over TLS: %#v", got)
	}

	cfg.TLS = &tls.Config{ServerName: "127.0.0.1"} // the system's roots: not ours
	if _, err := Dial(ctx, cfg); err == nil || !strings.Contains(err.Error(), "TLS handshake") {
		t.Fatalf("dial with a certificate it cannot verify: %v", err)
	}
}
