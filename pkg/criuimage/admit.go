package criuimage

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/moby/sys/capability"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Admit decodes the CRIU images in dir and refuses, naming the reason, a directory CRIU could not
// restore completely (a truncated or padded page file, a missing core) or whose processes would get
// more than spec gives the container: credentials or capabilities beyond the spec's, no seccomp
// filter where the spec has one, the host's namespaces where the spec asks for the container's
// own, mounts beyond the spec's. The errors are errdefs InvalidArgument (a broken image) or
// PermissionDenied (an image asking for more than the spec).
//
// What is not checked (docs/security.md): the seccomp filter's program, LSM labels, rlimits, the
// memory and files' contents, and no_new_privs, which CRIU's images do not record.
//
// An image directory whose pages are partly in a parent image directory (the `parent` link of
// CRIU's incremental dumps, which cklite makes when it stores a checkpoint's memory as what
// changed since its parent's, pkg/pagechain) is admitted only with ParentsUnder: every directory
// of the chain must lie below that directory, which only cklite writes to: its checkpoints
// directory, or its cache of extracted checkpoint images, where each link is one the extraction
// made (to the image directory of the blob below in the same image; pkg/ckimage). Any other image
// directory (a client's, one a blob brought) may not have a parent: the link could name another
// container's checkpoint, whose memory CRIU would then restore.
func Admit(dir string, spec *specs.Spec, opts ...AdmitOption) error {
	var o admitOptions
	for _, opt := range opts {
		opt(&o)
	}
	img, err := Read(dir)
	if err != nil {
		return fmt.Errorf("checkpoint image %s: %w: %w", dir, err, errdefs.ErrInvalidArgument)
	}
	if err := img.CheckPages(dir, o.parentsUnder); err != nil {
		return fmt.Errorf("checkpoint image %s: %w: %w", dir, err, errdefs.ErrInvalidArgument)
	}
	if err := img.checkSpec(spec, o.rootfs); err != nil {
		return fmt.Errorf("checkpoint image %s asks for more than the container's spec allows: %w: %w", dir, err, errdefs.ErrPermissionDenied)
	}
	return nil
}

// CheckPages compares every pagemap with the size of the page file it points to: CRIU reads
// pages with preadv and, on a short file, its restorer loops for ever on reads that return 0.
// Pages in a parent image directory are refused unless parentsUnder names the directory the
// parent chain must stay in (checkChain); "" means none may.
func (img *Image) CheckPages(dir, parentsUnder string) error {
	page := uint64(os.Getpagesize())
	for _, t := range img.Tasks {
		pm, ok := img.Pagemaps[t.Pid]
		if !ok {
			continue
		}
		if err := checkPagesFile(dir, t.Pid, pm.PagesID, pm.Present, page); err != nil {
			return err
		}
	}
	return checkChain(dir, img, parentsUnder)
}

// checkPagesFile checks that pages-<id>.img of process pid's pagemap in dir holds its present pages.
func checkPagesFile(dir string, pid, id uint32, present, page uint64) error {
	name := PagesName(id)
	size, err := PagesSize(dir, name)
	if err != nil {
		return fmt.Errorf("%s of process %d: %w", name, pid, err)
	}
	if want := present * page; uint64(size) != want {
		return fmt.Errorf("%s is %d bytes, its pagemap (pagemap-%d.img) needs %d (%d pages): truncated or padded", name, size, pid, want, present)
	}
	return nil
}

// AdmitOption is an option of Admit.
type AdmitOption func(*admitOptions)

type admitOptions struct{ parentsUnder, rootfs string }

// ParentsUnder admits pages in parent image directories when the directory and its whole chain of
// parents lie below root.
func ParentsUnder(root string) AdmitOption {
	return func(o *admitOptions) { o.parentsUnder = root }
}

// ResolveIn resolves the spec's mount destinations in the container's rootfs, mounted at rootfs,
// as libcontainer does when it names a bind mount to CRIU: a destination through a symlink of
// the rootfs (the kubelet's /var/run/secrets/... in an image whose /var/run links to /run) is
// where CRIU's image records the mount. Without it, destinations are taken as they are written.
func ResolveIn(rootfs string) AdmitOption {
	return func(o *admitOptions) { o.rootfs = rootfs }
}

// CheckSpec checks the image's credentials, seccomp modes, namespaces and mounts against spec.
func (img *Image) CheckSpec(spec *specs.Spec) error { return img.checkSpec(spec, "") }

// checkSpec is CheckSpec with the spec's mount destinations resolved in rootfs (ResolveIn), ""
// for as written.
func (img *Image) checkSpec(spec *specs.Spec, rootfs string) error {
	if spec == nil || spec.Process == nil {
		return errors.New("the container has no process spec to check the image against")
	}
	allowed, err := newPrivileges(spec)
	if err != nil {
		return err
	}
	for _, th := range img.Threads {
		if err := allowed.check(th); err != nil {
			return fmt.Errorf("thread %d: %w", th.Tid, err)
		}
	}
	if err := img.checkNamespaces(spec); err != nil {
		return err
	}
	return checkMounts(img.Mounts, spec, rootfs)
}

