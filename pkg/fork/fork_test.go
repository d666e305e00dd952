package fork

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

// fakeForker starts every fork but those in fail, and removes every one but those in keep.
type fakeForker struct {
	taken, fail, keep []string
	started, removed  []string
	mu                sync.Mutex
	active, most      int // forks starting at once: now, at most
}

func (f *fakeForker) exists(_ context.Context, id string) (bool, error) {
	return slices.Contains(f.taken, id), nil
}

func (f *fakeForker) start(_ context.Context, id string) (Fork, error) {
	f.mu.Lock()
	f.active++
	f.most = max(f.most, f.active)
	f.mu.Unlock()
	time.Sleep(time.Millisecond) // long enough for the forks allowed at once to overlap
	f.mu.Lock()
	defer f.mu.Unlock()
	f.active--
	if slices.Contains(f.fail, id) {
		return Fork{}, errors.New("criu failed")
	}
	f.started = append(f.started, id)
	return Fork{ID: id, Name: id}, nil
}

func (f *fakeForker) remove(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if slices.Contains(f.keep, id) {
		return errors.New("task busy")
	}
	f.removed = append(f.removed, id)
	return nil
}

func TestRun(t *testing.T) {
	names := []string{"w-1", "w-2", "w-3", "w-4"}
	for _, tc := range []struct {
		name        string
		fake        *fakeForker
		cleanup     bool
		wantStarted []string
		wantRunning []string // Report.Forks
		wantRemoved []string
		wantFailed  []string
		isErr       func(error) bool
		says        []string
	}{
		{
			name:        "all start",
			fake:        &fakeForker{},
			wantStarted: names, wantRunning: names,
		},
		{
			name:  "a name taken: nothing starts",
			fake:  &fakeForker{taken: []string{"w-3"}},
			isErr: errdefs.IsAlreadyExists, says: []string{"w-3 already exists"},
		},
		{
			name:        "fork 3 fails: the others start and stay",
			fake:        &fakeForker{fail: []string{"w-3"}},
			wantStarted: []string{"w-1", "w-2", "w-4"}, wantRunning: []string{"w-1", "w-2", "w-4"}, wantFailed: []string{"w-3"},
			says: []string{"fork 3 of 4 (w-3): criu failed"},
		},
		{
			name:        "forks 1 and 3 fail: each is reported",
			fake:        &fakeForker{fail: []string{"w-1", "w-3"}},
			wantStarted: []string{"w-2", "w-4"}, wantRunning: []string{"w-2", "w-4"}, wantFailed: []string{"w-1", "w-3"},
			says: []string{"fork 1 of 4 (w-1): criu failed", "fork 3 of 4 (w-3): criu failed"},
		},
		{
			name:        "fork 3 fails, cleanup: the others are removed",
			fake:        &fakeForker{fail: []string{"w-3"}},
			cleanup:     true,
			wantStarted: []string{"w-1", "w-2", "w-4"}, wantRemoved: []string{"w-1", "w-2", "w-4"}, wantFailed: []string{"w-3"},
			says: []string{"fork 3 of 4 (w-3): criu failed"},
		},
		{
			name:        "cleanup cannot remove one: it stays and is named",
			fake:        &fakeForker{fail: []string{"w-3"}, keep: []string{"w-1"}},
			cleanup:     true,
			wantStarted: []string{"w-1", "w-2", "w-4"}, wantRunning: names[:1], wantRemoved: []string{"w-2", "w-4"}, wantFailed: []string{"w-3"},
			says: []string{"fork 3 of 4 (w-3): criu failed", "remove fork w-1: task busy"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var progress []string
			rep, err := run(context.Background(), tc.fake, names, Options{
				CleanupOnError: tc.cleanup,
				Progress: func(f Fork, err error) {
					if err == nil {
						progress = append(progress, f.ID)
					}
				},
			})
			if len(tc.says) == 0 && err != nil {
				t.Fatalf("run: %v", err)
			}
			for _, s := range tc.says {
				if err == nil || !strings.Contains(err.Error(), s) {
					t.Fatalf("run error %v, want one saying %q", err, s)
				}
			}
			if tc.isErr != nil && !tc.isErr(err) {
				t.Fatalf("run error %v is of the wrong kind", err)
			}
			var running []string
			for _, f := range rep.Forks {
				running = append(running, f.ID)
			}
			for _, c := range []struct {
				what      string
				got, want []string
			}{
				{"started", tc.fake.started, tc.wantStarted},
				{"reported by progress", progress, tc.wantStarted},
				{"reported running", running, tc.wantRunning},
				{"removed", tc.fake.removed, tc.wantRemoved},
				{"reported removed", rep.Removed, tc.wantRemoved},
				{"reported failed", rep.Failed, tc.wantFailed},
			} {
				if !reflect.DeepEqual(c.got, c.want) {
					t.Errorf("%s: %v, want %v", c.what, c.got, c.want)
				}
			}
		})
	}
}

// TestRunParallel starts forks several at a time: never more, in any order, reported in name
// order; a failure stops none of the others, and with CleanupOnError all that started are removed.
func TestRunParallel(t *testing.T) {
	names := []string{"p-1", "p-2", "p-3", "p-4", "p-5", "p-6", "p-7", "p-8"}
	for _, parallel := range []int{2, 4} {
		f := &fakeForker{}
		rep, err := run(context.Background(), f, names, Options{Parallel: parallel})
		if err != nil {
			t.Fatalf("parallel %d: %v", parallel, err)
		}
		if f.most != parallel {
			t.Errorf("parallel %d: %d forks started at once", parallel, f.most)
		}
		var running []string
		for _, fk := range rep.Forks {
			running = append(running, fk.ID)
		}
		if !reflect.DeepEqual(running, names) {
			t.Errorf("parallel %d: reported %v, want %v", parallel, running, names)
		}
	}

	f := &fakeForker{fail: []string{"p-3"}}
	rep, err := run(context.Background(), f, names, Options{Parallel: 3, CleanupOnError: true})
	if err == nil || !strings.Contains(err.Error(), "fork 3 of 8 (p-3): criu failed") {
		t.Fatalf("run error %v, want fork 3's", err)
	}
	if len(rep.Forks) != 0 || len(f.started) != 7 {
		t.Fatalf("after the failure: %v still running, %v started", rep.Forks, f.started)
	}
	slices.Sort(f.started)
	slices.Sort(f.removed)
	if !reflect.DeepEqual(f.removed, f.started) {
		t.Fatalf("removed %v, want every fork started: %v", f.removed, f.started)
	}
}
