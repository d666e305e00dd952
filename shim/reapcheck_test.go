package shim

import (
	"testing"
	"time"
)

// TestReapCheck: PID 1 is found not to reap once an exit stays a zombie past the grace period
// or reapZombies exits are zombies at once; exits found reaped are forgotten, and the finding
// is final and reported once.
func TestReapCheck(t *testing.T) {
	t0 := time.Unix(1000, 0)
	for _, tc := range []struct {
		name  string
		exits []testExit
		want  bool
	}{
		{name: "no exec yet", want: true},
		{name: "zombie within the grace period", exits: []testExit{{1, true, reapGrace / 2}}, want: true},
		{name: "zombie past the grace period", exits: []testExit{{1, true, 2 * reapGrace}}},
		{name: "reaped past the grace period", exits: []testExit{{1, false, 2 * reapGrace}, {2, true, 0}}, want: true},
		{name: "reapZombies-1 recent zombies", exits: zombies(reapZombies-1, func(pid int) testExit { return testExit{pid, true, 0} }), want: true},
		{name: "reapZombies recent zombies", exits: zombies(reapZombies, func(pid int) testExit { return testExit{pid, true, 0} })},
		{name: "reapZombies recent exits, one reaped", exits: zombies(reapZombies, func(pid int) testExit { return testExit{pid, pid != 3, 0} }), want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r reapCheck
			zombie := map[int]bool{}
			for _, e := range tc.exits {
				r.exited(e.pid, uint64(e.pid)*10, t0.Add(-e.ago))
				zombie[e.pid] = e.zombie
			}
			isZombie := func(pid int, start uint64) bool { return zombie[pid] && start == uint64(pid)*10 }
			reaps, learned := r.reaps(t0, isZombie)
			if reaps != tc.want || learned == tc.want {
				t.Fatalf("reaps = %v, learned = %v; want reaps = %v, learned = %v", reaps, learned, tc.want, !tc.want)
			}
			if r.gaveUp() == tc.want {
				t.Fatalf("gaveUp = %v after reaps = %v", r.gaveUp(), reaps)
			}
			// Once found, final and said once; before, the reaped exits are gone.
			r.exited(99, 990, t0.Add(-time.Hour))
			zombie[99] = true
			reaps, learned = r.reaps(t0, isZombie)
			if tc.want && (reaps || !learned) {
				t.Fatalf("an old zombie then: reaps = %v, learned = %v", reaps, learned)
			}
			if !tc.want && (reaps || learned) {
				t.Fatalf("after the finding: reaps = %v, learned = %v, want false, false", reaps, learned)
			}
		})
	}
}

// TestReapCheckReusedPid: a pid reaped and reused by another process that is now a zombie is
// not the exec's zombie.
func TestReapCheckReusedPid(t *testing.T) {
	var r reapCheck
	t0 := time.Unix(1000, 0)
	r.exited(7, 70, t0.Add(-time.Hour))
	if reaps, _ := r.reaps(t0, func(pid int, start uint64) bool { return pid == 7 && start == 71 }); !reaps {
		t.Fatal("the zombie of a reused pid was taken for the exec's")
	}
}

// testExit is an exit of pid seen ago, a zombie still or not.
type testExit struct {
	pid    int
	zombie bool
	ago    time.Duration
}

// zombies are n exits of pids 1..n made by mk.
func zombies(n int, mk func(pid int) testExit) []testExit {
	exits := make([]testExit, n)
	for i := range exits {
		exits[i] = mk(i + 1)
	}
	return exits
}
