package shim

// inBackground runs f in a goroutine of its own and returns the function that waits for its
// answer: a step of a checkpoint that does not need the one after it (a containerd round trip, a
// snapshot's Prepare, a commit beside CRIU's dump) runs beside it. The waiter may be called any
// number of times, from any goroutine.
func inBackground[T any](f func() (T, error)) func() (T, error) {
	done := make(chan struct{})
	var v T
	var err error
	go func() {
		defer close(done)
		v, err = f()
	}()
	return func() (T, error) {
		<-done
		return v, err
	}
}
