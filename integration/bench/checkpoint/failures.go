package main

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"syscall"
	"time"
)

// The benchmark has to survive the systems it measures (issue 21): an operation that fails
// (a checkpoint, a rollback, a fork, the verification of a restore, or the workload's own steps
// around them) is recorded, with its system, workload and step, and the run goes on; the figures
// come from the operations that succeeded and the table shows, per system and workload, how many
// failed and how many were retried.
//
// The retry policy is the same for both systems: an operation that fails with a transient error
// (transientRE: the cgroup freezer's "unable to freeze" or another EBUSY) is tried once more, and
// the retry is logged and counted whether it succeeds or not. Any other error is not retried.

// transientRE matches the errors worth one retry. They arrive as text through gRPC and the
// runtimes' own messages, so they are told apart by text: runc's cgroup v1 freezer gives up
// with "unable to freeze" when a task does not stop within its time, CRIU's and the kernel's
// EBUSY is "device or resource busy".
var transientRE = regexp.MustCompile(`unable to freeze|device or resource busy`)

func transient(err error) bool {
	return errors.Is(err, syscall.EBUSY) || transientRE.MatchString(err.Error())
}

// where is the workload a failure belongs to, as the table names it.
type where struct{ workload, param string }

// failure is one operation that failed or was retried.
type failure struct {
	where
	system, step string
	err          error // the error that remained; nil when the retry succeeded
	retried      error // the transient error that caused a retry, nil without one
}

// recorder keeps the failures and retries of the run, in the order they happened.
type recorder struct{ all []failure }

// counts is how many operations failed and how many were retried, per workload and system.
func (r *recorder) counts() map[where]map[string][2]int {
	out := map[where]map[string][2]int{}
	for _, f := range r.all {
		if out[f.where] == nil {
			out[f.where] = map[string][2]int{}
		}
		c := out[f.where][f.system]
		if f.err != nil {
			c[0]++
		}
		if f.retried != nil {
			c[1]++
		}
		out[f.where][f.system] = c
	}
	return out
}

// tally is how many operations failed and how many were retried, in all.
func (r *recorder) tally() (failed, retried int) {
	for _, f := range r.all {
		if f.err != nil {
			failed++
		}
		if f.retried != nil {
			retried++
		}
	}
	return failed, retried
}

// places are the workloads with failures or retries, sorted.
func (r *recorder) places() []where {
	var out []where
	for w := range r.counts() {
		out = append(out, w)
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].workload+"\x00"+out[i].param < out[j].workload+"\x00"+out[j].param
	})
	return out
}

// op runs one operation of system sys in workload w, named step, under the retry policy. An error
// that remains is recorded, logged and returned; the caller goes on without what the operation
// would have given. It returns how long the attempt that succeeded took. After an interrupt
// (e.ctx cancelled) nothing is recorded: the run is stopping, not failing.
func (e *env) op(w where, sys, step string, f func() error) (time.Duration, error) {
	start := time.Now()
	err := f()
	var retried error
	if err != nil && e.ctx.Err() == nil && transient(err) {
		retried = err
		e.progress("%-6s %s: %v: retrying once (transient)", sys, step, err)
		start = time.Now()
		err = f()
	}
	took := time.Since(start)
	if e.ctx.Err() != nil {
		return took, e.ctx.Err()
	}
	if err != nil || retried != nil {
		e.rec.all = append(e.rec.all, failure{where: w, system: sys, step: step, err: err, retried: retried})
	}
	if err != nil {
		e.progress("%-6s FAILED %s: %v", sys, step, err)
		return took, fmt.Errorf("%s: %w", step, err)
	}
	return took, nil
}
