package criuimage

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
)

// NsIDs are the namespace ids of a task (task_kobj_ids_entry): tasks that share a namespace
// share its id; 0 means the image does not say.
type NsIDs struct {
	PID, Net, IPC, UTS, Mnt, User, Cgroup, Time uint32
}

func decodeNsIDs(b []byte) (NsIDs, error) {
	fs, err := fields(b)
	if err != nil {
		return NsIDs{}, err
	}
	var ids NsIDs
	for _, f := range fs {
		v := uint32(f.v)
		switch f.num {
		case 5:
			ids.PID = v
		case 6:
			ids.Net = v
		case 7:
			ids.IPC = v
		case 8:
			ids.UTS = v
		case 9:
			ids.Mnt = v
		case 10:
			ids.User = v
		case 11:
			ids.Cgroup = v
		case 12:
			ids.Time = v
		}
	}
	return ids, nil
}

// Inventory is inventory.img: the image version and the namespaces of the dumping CRIU (the
// host's, for a container dumped from outside).
type Inventory struct {
	Version uint32
	RootIDs *NsIDs
}

func decodeInventory(b []byte) (Inventory, error) {
	fs, err := fields(b)
	if err != nil {
		return Inventory{}, err
	}
	var inv Inventory
	seen := false
	for _, f := range fs {
		switch f.num {
		case 1:
			inv.Version, seen = uint32(f.v), true
		case 3:
			ids, err := decodeNsIDs(f.bytes)
			if err != nil {
				return inv, fmt.Errorf("root_ids: %w", err)
			}
			inv.RootIDs = &ids
		}
	}
	if !seen {
		return inv, fmt.Errorf("img_version: %w", errMissing)
	}
	return inv, nil
}

// Task is one pstree entry: a process and its threads.
type Task struct {
	Pid, Ppid uint32
	Threads   []uint32
}

func decodeTask(b []byte) (Task, error) {
	fs, err := fields(b)
	if err != nil {
		return Task{}, err
	}
	var t Task
	for _, f := range fs {
		switch f.num {
		case 1:
			t.Pid = uint32(f.v)
		case 2:
			t.Ppid = uint32(f.v)
		case 5:
			vs, err := varints(f)
			if err != nil {
				return t, fmt.Errorf("threads: %w", err)
			}
			for _, v := range vs {
				t.Threads = append(t.Threads, uint32(v))
			}
		}
	}
	if t.Pid == 0 {
		return t, fmt.Errorf("pid: %w", errMissing)
	}
	return t, nil
}

// Creds are a thread's credentials (creds_entry); capability sets are bit masks.
type Creds struct {
	UID, GID, EUID, EGID, SUID, SGID, FSUID, FSGID uint32
	CapInh, CapPrm, CapEff, CapBnd                 uint64
	Groups                                         []uint32
}

func decodeCreds(b []byte) (Creds, error) {
	fs, err := fields(b)
	if err != nil {
		return Creds{}, err
	}
	var c Creds
	ids := map[protowire.Number]*uint32{1: &c.UID, 2: &c.GID, 3: &c.EUID, 4: &c.EGID, 5: &c.SUID, 6: &c.SGID, 7: &c.FSUID, 8: &c.FSGID}
	caps := map[protowire.Number]*uint64{9: &c.CapInh, 10: &c.CapPrm, 11: &c.CapEff, 12: &c.CapBnd}
	words := map[protowire.Number]int{}
	for _, f := range fs {
		if p, ok := ids[f.num]; ok {
			*p = uint32(f.v)
			continue
		}
		if p, ok := caps[f.num]; ok {
			// Repeated u32 words, lowest first.
			vs, err := varints(f)
			if err != nil {
				return c, err
			}
			for _, v := range vs {
				if words[f.num] < 2 {
					*p |= uint64(uint32(v)) << (32 * words[f.num])
				} else if v != 0 {
					return c, fmt.Errorf("capability bits beyond 64 in field %d", f.num)
				}
				words[f.num]++
			}
			continue
		}
		if f.num == 14 {
			vs, err := varints(f)
			if err != nil {
				return c, err
			}
			for _, v := range vs {
				c.Groups = append(c.Groups, uint32(v))
			}
		}
	}
	return c, nil
}

