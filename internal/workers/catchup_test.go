package workers

import (
	"context"
	"errors"
	"testing"
)

type rv string

func (v *rv) LastStoreSyncResourceVersion() string { return string(*v) }

func TestCatchUp(t *testing.T) {
	ctx := context.Background()
	var zero CatchUp
	v := rv("1")
	if !zero.Fresh(&v) {
		t.Error("never marked (an informer started by the leader itself): not fresh")
	}

	var c CatchUp
	if err := c.Mark(ctx, func(context.Context) (string, error) { return "100", nil }); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		last string
		want bool
	}{{"", false}, {"99", false}, {"not-a-number", false}, {"100", true}, {"7", true}} {
		v = rv(tc.last)
		if got := c.Fresh(&v); got != tc.want {
			t.Errorf("informer at %q, mark 100: fresh %v, want %v", tc.last, got, tc.want)
		}
	}

	// A mark that cannot be read, or is no number, keeps it behind.
	for _, read := range []func(context.Context) (string, error){
		func(context.Context) (string, error) { return "", errors.New("apiserver down") },
		func(context.Context) (string, error) { return "abc", nil },
	} {
		var c CatchUp
		if err := c.Mark(ctx, read); err == nil {
			t.Error("Mark hid the failure")
		}
		v = rv("18446744073709551614")
		if c.Fresh(&v) {
			t.Error("fresh without a mark")
		}
	}
}