// privileges is what the spec lets the container's processes hold.
type privileges struct {
	uid, gid       uint32
	groups         []uint32
	bounding       uint64
	setuid, setgid bool
	seccomp        bool
}

func newPrivileges(spec *specs.Spec) (privileges, error) {
	p := privileges{uid: spec.Process.User.UID, gid: spec.Process.User.GID}
	p.groups = append([]uint32{p.gid}, spec.Process.User.AdditionalGids...)
	if c := spec.Process.Capabilities; c != nil {
		mask, err := capMask(c.Bounding)
		if err != nil {
			return p, err
		}
		p.bounding = mask
	}
	p.setuid = p.bounding&(1<<uint(capability.CAP_SETUID)) != 0
	p.setgid = p.bounding&(1<<uint(capability.CAP_SETGID)) != 0
	p.seccomp = spec.Linux != nil && spec.Linux.Seccomp != nil
	return p, nil
}

// capMask turns the spec's capability names into a mask.
func capMask(names []string) (uint64, error) {
	byName := map[string]capability.Cap{}
	for _, c := range capability.ListKnown() {
		byName["CAP_"+strings.ToUpper(c.String())] = c
	}
	var m uint64
	for _, n := range names {
		c, ok := byName[n]
		if !ok {
			return 0, fmt.Errorf("unknown capability %q in the spec", n)
		}
		m |= 1 << uint(c)
	}
	return m, nil
}

// capNames names the capabilities of mask.
func capNames(mask uint64) string {
	var out []string
	for _, c := range capability.ListKnown() {
		if mask&(1<<uint(c)) != 0 {
			mask &^= 1 << uint(c)
			out = append(out, "CAP_"+strings.ToUpper(c.String()))
		}
	}
	if mask != 0 {
		out = append(out, fmt.Sprintf("unknown bits %#x", mask))
	}
	return strings.Join(out, ",")
}

// check refuses a thread whose credentials the container's processes could not reach: a
// capability outside the spec's bounding set (no process can raise one), a user or group other
// than the spec's without CAP_SETUID/CAP_SETGID, no seccomp filter when the spec has one.
func (p privileges) check(th Thread) error {
	if th.Zombie {
		return nil // it runs nothing
	}
	if th.Creds == nil {
		return errors.New("no credentials in its core image")
	}
	c := th.Creds
	for _, s := range []struct {
		name string
		mask uint64
	}{{"bounding", c.CapBnd}, {"permitted", c.CapPrm}, {"effective", c.CapEff}, {"inheritable", c.CapInh}} {
		if extra := s.mask &^ p.bounding; extra != 0 {
			return fmt.Errorf("%s capabilities %s beyond the spec's bounding set", s.name, capNames(extra))
		}
	}
	if !p.setuid {
		for _, id := range []uint32{c.UID, c.EUID, c.SUID, c.FSUID} {
			if id != p.uid {
				return fmt.Errorf("uid %d, the spec runs uid %d without CAP_SETUID", id, p.uid)
			}
		}
	}
	if !p.setgid {
		for _, id := range append([]uint32{c.GID, c.EGID, c.SGID, c.FSGID}, c.Groups...) {
			if !slices.Contains(p.groups, id) {
				return fmt.Errorf("gid %d, the spec gives groups %v without CAP_SETGID", id, p.groups)
			}
		}
	}
	if p.seccomp && th.Seccomp != 2 {
		return fmt.Errorf("seccomp mode %d, the spec has a seccomp filter", th.Seccomp)
	}
	return nil
}

// checkNamespaces refuses processes in the dumping CRIU's (the host's) namespace of a kind the
// spec gives the container of its own: CRIU would restore them into the restorer's.
func (img *Image) checkNamespaces(spec *specs.Spec) error {
	root := img.Inventory.RootIDs
	if root == nil || spec.Linux == nil {
		return nil
	}
	for _, ns := range spec.Linux.Namespaces {
		if ns.Path != "" {
			continue
		}
		for _, th := range img.Threads {
			if th.IDs == nil {
				continue
			}
			img, host := nsID(*th.IDs, ns.Type), nsID(*root, ns.Type)
			if img != 0 && img == host {
				return fmt.Errorf("process %d is in the host's %s namespace, the spec gives the container one of its own", th.Tid, ns.Type)
			}
		}
	}
	return nil
}

func nsID(ids NsIDs, t specs.LinuxNamespaceType) uint32 {
	switch t {
	case specs.PIDNamespace:
		return ids.PID
	case specs.NetworkNamespace:
		return ids.Net
	case specs.IPCNamespace:
		return ids.IPC
	case specs.UTSNamespace:
		return ids.UTS
	case specs.MountNamespace:
		return ids.Mnt
	case specs.UserNamespace:
		return ids.User
	case specs.CgroupNamespace:
		return ids.Cgroup
	case specs.TimeNamespace:
		return ids.Time
	}
	return 0
}
