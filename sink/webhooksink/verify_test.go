package webhooksink

import (
	"encoding/base64"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// signed returns the headers the sink would send for id and body at ts.
func signed(t testing.TB, secrets []string, id string, ts time.Time, body []byte) http.Header {
	t.Helper()
	sig, err := Sign(secrets, id, ts, body)
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{}
	h.Set(HeaderID, id)
	h.Set(HeaderTimestamp, strconv.FormatInt(ts.Unix(), 10))
	h.Set(HeaderSignature, sig)
	return h
}

func TestVerify(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	body := []byte(`{"a":1}`)
	good := signed(t, []string{secret1}, "msg_1", now, body)
	both := signed(t, []string{secret1, secret2}, "msg_1", now, body)

	// The example from the Standard Webhooks specification.
	spec := http.Header{}
	spec.Set(HeaderID, "msg_p5jXN8AQM9LWM0D4loKWxJek")
	spec.Set(HeaderTimestamp, "1614265330")
	spec.Set(HeaderSignature, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
	specBody := []byte(`{"test": 2432232314}`)
	specSecret := "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

	with := func(h http.Header, k, v string) http.Header {
		h = h.Clone()
		if v == "" {
			h.Del(k)
		} else {
			h.Set(k, v)
		}
		return h
	}
	for _, tc := range []struct {
		name    string
		secrets []string
		h       http.Header
		body    []byte
		tol     time.Duration
		now     time.Time
		want    error
	}{
		{"valid", []string{secret1}, good, body, 0, now, nil},
		{"spec example", []string{specSecret}, spec, specBody, 0, time.Unix(1614265330, 0), nil},
		{"spec example, prefix left out", []string{strings.TrimPrefix(specSecret, "whsec_")}, spec, specBody, 0, time.Unix(1614265330, 0), nil},
		{"rotation: second secret", []string{secret2}, both, body, 0, now, nil},
		{"rotation: receiver knows both", []string{NewSecret(), secret1}, good, body, 0, now, nil},
		{"wrong secret", []string{secret2}, good, body, 0, now, ErrSignature},
		{"body changed", []string{secret1}, good, []byte(`{"a":2}`), 0, now, ErrSignature},
		{"body with a trailing newline", []string{secret1}, good, []byte("{\"a\":1}\n"), 0, now, ErrSignature},
		{"id changed", []string{secret1}, with(good, HeaderID, "msg_2"), body, 0, now, ErrSignature},
		{"timestamp changed", []string{secret1}, with(good, HeaderTimestamp, strconv.FormatInt(now.Unix()+1, 10)), body, 0, now, ErrSignature},
		{"too old", []string{secret1}, good, body, 0, now.Add(5*time.Minute + time.Second), ErrTimestamp},
		{"within tolerance", []string{secret1}, good, body, 0, now.Add(5 * time.Minute), nil},
		{"too new", []string{secret1}, good, body, 0, now.Add(-5*time.Minute - time.Second), ErrTimestamp},
		{"custom tolerance", []string{secret1}, good, body, time.Minute, now.Add(2 * time.Minute), ErrTimestamp},
		{"timestamp not a number", []string{secret1}, with(good, HeaderTimestamp, "soon"), body, 0, now, ErrTimestamp},
		{"timestamp with a sign", []string{secret1}, with(good, HeaderTimestamp, "+"+strconv.FormatInt(now.Unix(), 10)), body, 0, now, ErrTimestamp},
		{"no id", []string{secret1}, with(good, HeaderID, ""), body, 0, now, ErrMissingHeaders},
		{"no timestamp", []string{secret1}, with(good, HeaderTimestamp, ""), body, 0, now, ErrMissingHeaders},
		{"no signature", []string{secret1}, with(good, HeaderSignature, ""), body, 0, now, ErrMissingHeaders},
		{"garbage signature", []string{secret1}, with(good, HeaderSignature, "v1,!!! v2 ,,, v1,"), body, 0, now, ErrSignature},
		{"asymmetric version ignored", []string{secret1}, with(good, HeaderSignature, strings.Replace(good.Get(HeaderSignature), "v1,", "v1a,", 1)), body, 0, now, ErrSignature},
		{"one valid among several", []string{secret1}, with(good, HeaderSignature, "v1,AAAA v1a,xyz "+good.Get(HeaderSignature)+" v2,zz"), body, 0, now, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Verify(tc.secrets, tc.h, tc.body, tc.tol, tc.now)
			if (tc.want == nil) != (err == nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Fatalf("Verify: %v, want %v", err, tc.want)
			}
		})
	}

	// Several header lines.
	h := good.Clone()
	h.Set(HeaderSignature, "v1,bm90IGl0")
	h.Add(HeaderSignature, good.Get(HeaderSignature))
	if err := Verify([]string{secret1}, h, body, 0, now); err != nil {
		t.Fatalf("signature in the second header line: %v", err)
	}
	// Lower-case keys, as the sink sets them on outgoing requests.
	lower := http.Header{}
	for k, v := range both {
		lower[strings.ToLower(k)] = v
	}
	if err := Verify([]string{secret2}, lower, body, 0, now); err != nil {
		t.Fatalf("lower-case header keys: %v", err)
	}
	// Invalid secrets are an error, not a silent mismatch.
	if err := Verify([]string{"whsec_%%%"}, good, body, 0, now); err == nil || errors.Is(err, ErrSignature) {
		t.Fatalf("invalid secret: %v", err)
	}
	if err := Verify(nil, good, body, 0, now); err == nil {
		t.Fatal("no secrets accepted")
	}
	// now zero means the current time.
	fresh := signed(t, []string{secret1}, "msg_1", time.Now(), body)
	if err := Verify([]string{secret1}, fresh, body, 0, time.Time{}); err != nil {
		t.Fatal(err)
	}
}

// FuzzVerify checks that Verify never panics and accepts only requests
// carrying the correct signature of their own id, timestamp and body, with a
// timestamp within the tolerance.
func FuzzVerify(f *testing.F) {
	now := time.Unix(1_800_000_000, 0)
	good, _ := Sign([]string{secret1}, "msg_1", now, []byte(`{"a":1}`))
	ts := strconv.FormatInt(now.Unix(), 10)
	f.Add("msg_1", ts, good, []byte(`{"a":1}`))
	f.Add("msg_1", ts, good, []byte(`{"a":2}`))
	f.Add("msg_1", ts, good+" v1,"+strings.Repeat("A", 44), []byte(`{"a":1}`))
	f.Add("msg_1", "1799999999", good, []byte(`{"a":1}`))
	f.Add("", "", "", []byte(nil))
	f.Add("x", "-9223372036854775808", "v1,", []byte("x"))
	f.Add("x", "99999999999999999999", "v1a,abc v1,====", []byte("x"))
	f.Fuzz(func(t *testing.T, id, timestamp, sigHeader string, body []byte) {
		h := http.Header{}
		h.Set(HeaderID, id)
		h.Set(HeaderTimestamp, timestamp)
		h.Set(HeaderSignature, sigHeader)
		err := Verify([]string{secret1, secret2}, h, body, time.Minute, now)
		if err == nil {
			// Accepted: a field must be the exact signature under one
			// of the secrets, and the timestamp within a minute.
			id, timestamp := h.Get(HeaderID), h.Get(HeaderTimestamp)
			sec, perr := strconv.ParseInt(timestamp, 10, 64)
			if perr != nil || sec < now.Unix()-60 || sec > now.Unix()+60 {
				t.Fatalf("accepted timestamp %q", timestamp)
			}
			keys, _ := parseSecrets([]string{secret1, secret2})
			found := false
			for _, f := range strings.Fields(h.Get(HeaderSignature)) {
				b, ok := strings.CutPrefix(f, "v1,")
				if !ok {
					continue
				}
				got, derr := base64.StdEncoding.DecodeString(b)
				if derr != nil {
					continue
				}
				for _, k := range keys {
					if string(got) == string(mac(k, id, timestamp, body)) {
						found = true
					}
				}
			}
			if !found {
				t.Fatalf("accepted id %q timestamp %q signature %q body %q without a valid signature", id, timestamp, sigHeader, body)
			}
			// Any change of the body must then be refused.
			if err := Verify([]string{secret1, secret2}, h, append(body, 'x'), time.Minute, now); err == nil {
				t.Fatal("accepted a changed body")
			}
		}
		// A correct signature of these inputs is accepted whenever the
		// headers survive as given and the timestamp is recent.
		if id == "" || timestamp == "" || h.Get(HeaderID) != id || h.Get(HeaderTimestamp) != timestamp {
			return
		}
		sec, perr := strconv.ParseInt(timestamp, 10, 64)
		if perr != nil || timestamp[0] == '+' || timestamp[0] == '-' || sec < now.Unix()-60 || sec > now.Unix()+60 {
			return
		}
		keys, _ := parseSecrets([]string{secret2})
		h.Set(HeaderSignature, "v1,"+base64.StdEncoding.EncodeToString(mac(keys[0], id, timestamp, body)))
		if err := Verify([]string{secret1, secret2}, h, body, time.Minute, now); err != nil {
			t.Fatalf("refused a correctly signed request: %v", err)
		}
	})
}
