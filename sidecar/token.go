package sidecar

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math"
	"strconv"
	"time"
)

// A lock token names one process of a lock holder: the process's start time
// in Unix nanoseconds as 16 lowercase hex digits, then 8 lowercase hex
// digits of randomness (two processes started in one nanosecond). A newer
// process takes its holder's lock over from an older one; "newer" is decided
// on the parsed start time, never on the token as a string, and a start time
// later than the sidecar's clock by more than LockTokenSkew is refused:
// otherwise any caller with the holder's identity could pick a token that
// sorts after every real one ("zzzz", "ffff…") and keep the lock forever.
const (
	lockTokenTimeDigits = 16
	lockTokenRandDigits = 8
	// LockTokenLength is the length of a lock token.
	LockTokenLength = lockTokenTimeDigits + lockTokenRandDigits
	// LockTokenSkew is how far a token's start time may lie ahead of the
	// sidecar's clock: the clocks of the controllers' and the sidecars'
	// nodes differ by far less under NTP, and a forged token made at the
	// limit outranks the real processes for this long at most.
	LockTokenSkew = time.Minute
)

// NewLockToken returns a fresh token for a process started at start.
func NewLockToken(start time.Time) (string, error) {
	random := make([]byte, lockTokenRandDigits/2)
	if _, err := rand.Read(random); err != nil {
		return "", fmt.Errorf("reading randomness for a lock token: %w", err)
	}
	return fmt.Sprintf("%0*x%s", lockTokenTimeDigits, start.UnixNano(), hex.EncodeToString(random)), nil
}

// lockTokenStart parses token and returns its process's start time in Unix
// nanoseconds; the empty token (a caller without one: an operator with
// curl, or a lock taken before tokens) starts at 0, before every real one.
// field names where the token came from, for the error.
func lockTokenStart(field, token string, now time.Time) (int64, *Error) {
	if token == "" {
		return 0, nil
	}
	want := fmt.Sprintf("want %d lowercase hex digits: the process's start time in Unix nanoseconds (%d digits), then %d random digits, as the controller makes it", LockTokenLength, lockTokenTimeDigits, lockTokenRandDigits)
	if len(token) != LockTokenLength {
		return 0, badRequest(ReasonInvalidToken, "%s %q is %d characters long; %s", field, token, len(token), want)
	}
	for i, c := range token {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return 0, badRequest(ReasonInvalidToken, "%s %q has the character %q at position %d; %s", field, token, c, i, want)
		}
	}
	start, err := strconv.ParseUint(token[:lockTokenTimeDigits], 16, 64)
	if err != nil || start > math.MaxInt64 {
		return 0, badRequest(ReasonInvalidToken, "%s %q: its first %d digits overflow a signed 64-bit count of Unix nanoseconds; %s", field, token, lockTokenTimeDigits, want)
	}
	if at := time.Unix(0, int64(start)); at.After(now.Add(LockTokenSkew)) {
		return 0, badRequest(ReasonInvalidToken, "%s %q names a process started at %s, after this sidecar's clock (%s) plus the %s of clock skew allowed; a token from the future would outrank the processes that start later",
			field, token, at.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339), LockTokenSkew)
	}
	return int64(start), nil
}

// newerToken tells whether the process of token caller started after the
// process of the held token. A held token that does not parse (written
// before tokens were checked) counts as the oldest, so a real process can
// take its lock back.
func newerToken(caller, held string, now time.Time) bool {
	c, e := lockTokenStart("token", caller, now)
	if e != nil || caller == "" {
		return false
	}
	h, e := lockTokenStart("token", held, now)
	if e != nil {
		h = -1
	}
	return c > h
}
