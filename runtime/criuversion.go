package runtime

import (
	"reflect"
	"sync/atomic"
	"unsafe"

	"github.com/opencontainers/runc/libcontainer"
)

// libcontainer asks CRIU for its version (go-criu: a `criu swrk` run for a single VERSION
// request, 10-23 ms on this loaded 2-core host) before the first Checkpoint or Restore of each
// Container object, and keeps the answer in that object only, in an unexported field that has no
// setter. The engine gets a new object at every restore in place (Create, then Load once CRIU is
// done), so every rollback, and the first dump after it, ran CRIU once more only to hear the
// version it had already given. Once one object has asked, the answer is given to every object
// the engine creates or loads afterwards, through reflect. A libcontainer without the field (an
// update renamed it: TestCRIUVersionField fails) leaves each object to ask, as before. The
// version is the shim's for its lifetime, as libcontainer's own check is the object's: CRIU
// replaced under a running shim is not asked again (libcontainer only compares it with the
// minimums of features cklite does not use: 3.0, 3.14, 3.16).
var knownCRIUVersion atomic.Int64

// criuVersionField is lc's cached CRIU version, settable, if this libcontainer has it.
func criuVersionField(lc *libcontainer.Container) (reflect.Value, bool) {
	f := reflect.ValueOf(lc).Elem().FieldByName("criuVersion")
	if !f.IsValid() || f.Kind() != reflect.Int {
		return reflect.Value{}, false
	}
	return reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem(), true
}

// learnCRIUVersion keeps the version lc was told by CRIU, if it asked.
func learnCRIUVersion(lc *libcontainer.Container) {
	if f, ok := criuVersionField(lc); ok && f.Int() != 0 {
		knownCRIUVersion.Store(f.Int())
	}
}

// giveCRIUVersion tells lc the version an earlier object was told, if any.
func giveCRIUVersion(lc *libcontainer.Container) {
	v := knownCRIUVersion.Load()
	if v == 0 {
		return
	}
	if f, ok := criuVersionField(lc); ok && f.Int() == 0 {
		f.SetInt(v)
	}
}
