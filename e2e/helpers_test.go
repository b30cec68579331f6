package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func fmtSscan(s string, v ...any) (int, error) { return fmt.Sscan(strings.TrimSpace(s), v...) }

// waitUntil polls ok until it says done or d passes; then it fails the test
// with what ok last saw.
func waitUntil(t *testing.T, what string, d time.Duration, ok func() (done bool, seen string)) {
	t.Helper()
	for deadline := time.Now().Add(d); ; time.Sleep(200 * time.Millisecond) {
		done, seen := ok()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited %s in vain for %s: %s", d, what, seen)
		}
	}
}
