package runtime

import (
	"testing"

	"github.com/opencontainers/runc/libcontainer"
)

// TestCRIUVersionField: libcontainer still caches CRIU's version in the field the engine fills
// in (criuversion.go); an update that renames it fails here, not as a slower rollback.
func TestCRIUVersionField(t *testing.T) {
	if _, ok := criuVersionField(new(libcontainer.Container)); !ok {
		t.Fatal("libcontainer.Container has no int field criuVersion: every restore asks CRIU for its version again")
	}
}

func TestCRIUVersionPassedOn(t *testing.T) {
	defer knownCRIUVersion.Store(knownCRIUVersion.Load())
	for _, tc := range []struct {
		name           string
		known, own     int64
		want, wantKeep int64
	}{
		{name: "nothing known: the object asks", known: 0, own: 0, want: 0, wantKeep: 0},
		{name: "known: given to a new object", known: 40201, own: 0, want: 40201, wantKeep: 40201},
		{name: "the object's own answer stays and is kept", known: 40101, own: 40201, want: 40201, wantKeep: 40201},
	} {
		t.Run(tc.name, func(t *testing.T) {
			knownCRIUVersion.Store(tc.known)
			lc := new(libcontainer.Container)
			f, _ := criuVersionField(lc)
			f.SetInt(tc.own)
			giveCRIUVersion(lc)
			if got := f.Int(); got != tc.want {
				t.Errorf("version given: %d, want %d", got, tc.want)
			}
			learnCRIUVersion(lc)
			if got := knownCRIUVersion.Load(); got != tc.wantKeep {
				t.Errorf("version kept: %d, want %d", got, tc.wantKeep)
			}
		})
	}
}
