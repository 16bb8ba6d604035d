package console

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"sync"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/outboxkit/outbox/ops"
)

// User is one account of the console, as the users file keeps it: no
// password and no token in the clear, only their hashes.
type User struct {
	Name string   `json:"name"`
	Role ops.Role `json:"role"`
	// PasswordHash is a bcrypt hash of the password.
	PasswordHash string `json:"password_hash"`
	// TokenSHA256 is the SHA-256 (hex) of the user's API token. A token
	// is 32 random bytes, so a fast hash is enough.
	TokenSHA256 string    `json:"token_sha256"`
	Created     time.Time `json:"created"`
}

// Actor is the user as package ops sees them.
func (u *User) Actor() ops.Actor { return ops.Actor{Name: u.Name, Role: u.Role} }

// Users is the content of a users file.
type Users struct {
	Users []User `json:"users"`
	// Cost is the bcrypt cost of new password hashes (0: DefaultCost).
	Cost int `json:"-"`
}

// DefaultCost is the bcrypt cost of password hashes: about a quarter of a
// second per login on a current server core.
const DefaultCost = 12

// Password limits: bcrypt reads at most 72 bytes.
const (
	MinPassword = 12
	MaxPassword = 72
)

var userName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$`)

// LoadUsers reads the users file at path. A file that does not exist
// holds no users (the console then refuses to start unless in dev mode).
// A file that its group or others may read or write is refused: it holds
// the password hashes and decides who may do what.
func LoadUsers(path string) (*Users, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &Users{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("users file %s: %w", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("users file %s: %w", path, err)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("users file %s is open to its group or others (mode %04o): run `chmod 600 %s`", path, perm, path)
	}
	b, err := io.ReadAll(io.LimitReader(f, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("users file %s: %w", path, err)
	}
	var u Users
	if err := json.Unmarshal(b, &u); err != nil {
		return nil, fmt.Errorf("users file %s: %v", path, err)
	}
	if err := u.check(); err != nil {
		return nil, fmt.Errorf("users file %s: %w", path, err)
	}
	return &u, nil
}

// check refuses a file a person edited into something the console must
// not trust: duplicate names, unknown roles, missing hashes.
func (u *Users) check() error {
	seen := map[string]bool{}
	tokens := map[string]bool{}
	for _, x := range u.Users {
		if !userName.MatchString(x.Name) {
			return fmt.Errorf("user %q: a name is 1 to 64 letters, digits and . _ @ -", x.Name)
		}
		if seen[x.Name] {
			return fmt.Errorf("user %q is there twice", x.Name)
		}
		seen[x.Name] = true
		if _, err := ops.ParseRole(string(x.Role)); err != nil {
			return fmt.Errorf("user %q: %w", x.Name, err)
		}
		if _, err := bcrypt.Cost([]byte(x.PasswordHash)); err != nil {
			return fmt.Errorf("user %q: password_hash is not a bcrypt hash", x.Name)
		}
		if b, err := hex.DecodeString(x.TokenSHA256); err != nil || len(b) != sha256.Size {
			return fmt.Errorf("user %q: token_sha256 is not a SHA-256 in hex", x.Name)
		}
		if tokens[x.TokenSHA256] {
			return fmt.Errorf("user %q: token_sha256 is another user's", x.Name)
		}
		tokens[x.TokenSHA256] = true
	}
	return nil
}

// Add adds a user with role and password and returns the user's new API
// token, which is shown once and stored only as a hash.
func (u *Users) Add(name string, role ops.Role, password string) (token string, err error) {
	if !userName.MatchString(name) {
		return "", fmt.Errorf("user name %q: use 1 to 64 letters, digits and . _ @ -, starting with a letter or digit", name)
	}
	if _, err := ops.ParseRole(string(role)); err != nil {
		return "", err
	}
	for _, x := range u.Users {
		if x.Name == name {
			return "", fmt.Errorf("user %q exists: remove it first", name)
		}
	}
	if len(password) < MinPassword || len(password) > MaxPassword {
		return "", fmt.Errorf("password: use %d to %d bytes", MinPassword, MaxPassword)
	}
	cost := u.Cost
	if cost == 0 {
		cost = DefaultCost
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(password), cost)
	if err != nil {
		return "", err
	}
	token = "obx_" + randomString(32)
	u.Users = append(u.Users, User{Name: name, Role: role, PasswordHash: string(hash), TokenSHA256: tokenHash(token), Created: time.Now().UTC().Truncate(time.Second)})
	sort.Slice(u.Users, func(i, j int) bool { return u.Users[i].Name < u.Users[j].Name })
	return token, nil
}

// Remove removes the user name.
func (u *Users) Remove(name string) error {
	for i, x := range u.Users {
		if x.Name == name {
			u.Users = append(u.Users[:i], u.Users[i+1:]...)
			return nil
		}
	}
	return fmt.Errorf("no user %q", name)
}

// Save writes u to path, readable by its owner only, replacing the file
// in one step.
func (u *Users) Save(path string) error {
	b, err := json.MarshalIndent(u, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".users-*")
	if err != nil {
		return fmt.Errorf("users file %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// NewPassword returns a random password of 24 characters.
func NewPassword() string { return randomString(18) }

// directory is the users, looked up by name and by token hash.
type directory struct {
	byName  map[string]*User
	byToken map[string]*User
	// dummy is checked against for an unknown name, so that a login
	// takes as long whether the name exists or not. Made on first use.
	dummyOnce sync.Once
	dummy     []byte
}

func newDirectory(u *Users) *directory {
	d := &directory{byName: map[string]*User{}, byToken: map[string]*User{}}
	if u != nil {
		for i := range u.Users {
			x := &u.Users[i]
			d.byName[x.Name] = x
			d.byToken[x.TokenSHA256] = x
		}
	}
	return d
}

// dummyHash is a hash of a random password at the cost of the users'.
func (d *directory) dummyHash() []byte {
	d.dummyOnce.Do(func() {
		cost := DefaultCost
		for _, x := range d.byName {
			if c, err := bcrypt.Cost([]byte(x.PasswordHash)); err == nil {
				cost = c
				break
			}
		}
		d.dummy, _ = bcrypt.GenerateFromPassword([]byte(randomString(16)), cost)
	})
	return d.dummy
}

func (d *directory) empty() bool { return len(d.byName) == 0 }

// login returns the user whose name and password these are, or nil.
func (d *directory) login(name, password string) *User {
	u := d.byName[name]
	if len(password) > MaxPassword { // no user has one; take as long as a check
		_ = bcrypt.CompareHashAndPassword(d.dummyHash(), []byte(password[:MaxPassword]))
		return nil
	}
	var hash []byte
	if u != nil {
		hash = []byte(u.PasswordHash)
	} else {
		hash = d.dummyHash()
	}
	if bcrypt.CompareHashAndPassword(hash, []byte(password)) != nil || u == nil {
		return nil
	}
	return u
}

// token returns the user whose API token this is, or nil.
func (d *directory) token(tok string) *User {
	h := tokenHash(tok)
	u := d.byToken[h]
	if u == nil || subtle.ConstantTimeCompare([]byte(u.TokenSHA256), []byte(h)) != 1 {
		return nil
	}
	return u
}

func tokenHash(tok string) string {
	s := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(s[:])
}

// randomString is n random bytes in unpadded URL-safe base64.
func randomString(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic("console: no randomness: " + err.Error())
	}
	return base64.RawURLEncoding.EncodeToString(b)
}
