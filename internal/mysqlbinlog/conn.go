package mysqlbinlog

import (
	"bytes"
	"context"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"
)

// Capability flags of the client protocol.
const (
	capLongPassword     = 1 << 0
	capLongFlag         = 1 << 2
	capConnectWithDB    = 1 << 3
	capProtocol41       = 1 << 9
	capSSL              = 1 << 11
	capTransactions     = 1 << 13
	capSecureConnection = 1 << 15
	capMultiResults     = 1 << 17
	capPluginAuth       = 1 << 19
	capPluginAuthLenenc = 1 << 21
)

// Server error codes the client turns into clear errors.
const (
	erAccessDenied      = 1045
	erSpecificAccess    = 1227
	erMasterFatalRead   = 1236
	erUnknownSystemVar  = 1193
	erDBAccessDenied    = 1044
	erTableAccessDenied = 1142
)

// ServerError is an error packet from the server.
type ServerError struct {
	Code     uint16
	SQLState string
	Message  string
}

func (e *ServerError) Error() string {
	return fmt.Sprintf("mysql error %d (%s): %s", e.Code, e.SQLState, e.Message)
}

// parseError decodes an ERR packet (first byte 0xFF).
func parseError(p []byte) error {
	r := reader{b: p[1:]}
	e := &ServerError{Code: r.uint16("error code")}
	if len(r.b) > 0 && r.b[0] == '#' {
		r.bytes(1, "sql state marker")
		e.SQLState = string(r.bytes(5, "sql state"))
	}
	e.Message = string(r.rest())
	if r.err != nil {
		return r.err
	}
	return e
}

// Config says where and as whom a Conn connects.
type Config struct {
	// Addr is host:port.
	Addr string
	// User and Password authenticate (mysql_native_password, or the fast
	// path of caching_sha2_password: the account must have logged in once
	// over TLS or a socket since the server started).
	User, Password string
	// DialTimeout bounds the connection and handshake. Default 10s.
	DialTimeout time.Duration
	// TLS, when set, encrypts the connection (the SSL request of the
	// handshake, then TLS before the credentials are sent); a server
	// without TLS is refused unless TLSFallback. Over TLS,
	// caching_sha2_password's full authentication sends the password.
	TLS *tls.Config
	// TLSFallback connects in plain text to a server without TLS (the
	// driver's tls=preferred).
	TLSFallback bool
}

// Conn is one client connection to MySQL or MariaDB.
type Conn struct {
	nc            net.Conn
	pk            packetIO
	ServerVersion string
	// MariaDB reports whether the server is MariaDB.
	MariaDB bool
	caps    uint32
	tls     bool // the connection is encrypted
}

// TLS reports whether the connection is encrypted.
func (c *Conn) TLS() bool { return c.tls }