// Thread is what core-<tid>.img says about a thread's privileges.
type Thread struct {
	Tid     uint32
	IDs     *NsIDs // the task's namespaces (core_entry.ids), on a process's main thread
	Creds   *Creds
	Seccomp uint32 // 0 disabled, 1 strict, 2 filter
	Zombie  bool   // an exited process: CRIU recreates it only to exit again, with no credentials
}

func decodeCore(b []byte) (Thread, error) {
	fs, err := fields(b)
	if err != nil {
		return Thread{}, err
	}
	var t Thread
	for _, f := range fs {
		switch f.num {
		case 3: // task_core_entry: old_seccomp_mode (11), before per-thread modes
			tc, err := fields(f.bytes)
			if err != nil {
				return t, fmt.Errorf("tc: %w", err)
			}
			for _, g := range tc {
				if g.num == 11 && t.Seccomp == 0 {
					t.Seccomp = uint32(g.v)
				}
			}
		case 4:
			ids, err := decodeNsIDs(f.bytes)
			if err != nil {
				return t, fmt.Errorf("ids: %w", err)
			}
			t.IDs = &ids
		case 5: // thread_core_entry: creds (10), seccomp_mode (11)
			th, err := fields(f.bytes)
			if err != nil {
				return t, fmt.Errorf("thread_core: %w", err)
			}
			for _, g := range th {
				switch g.num {
				case 10:
					c, err := decodeCreds(g.bytes)
					if err != nil {
						return t, fmt.Errorf("creds: %w", err)
					}
					t.Creds = &c
				case 11:
					t.Seccomp = uint32(g.v)
				}
			}
		}
	}
	return t, nil
}

// Pagemap is pagemap-<pid>.img: which pages-<PagesID>.img holds the process's pages, and how many.
type Pagemap struct {
	PagesID uint32
	Present uint64 // pages stored in the pages file
	Parent  uint64 // pages said to be in a parent image
	Runs    []PageRun
}

func decodePagemap(path string, entries [][]byte) (Pagemap, error) {
	f, err := decodePagemapFile(path, entries)
	if err != nil {
		return Pagemap{}, err
	}
	pm := Pagemap{PagesID: f.PagesID, Runs: f.Runs}
	for _, r := range f.Runs {
		if r.InParent() {
			pm.Parent += r.Pages
		}
		if r.Present() {
			pm.Present += r.Pages
		}
	}
	return pm, nil
}

// Mount is one mountpoints entry (mnt_entry).
type Mount struct {
	ID, Parent uint32
	FSType     uint32
	FSName     string
	RootDev    uint32
	Root       string
	Mountpoint string // absolute, within the container's root
	Source     string
	External   bool
	ExtKey     string
}

// CRIU's fstype codes (images/mnt.proto) of the kernel's own file systems a container's mount
// namespace holds.
const (
	fsProc    = 1
	fsSysfs   = 2
	fsTmpfs   = 5
	fsDevpts  = 6
	fsCgroup  = 12
	fsMqueue  = 14
	fsAuto    = 16
	fsCgroup2 = 23
)

func decodeMount(b []byte) (Mount, error) {
	fs, err := fields(b)
	if err != nil {
		return Mount{}, err
	}
	var m Mount
	for _, f := range fs {
		switch f.num {
		case 1:
			m.FSType = uint32(f.v)
		case 2:
			m.ID = uint32(f.v)
		case 3:
			m.RootDev = uint32(f.v)
		case 4:
			m.Parent = uint32(f.v)
		case 6:
			m.Root = string(f.bytes)
		case 7:
			m.Mountpoint = cleanMountpoint(string(f.bytes))
		case 8:
			m.Source = string(f.bytes)
		case 13:
			m.External = f.v != 0
		case 14:
			m.FSName = string(f.bytes)
		case 18:
			m.ExtKey = string(f.bytes)
		}
	}
	return m, nil
}

// cleanMountpoint makes CRIU's mountpoint ("/proc", "./proc" in older images) absolute.
func cleanMountpoint(mp string) string {
	return filepath.Clean("/" + strings.TrimPrefix(mp, "."))
}

