package idempotency

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

var (
	// ErrNoKey: the request carries no Idempotency-Key field.
	ErrNoKey = errors.New("idempotency: no Idempotency-Key")
	// ErrInvalidKey: the Idempotency-Key field is malformed, repeated, empty,
	// too long, or refused by Config.ValidateKey.
	ErrInvalidKey = errors.New("idempotency: invalid Idempotency-Key")
)

// ParseKey returns the key carried by the values of an Idempotency-Key
// field: an HTTP request's header field, or a gRPC call's idempotency-key
// metadata entry. The draft defines the field as an RFC 8941 sf-string
// ("8e03978e-..."); many clients send the bare value, so a bare value of
// visible ASCII without DQUOTE, comma, semicolon or backslash is accepted
// too. A comma would mean two keys (two fields folded by a proxy), and
// parameters after the string are not expected, so both are refused rather
// than guessed at. The key is at most maxLen bytes; zero or negative
// means 255. It fails with an error that Is ErrNoKey when there is no
// value, and ErrInvalidKey when the value is not one well-formed key.
func ParseKey(values []string, maxLen int) (string, error) {
	if maxLen <= 0 {
		maxLen = defaultMaxKeyLength
	}
	switch len(values) {
	case 0:
		return "", ErrNoKey
	case 1:
	default:
		return "", fmt.Errorf("%w: %d fields, want one", ErrInvalidKey, len(values))
	}
	v := strings.Trim(values[0], " \t")
	if v == "" {
		return "", fmt.Errorf("%w: empty", ErrInvalidKey)
	}
	// A quoted key is at most twice as long escaped, plus the quotes.
	if len(v) > 2*maxLen+2 {
		return "", fmt.Errorf("%w: longer than %d characters", ErrInvalidKey, maxLen)
	}
	var key string
	if v[0] == '"' {
		var err error
		if key, err = parseSFString(v); err != nil {
			return "", err
		}
	} else {
		for i := 0; i < len(v); i++ {
			if c := v[i]; c < 0x21 || c > 0x7e || c == '"' || c == ',' || c == ';' || c == '\\' {
				return "", fmt.Errorf("%w: character %q at %d (quote the key as an sf-string, or use letters, digits and -._~:+/=)", ErrInvalidKey, c, i)
			}
		}
		key = v
	}
	if key == "" {
		return "", fmt.Errorf("%w: empty", ErrInvalidKey)
	}
	if len(key) > maxLen {
		return "", fmt.Errorf("%w: longer than %d characters", ErrInvalidKey, maxLen)
	}
	return key, nil
}

// parseSFString parses s, which starts with DQUOTE, as an RFC 8941 section
// 4.2.5 String and requires nothing after it.
func parseSFString(s string) (string, error) {
	// The common key has no escapes: return a substring, no copy.
	if i := strings.IndexAny(s[1:], `"\`); i >= 0 && s[1+i] == '"' && i+2 == len(s) {
		for j := 1; j <= i; j++ {
			if c := s[j]; c < 0x20 || c > 0x7e {
				return "", fmt.Errorf("%w: character %q at %d", ErrInvalidKey, c, j)
			}
		}
		return s[1 : 1+i], nil
	}
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			i++
			if i == len(s) || (s[i] != '"' && s[i] != '\\') {
				return "", fmt.Errorf("%w: bad escape at %d", ErrInvalidKey, i)
			}
			b.WriteByte(s[i])
		case c == '"':
			if i != len(s)-1 {
				return "", fmt.Errorf("%w: unexpected %q after the key (parameters are not supported)", ErrInvalidKey, s[i+1:])
			}
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("%w: character %q at %d", ErrInvalidKey, c, i)
		default:
			b.WriteByte(c)
		}
	}
	return "", fmt.Errorf("%w: missing closing quote", ErrInvalidKey)
}

// scopedKey is the key a Store sees: SHA-256 of the length-prefixed scope
// parts (over HTTP: principal, method, route) and client key, in hex.
// Hashing makes the parts unambiguous (no separator a client could
// inject), gives every store a fixed-size key that needs no escaping, and
// keeps principals (user IDs, API key names) out of the store's key space.
func scopedKey(scope []string, key string) string {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	for _, s := range scope {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
		h.Write([]byte(s))
	}
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(key)))])
	h.Write([]byte(key))
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0]))
}

// scopeID is the caller ID a ScopedStore sees: the first 128 bits of the
// SHA-256 of the caller's name, in hex, so that no principal reaches the
// store and every store gets a short fixed-size ID to count keys by.
func scopeID(caller string) string {
	sum := sha256.Sum256([]byte("scope\x00" + caller))
	return hex.EncodeToString(sum[:16])
}
