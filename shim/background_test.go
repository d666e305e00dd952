package shim

import (
	"errors"
	"testing"
)

// TestInBackground: the waiter returns f's answer once f has returned, the same at every call.
func TestInBackground(t *testing.T) {
	failed := errors.New("failed")
	for _, tc := range []struct {
		name string
		v    int
		err  error
	}{
		{name: "answer", v: 7},
		{name: "error", err: failed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			returned := false
			wait := inBackground(func() (int, error) {
				<-release
				returned = true
				return tc.v, tc.err
			})
			close(release)
			for range 2 {
				v, err := wait()
				if !returned || v != tc.v || !errors.Is(err, tc.err) {
					t.Fatalf("wait() = %d, %v (f returned: %t); want %d, %v", v, err, returned, tc.v, tc.err)
				}
			}
		})
	}
}
