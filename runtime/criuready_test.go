package runtime

import (
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// keptChildren records what the runtime asked of the shim's reaper.
type keptChildren struct {
	mu    sync.Mutex
	owned map[int]int // pid: Own calls minus Disown calls
}

func (k *keptChildren) keeper() CRIUChildren {
	return CRIUChildren{
		Hold:   func() func() { return func() {} },
		Own:    func(pid int) { k.add(pid, 1) },
		Disown: func(pid int) { k.add(pid, -1) },
	}
}

func (k *keptChildren) get(pid int) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.owned[pid]
}

func (k *keptChildren) add(pid, n int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.owned[pid] += n
}

// TestReadyCRIU: a CRIU started ahead is owned against the reaper from its start to its wait, is
// replaced when it died meanwhile (the restore watchdog kills the shim's CRIU children), and is
// gone, waited for and disowned once its container is; nothing starts after that.
func TestReadyCRIU(t *testing.T) {
	useFakeCRIU(t)
	kept := &keptChildren{owned: map[int]int{}}
	before := criuKeeper
	KeepCRIUChildren(kept.keeper())
	t.Cleanup(func() { KeepCRIUChildren(before) })

	var r readyCRIU
	first, err := r.take() // nothing started ahead: started now
	if err != nil {
		t.Fatal(err)
	}
	first.end()
	if r.next != nil {
		t.Fatal("a CRIU was started ahead that nobody asked for")
	}
	r.prepare() // a checkpoint answered
	r.prepare() // one at most
	dead, err := r.take()
	if err != nil {
		t.Fatal(err)
	}
	if kept.get(dead.pid) != 1 {
		t.Fatalf("CRIU %d started ahead is not owned against the reaper", dead.pid)
	}
	dead.end()
	r.prepare()
	r.mu.Lock()
	p := r.next
	r.mu.Unlock()
	<-p.done
	if err := unix.Kill(p.s.pid, unix.SIGKILL); err != nil { // as the restore watchdog does
		t.Fatal(err)
	}
	<-p.s.exited
	again, err := r.take()
	if err != nil {
		t.Fatal(err)
	}
	if again == p.s || !again.alive() {
		t.Fatalf("a CRIU that died while ready was handed over")
	}
	again.end()
	r.prepare()
	r.mu.Lock()
	last := r.next
	r.mu.Unlock()
	r.end()
	r.prepare()
	if _, err := r.take(); err == nil {
		t.Fatal("a CRIU was handed over after its container was gone")
	}
	if last.s.alive() || unix.Kill(last.s.pid, 0) == nil {
		t.Fatalf("the CRIU started ahead outlived its container")
	}
	kept.mu.Lock()
	defer kept.mu.Unlock()
	for pid, n := range kept.owned {
		if n != 0 {
			t.Errorf("CRIU %d: %d Own calls not matched by Disown", pid, n)
		}
	}
}

// TestReadyCRIUHandedOver: the CRIU an engine started ahead survives its Vacate once kept, and
// serves the next engine's dump if it adopts it; otherwise (the next engine has one, or is gone,
// or no engine adopts it) it is ended and waited for.
func TestReadyCRIUHandedOver(t *testing.T) {
	useFakeCRIU(t)
	for _, tc := range []struct {
		name    string
		next    func(t *testing.T) *Container // the engine that adopts, nil for none
		adopted bool
	}{
		{name: "adopted", next: func(*testing.T) *Container { return &Container{} }, adopted: true},
		{name: "next has one", next: func(t *testing.T) *Container {
			c := &Container{}
			c.ready.prepare()
			t.Cleanup(c.ready.end)
			return c
		}},
		{name: "next gone", next: func(*testing.T) *Container {
			c := &Container{}
			c.ready.end()
			return c
		}},
		{name: "not adopted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := &Container{}
			if old.KeepReadyCRIU() != nil {
				t.Fatal("kept a CRIU that was never started")
			}
			old.ready.prepare()
			kept := old.KeepReadyCRIU()
			old.ready.end() // Vacate
			<-kept.p.done
			s := kept.p.s
			if !s.alive() {
				t.Fatal("the old engine's end ended the CRIU it no longer has")
			}
			if tc.next == nil {
				kept.End()
			} else {
				next := tc.next(t)
				next.AdoptReadyCRIU(kept)
				if tc.adopted {
					got, err := next.ready.take()
					if err != nil || got != s {
						t.Fatalf("the next engine's dump got CRIU %v (%v), want the one kept, %d", got, err, s.pid)
					}
					defer got.end()
					return
				}
			}
			if s.alive() || unix.Kill(s.pid, 0) == nil {
				t.Fatalf("CRIU %d, kept and not adopted, is still there", s.pid)
			}
		})
	}
}
