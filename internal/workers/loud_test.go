package workers

import (
	"testing"
	"time"
)

// One loud line per key a minute, the held-back count in the next one;
// keys do not share a budget.
func TestLoudAllowsOneLinePerKeyAMinute(t *testing.T) {
	var l Loud
	now := time.Unix(1000, 0)
	if ok, held := l.Allow("a", now); !ok || held != 0 {
		t.Fatalf("first line: %v, %d", ok, held)
	}
	for range 9999 {
		if ok, _ := l.Allow("a", now.Add(time.Second)); ok {
			t.Fatal("a second line within the minute")
		}
	}
	if ok, _ := l.Allow("b", now.Add(time.Second)); !ok {
		t.Fatal("another key was held back by the first's lines")
	}
	if ok, held := l.Allow("a", now.Add(LoudEvery)); !ok || held != 9999 {
		t.Fatalf("a minute later: %v, held back %d, want true, 9999", ok, held)
	}
}