// Image is what a restore of an image directory would bring back.
type Image struct {
	Inventory Inventory
	Tasks     []Task
	Threads   []Thread // one per thread of every task
	Pagemaps  map[uint32]Pagemap
	Mounts    []Mount
}

// Read decodes dir's inventory, process tree, cores, pagemaps and mountpoints. A directory
// without an inventory is not a CRIU image.
func Read(dir string) (*Image, error) {
	img := &Image{Pagemaps: map[uint32]Pagemap{}}
	inv, err := readOne(dir, "inventory.img", magicInventory)
	if err != nil {
		return nil, err
	}
	if img.Inventory, err = decodeInventory(inv); err != nil {
		return nil, fmt.Errorf("inventory.img: %w", err)
	}
	ents, err := readImage(filepath.Join(dir, "pstree.img"), magicPstree)
	if err != nil {
		return nil, err
	}
	if len(ents) == 0 {
		return nil, fmt.Errorf("pstree.img: no process")
	}
	for i, e := range ents {
		t, err := decodeTask(e)
		if err != nil {
			return nil, fmt.Errorf("pstree.img: entry %d: %w", i, err)
		}
		img.Tasks = append(img.Tasks, t)
		if err := img.readTask(dir, t); err != nil {
			return nil, err
		}
	}
	mnts, err := filepath.Glob(filepath.Join(dir, "mountpoints-*.img"))
	if err != nil {
		return nil, err
	}
	for _, p := range mnts {
		ents, err := readImage(p, magicMnts)
		if err != nil {
			return nil, err
		}
		for i, e := range ents {
			m, err := decodeMount(e)
			if err != nil {
				return nil, fmt.Errorf("%s: entry %d: %w", filepath.Base(p), i, err)
			}
			img.Mounts = append(img.Mounts, m)
		}
	}
	return img, nil
}

// readTask reads the cores of t's threads and its pagemap.
func (img *Image) readTask(dir string, t Task) error {
	zombie := isZombie(dir, t.Pid)
	threads := t.Threads
	if len(threads) == 0 || zombie {
		// CRIU restores a zombie from its core-<pid>.img alone; the thread ids it writes for one
		// are not read back, and were seen to be garbage (core-3797684976.img of a busybox sh's
		// exited child).
		threads = []uint32{t.Pid}
	}
	for _, tid := range threads {
		name := fmt.Sprintf("core-%d.img", tid)
		core, err := readOne(dir, name, magicCore)
		if err != nil {
			return err
		}
		th, err := decodeCore(core)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		th.Tid = tid
		th.Zombie = zombie
		if tid == t.Pid {
			// CRIU 4.x keeps a task's namespaces in ids-<pid>.img, older ones in its core.
			if ids, err := readIDs(dir, t.Pid); err != nil {
				return err
			} else if ids != nil {
				th.IDs = ids
			}
		}
		img.Threads = append(img.Threads, th)
	}
	name := filepath.Join(dir, fmt.Sprintf("pagemap-%d.img", t.Pid))
	ents, err := readImage(name, magicPagemap)
	if os.IsNotExist(err) {
		return nil // a zombie has no memory
	}
	if err != nil {
		return err
	}
	pm, err := decodePagemap(filepath.Base(name), ents)
	if err != nil {
		return err
	}
	img.Pagemaps[t.Pid] = pm
	return nil
}

// isZombie reports whether task pid was dumped as a zombie: it has no memory, so no pagemap.
func isZombie(dir string, pid uint32) bool {
	_, err := os.Stat(filepath.Join(dir, fmt.Sprintf("pagemap-%d.img", pid)))
	return os.IsNotExist(err)
}

// readIDs reads ids-<pid>.img, or returns nil if there is none.
func readIDs(dir string, pid uint32) (*NsIDs, error) {
	name := fmt.Sprintf("ids-%d.img", pid)
	b, err := readOne(dir, name, magicIDs)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	ids, err := decodeNsIDs(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return &ids, nil
}

// readOne reads an image of exactly one entry.
func readOne(dir, name string, magic uint32) ([]byte, error) {
	ents, err := readImage(filepath.Join(dir, name), magic)
	if err != nil {
		return nil, err
	}
	if len(ents) != 1 {
		return nil, fmt.Errorf("%s: %d entries, want 1", name, len(ents))
	}
	return ents[0], nil
}