// Dial connects and authenticates.
func Dial(ctx context.Context, cfg Config) (*Conn, error) {
	timeout := cfg.DialTimeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	d := net.Dialer{Timeout: timeout}
	nc, err := d.DialContext(ctx, "tcp", cfg.Addr)
	if err != nil {
		return nil, err
	}
	c := &Conn{nc: nc, pk: packetIO{rw: nc}}
	deadline := time.Now().Add(timeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	_ = nc.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
	err = c.handshake(cfg)
	stop()
	if err != nil {
		nc.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	_ = nc.SetDeadline(time.Time{})
	return c, nil
}

// Close closes the connection.
func (c *Conn) Close() error { return c.nc.Close() }

// handshake reads the server's greeting (protocol 10), answers it and
// completes the authentication, plugin switch included.
func (c *Conn) handshake(cfg Config) error {
	p, err := c.pk.readPacket()
	if err != nil {
		return fmt.Errorf("read handshake: %w", err)
	}
	if len(p) > 0 && p[0] == 0xff {
		return parseError(p)
	}
	r := reader{b: p}
	if v := r.uint8("protocol version"); v != 10 {
		return fmt.Errorf("%w: handshake protocol %d, want 10", ErrMalformed, v)
	}
	c.ServerVersion = r.cstring("server version")
	r.uint32("connection id")
	scramble := append([]byte(nil), r.bytes(8, "auth data")...)
	r.uint8("filler")
	caps := uint32(r.uint16("capabilities"))
	plugin := "mysql_native_password"
	if len(r.b) > 0 {
		r.uint8("charset")
		r.uint16("status")
		caps |= uint32(r.uint16("capabilities")) << 16
		authLen := int(r.uint8("auth data length"))
		r.bytes(10, "reserved")
		if caps&capSecureConnection != 0 {
			n := max(13, authLen-8)
			part := r.bytes(n, "auth data")
			scramble = append(scramble, bytes.TrimRight(part, "\x00")...)
		}
		if caps&capPluginAuth != 0 {
			plugin = r.cstring("auth plugin")
		}
	}
	if r.err != nil {
		return r.err
	}
	if caps&capProtocol41 == 0 {
		return errors.New("mysqlbinlog: the server does not speak protocol 4.1")
	}
	c.MariaDB = bytes.Contains([]byte(c.ServerVersion), []byte("MariaDB"))
	c.caps = capLongPassword | capLongFlag | capProtocol41 | capTransactions |
		capSecureConnection | capMultiResults | capPluginAuth | capPluginAuthLenenc
	c.caps &= caps
	if cfg.TLS != nil {
		switch {
		case caps&capSSL != 0:
			// The SSL request: the first 32 bytes of the answer, then TLS.
			c.caps |= capSSL
			req := []byte{byte(c.caps), byte(c.caps >> 8), byte(c.caps >> 16), byte(c.caps >> 24), 0, 0, 0, 1, 45}
			if err := c.pk.writePacket(append(req, make([]byte, 23)...)); err != nil {
				return err
			}
			tc := tls.Client(c.nc, cfg.TLS)
			if err := tc.Handshake(); err != nil {
				return fmt.Errorf("mysqlbinlog: TLS handshake with %s: %w", cfg.Addr, err)
			}
			c.nc, c.pk.rw, c.tls = tc, tc, true
		case !cfg.TLSFallback:
			return fmt.Errorf("mysqlbinlog: the server at %s does not offer TLS, which the connection asks for (tls in the URL): turn TLS on in the server (ssl_cert, ssl_key) or connect without tls", cfg.Addr)
		}
	}

	auth, err := scrambleFor(plugin, cfg.Password, scramble)
	if err != nil {
		return err
	}
	resp := make([]byte, 0, 64+len(cfg.User))
	resp = append(resp, byte(c.caps), byte(c.caps>>8), byte(c.caps>>16), byte(c.caps>>24))
	resp = append(resp, 0, 0, 0, 1) // max packet size 16 MB
	resp = append(resp, 45)         // utf8mb4_general_ci
	resp = append(resp, make([]byte, 23)...)
	resp = append(append(resp, cfg.User...), 0)
	if c.caps&capPluginAuthLenenc != 0 {
		resp = append(appendLenenc(resp, uint64(len(auth))), auth...)
	} else {
		resp = append(append(resp, byte(len(auth))), auth...)
	}
	if c.caps&capPluginAuth != 0 {
		resp = append(append(resp, plugin...), 0)
	}
	if err := c.pk.writePacket(resp); err != nil {
		return err
	}
	return c.authResult(cfg, plugin)
}

// authResult reads the server's answers until OK, switching plugin or
// finishing caching_sha2_password's fast path when asked.
func (c *Conn) authResult(cfg Config, plugin string) error {
	for {
		p, err := c.pk.readPacket()
		if err != nil {
			return fmt.Errorf("read authentication result: %w", err)
		}
		if len(p) == 0 {
			return fmt.Errorf("%w: empty authentication packet", ErrMalformed)
		}
		switch p[0] {
		case 0x00:
			return nil
		case 0xff:
			return parseError(p)
		case 0xfe: // auth switch request
			r := reader{b: p[1:]}
			plugin = r.cstring("auth plugin")
			scramble := bytes.TrimRight(r.rest(), "\x00")
			auth, err := scrambleFor(plugin, cfg.Password, scramble)
			if err != nil {
				return err
			}
			if err := c.pk.writePacket(auth); err != nil {
				return err
			}
		case 0x01: // more data: caching_sha2_password's verdict
			if plugin != "caching_sha2_password" || len(p) < 2 {
				return fmt.Errorf("%w: unexpected auth more-data packet", ErrMalformed)
			}
			switch p[1] {
			case 3: // fast auth success; OK follows
			case 4:
				if c.tls { // full authentication: the password, over TLS
					if err := c.pk.writePacket(append([]byte(cfg.Password), 0)); err != nil {
						return err
					}
					continue
				}
				return errors.New("mysqlbinlog: caching_sha2_password needs full authentication (TLS or RSA), which this client does not do: log the account in once over TLS or a socket, or use mysql_native_password")
			default:
				return fmt.Errorf("%w: caching_sha2_password state %d", ErrMalformed, p[1])
			}
		default:
			return fmt.Errorf("%w: authentication packet 0x%02x", ErrMalformed, p[0])
		}
	}
}

// scrambleFor computes the authentication answer of plugin.
func scrambleFor(plugin, password string, scramble []byte) ([]byte, error) {
	if password == "" {
		return nil, nil
	}
	switch plugin {
	case "mysql_native_password":
		// SHA1(password) XOR SHA1(scramble + SHA1(SHA1(password)))
		h1 := sha1.Sum([]byte(password))
		h2 := sha1.Sum(h1[:])
		h := sha1.New()
		h.Write(scramble)
		h.Write(h2[:])
		out := h.Sum(nil)
		for i := range out {
			out[i] ^= h1[i]
		}
		return out, nil
	case "caching_sha2_password":
		// SHA256(password) XOR SHA256(SHA256(SHA256(password)) + scramble)
		h1 := sha256.Sum256([]byte(password))
		h2 := sha256.Sum256(h1[:])
		h := sha256.New()
		h.Write(h2[:])
		h.Write(scramble)
		out := h.Sum(nil)
		for i := range out {
			out[i] ^= h1[i]
		}
		return out, nil
	}
	return nil, fmt.Errorf("mysqlbinlog: authentication plugin %q is not supported (use mysql_native_password)", plugin)
}

// command starts a command: a new sequence and the payload.
func (c *Conn) command(payload []byte) error {
	c.pk.seq = 0
	return c.pk.writePacket(payload)
}

// withContext applies ctx's deadline and cancellation to the connection
// while f runs.
func (c *Conn) withContext(ctx context.Context, f func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	dl, _ := ctx.Deadline()
	_ = c.nc.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { _ = c.nc.SetDeadline(time.Unix(1, 0)) })
	err := f()
	if !stop() || ctx.Err() != nil {
		if err != nil {
			return fmt.Errorf("%w (%v)", ctx.Err(), err)
		}
	}
	return err
}

// Exec runs a statement that returns no rows.
func (c *Conn) Exec(ctx context.Context, query string) error {
	_, err := c.Query(ctx, query)
	return err
}

// Row is a row of a text result set; a nil element is NULL.
type Row [][]byte

// Query runs a statement and returns its rows, as text.
func (c *Conn) Query(ctx context.Context, query string) ([]Row, error) {
	var rows []Row
	err := c.withContext(ctx, func() error {
		if err := c.command(append([]byte{0x03}, query...)); err != nil {
			return err
		}
		p, err := c.pk.readPacket()
		if err != nil {
			return err
		}
		if len(p) == 0 {
			return fmt.Errorf("%w: empty query response", ErrMalformed)
		}
		switch p[0] {
		case 0x00:
			return nil
		case 0xff:
			return parseError(p)
		case 0xfb:
			return errors.New("mysqlbinlog: LOCAL INFILE is not supported")
		}
		r := reader{b: p}
		ncols, _ := r.lenenc("column count")
		if r.err != nil {
			return r.err
		}
		// Column definitions, then EOF.
		for {
			p, err := c.pk.readPacket()
			if err != nil {
				return err
			}
			if isEOF(p) {
				break
			}
			if len(p) > 0 && p[0] == 0xff {
				return parseError(p)
			}
		}
		for {
			p, err := c.pk.readPacket()
			if err != nil {
				return err
			}
			if isEOF(p) {
				return nil
			}
			if len(p) > 0 && p[0] == 0xff {
				return parseError(p)
			}
			r := reader{b: p}
			row := make(Row, 0, ncols)
			for range ncols {
				v, null := r.lenencBytes("column value")
				if !null && v == nil {
					v = []byte{}
				}
				row = append(row, v)
			}
			if r.err != nil {
				return r.err
			}
			rows = append(rows, row)
		}
	})
	return rows, err
}

// isEOF reports an EOF packet.
func isEOF(p []byte) bool { return len(p) > 0 && p[0] == 0xfe && len(p) < 9 }

// QueryValue runs a query that returns one value (NULL is "").
func (c *Conn) QueryValue(ctx context.Context, query string) (string, error) {
	rows, err := c.Query(ctx, query)
	if err != nil {
		return "", err
	}
	if len(rows) != 1 || len(rows[0]) != 1 {
		return "", fmt.Errorf("mysqlbinlog: %s: want one value, got %d rows", query, len(rows))
	}
	return string(rows[0][0]), nil
}
