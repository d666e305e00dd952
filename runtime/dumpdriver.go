package runtime

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	criurpc "github.com/checkpoint-restore/go-criu/v7/rpc"
	"github.com/containerd/log"
	securejoin "github.com/cyphar/filepath-securejoin"
	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/opencontainers/runc/libcontainer/utils"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

// The dump driver is cklite's own client of CRIU for a dump: it builds the request
// libcontainer's Checkpoint builds (runc's libcontainer/criu_linux.go) and sends it to a CRIU
// started ahead of time (criuready.go) instead of one started for the dump, so that a checkpoint
// spends on CRIU's side only CRIU's own work. The images are exactly libcontainer's (restore,
// rollback and fork go on through libcontainer's Restore): the same options, external bind
// mounts with their keys, cgroup mounts, masked paths, external namespaces, freezer cgroup,
// cgroup mode, CRIU configuration file (org.criu.config) and descriptors.json, which
// TestDumpRequestMatchesLibcontainer compares field by field. Three things differ, none seen in
// the images:
//   - CRIU is not asked for its notifications (NotifyScripts): at a dump libcontainer does nothing
//     at them but lock and unlock network strategies, which only loopback has here (a no-op; a
//     container with another strategy goes to libcontainer), and create the "checkpoint" file in
//     its state directory, which nothing reads but a restored container's destroy, which ignores
//     it. Each notification is a round trip with CRIU while the task is frozen.
//   - the host's cgroup v1 hierarchies, whose names become the keys of the cgroup bind mounts of a
//     container without a cgroup namespace, are read from mountinfo once per shim, not per dump
//     (cgroupMountNames).
//   - CRIU's exit is not waited for after a successful answer (swrk.dump).
//
// What the driver does not handle goes to libcontainer's Checkpoint (declineDump): pre-dumps,
// lazy pages, page servers, parent images, a CRIU whose version the shim has not learnt yet (the
// first dump of a shim, through libcontainer, learns it: learnCRIUVersion) or older than 3.15,
// network strategies other than loopback.

// minDriverCRIU is the CRIU version (3.15) from which every option the driver sets is known, as
// libcontainer checks it for external network (3.11) and PID (3.15) namespaces and the cgroup v2
// freezer (3.14).
const minDriverCRIU = 31500

// dump runs the dump o through the driver, or through libcontainer when the driver declines it
// (the first dump of a shim goes to libcontainer, which learns CRIU's version). The CRIU of the
// container's next dump is started once this one is answered (PrepareNextDump).
func (c *Container) dump(o *libcontainer.CriuOpts) error {
	var err error
	if why := c.declineDump(o); why != "" {
		log.L.WithField("why", why).Debug("dump through libcontainer's Checkpoint")
		err = c.lc.Checkpoint(o)
	} else {
		err = c.driveDump(o)
	}
	learnCRIUVersion(c.lc)
	return err
}

// declineDump says why the driver leaves the dump o to libcontainer, or "".
func (c *Container) declineDump(o *libcontainer.CriuOpts) string {
	if o.PreDump || o.LazyPages || o.PageServer.Address != "" || o.ParentImage != "" || o.StatusFd != -1 {
		return "pre-dump, lazy pages or page server"
	}
	return c.declineContainer()
}

// declineContainer says why the driver leaves every dump of the container to libcontainer, or "".
func (c *Container) declineContainer() string {
	if knownCRIUVersion.Load() < minDriverCRIU {
		return "CRIU version not known yet, or older than 3.15"
	}
	for _, n := range c.lc.Config().Networks {
		if n.Type != "loopback" {
			return "network strategy " + n.Type
		}
	}
	return ""
}

// driveDump dumps through the container's CRIU started ahead, or one started now.
func (c *Container) driveDump(o *libcontainer.CriuOpts) error {
	dirs, err := openDumpDirs(o)
	if err != nil {
		return err
	}
	defer dirs.close()
	req, err := c.dumpRequest(o, dirs)
	if err != nil {
		return err
	}
	s, err := c.ready.take()
	if err != nil {
		return err
	}
	return s.dump(req)
}

// dumpDirs are the image and work directories of a dump, open for CRIU to find through the
// shim's descriptors.
type dumpDirs struct {
	images, work *os.File
}

// openDumpDirs makes and opens o's directories as libcontainer does.
func openDumpDirs(o *libcontainer.CriuOpts) (*dumpDirs, error) {
	if o.ImagesDirectory == "" {
		return nil, errors.New("invalid directory to save checkpoint")
	}
	d := &dumpDirs{}
	var err error
	if d.images, err = openDumpDir(o.ImagesDirectory); err != nil {
		return nil, err
	}
	if o.WorkDirectory != "" {
		if d.work, err = openDumpDir(o.WorkDirectory); err != nil {
			d.close()
			return nil, err
		}
	}
	return d, nil
}

// openDumpDir opens dir, making it first: a container is checkpointed into it again and again.
func openDumpDir(dir string) (*os.File, error) {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, err
	}
	return os.Open(dir)
}

func (d *dumpDirs) close() {
	d.images.Close()
	if d.work != nil {
		d.work.Close()
	}
}

// dumpRequest is libcontainer's Checkpoint's request for the dump o (but for NotifyScripts),
// and, as there, descriptors.json written into the image directory.
func (c *Container) dumpRequest(o *libcontainer.CriuOpts, dirs *dumpDirs) (*criurpc.CriuReq, error) {
	cfg := c.lc.Config()
	st, err := c.lc.State()
	if err != nil {
		return nil, err
	}
	mode, err := criuCgroupMode(o.ManageCgroupsMode)
	if err != nil {
		return nil, err
	}
	opts := &criurpc.CriuOpts{
		ImagesDirFd:       proto.Int32(int32(dirs.images.Fd())),
		LogLevel:          proto.Int32(4),
		LogFile:           proto.String("dump.log"),
		Root:              proto.String(cfg.Rootfs),
		ManageCgroups:     proto.Bool(true),
		ManageCgroupsMode: &mode,
		NotifyScripts:     proto.Bool(false),
		Pid:               proto.Int32(int32(st.InitProcessPid)),
		ShellJob:          proto.Bool(o.ShellJob),
		LeaveRunning:      proto.Bool(o.LeaveRunning),
		TcpEstablished:    proto.Bool(o.TcpEstablished),
		TcpSkipInFlight:   proto.Bool(o.TcpSkipInFlight),
		LinkRemap:         proto.Bool(o.LinkRemap),
		ExtUnixSk:         proto.Bool(o.ExternalUnixConnections),
		FileLocks:         proto.Bool(o.FileLocks),
		EmptyNs:           proto.Uint32(o.EmptyNs),
		OrphanPtsMaster:   proto.Bool(true),
		AutoDedup:         proto.Bool(o.AutoDedup),
		LazyPages:         proto.Bool(o.LazyPages),
	}
	if dirs.work != nil {
		opts.WorkDirFd = proto.Int32(int32(dirs.work.Fd()))
	}
	if file, ok := utils.SearchLabels(cfg.Labels, criuConfigLabel); !ok {
		opts.ConfigFile = proto.String(defaultCRIUConfig)
	} else if file != "" {
		opts.ConfigFile = proto.String(file)
	}
	if opts.External, err = externalNamespaces(cfg); err != nil {
		return nil, err
	}
	if fcg := freezerPath(st.CgroupPaths); fcg != "" {
		opts.FreezeCgroup = proto.String(fcg)
	}
	if opts.ExtMnt, err = externalMounts(cfg, st.InitProcessPid); err != nil {
		return nil, err
	}
	fds, err := json.Marshal(st.ExternalDescriptors)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(o.ImagesDirectory, "descriptors.json"), fds, 0o600); err != nil {
		return nil, err
	}
	t := criurpc.CriuReqType_DUMP
	return &criurpc.CriuReq{Type: &t, Opts: opts}, nil
}

// criuCgroupMode is libcontainer's criuCgMode.
func criuCgroupMode(mode string) (criurpc.CriuCgMode, error) {
	switch mode {
	case "":
		return criurpc.CriuCgMode_DEFAULT, nil
	case "soft":
		return criurpc.CriuCgMode_SOFT, nil
	case "full":
		return criurpc.CriuCgMode_FULL, nil
	case "strict":
		return criurpc.CriuCgMode_STRICT, nil
	case "ignore":
		return criurpc.CriuCgMode_IGNORE, nil
	}
	return 0, errors.New("invalid manage-cgroups-mode value")
}

// externalNamespaces names the network and PID namespaces cfg joins by path as external,
// under the keys libcontainer's restore gives them back with (extRootNetNS, extRootPidNS).
func externalNamespaces(cfg configs.Config) ([]string, error) {
	var ext []string
	for _, t := range []configs.NamespaceType{configs.NEWNET, configs.NEWPID} {
		path := cfg.Namespaces.PathOf(t)
		if path == "" {
			continue
		}
		var ns unix.Stat_t
		if err := unix.Stat(path, &ns); err != nil {
			return nil, &os.PathError{Op: "stat", Path: path, Err: err}
		}
		name := configs.NsName(t)
		ext = append(ext, fmt.Sprintf("%s[%d]:extRoot%s%sNS", name, ns.Ino, strings.ToUpper(name[:1]), name[1:]))
	}
	return ext, nil
}

// freezerPath is the container's freezer cgroup among its cgroup paths (the unified one on
// cgroup v2), what libcontainer's cgroup manager's Path("freezer") is.
func freezerPath(paths map[string]string) string {
	if cgroups.IsCgroup2UnifiedMode() {
		return paths[""]
	}
	return paths["freezer"]
}

// externalMounts are the mounts CRIU must take as external, in libcontainer's order: bind mounts,
// the cgroup v1 hierarchies of a container without a cgroup namespace, masked files that exist in
// init's root (pid), device nodes.
func externalMounts(cfg configs.Config, pid int) ([]*criurpc.ExtMountMap, error) {
	var ext []*criurpc.ExtMountMap
	add := func(dest string) {
		dest = mountKey(cfg.Rootfs, dest)
		ext = append(ext, &criurpc.ExtMountMap{Key: proto.String(dest), Val: proto.String(dest)})
	}
	cgroupns := cfg.Namespaces.Contains(configs.NEWCGROUP)
	for _, m := range cfg.Mounts {
		switch {
		case m.Device == "bind":
			add(m.Destination)
		case m.Device == "cgroup" && !cgroups.IsCgroup2UnifiedMode() && !cgroupns:
			names, err := cgroupMountNames()
			if err != nil {
				return nil, err
			}
			for _, n := range names {
				add(filepath.Join(m.Destination, n))
			}
		}
	}
	for _, path := range cfg.MaskPaths {
		fi, err := os.Stat(fmt.Sprintf("/proc/%d/root/%s", pid, path))
		switch {
		case errors.Is(err, os.ErrNotExist):
			continue
		case err != nil:
			return nil, err
		case fi.IsDir():
			continue
		}
		ext = append(ext, &criurpc.ExtMountMap{Key: proto.String(path), Val: proto.String("/dev/null")})
	}
	for _, d := range cfg.Devices {
		add(d.Path)
	}
	return ext, nil
}

// mountKey is libcontainer's key of the mount at dest: its path inside rootfs, symlinks
// resolved there.
func mountKey(rootfs, dest string) string {
	dest = strings.TrimPrefix(dest, rootfs)
	if joined, err := securejoin.SecureJoin(rootfs, dest); err == nil {
		dest = joined[len(rootfs):]
	}
	return dest
}

// cgroupMountNames are the names under which libcontainer binds the host's cgroup v1
// hierarchies into a container's cgroup mount (its getCgroupMounts: the base names of their
// mount points, in mountinfo's order). Read once per shim: the host's hierarchies do not change
// under it, and mountinfo, where every container's mounts are listed, is long.
var cgroupMountNames = sync.OnceValues(func() ([]string, error) {
	mounts, err := cgroups.GetCgroupMounts(false)
	if err != nil {
		return nil, err
	}
	own, err := cgroups.ParseCgroupFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(mounts))
	for _, m := range mounts {
		// libcontainer fails the dump on a hierarchy the shim is not in.
		if _, err := m.GetOwnCgroup(own); err != nil {
			return nil, err
		}
		names = append(names, filepath.Base(m.Mountpoint))
	}
	return names, nil
})

// dump sends the dump request req to CRIU and reads its answer, as libcontainer's criuSwrk does
// (answering any notification with success). A successful answer comes once CRIU is done with
// the tasks and the images (cr-service.c answers after cr_dump_tasks): its exit, a few
// milliseconds of unmapping and closing, is not waited for. After a failure it is, as
// libcontainer does: CRIU has thawed what it froze and its log is complete.
func (s *swrk) dump(req *criurpc.CriuReq) error {
	err := s.request(req)
	s.conn.Close()
	if err == nil {
		return nil
	}
	if exit := s.exitError(); exit != nil {
		err = fmt.Errorf("%w (%w)", err, exit)
	}
	return err
}

// request sends req and reads responses until its own.
func (s *swrk) request(req *criurpc.CriuReq) error {
	data, err := proto.Marshal(req)
	if err != nil {
		return err
	}
	if _, err := s.conn.Write(data); err != nil {
		return fmt.Errorf("send CRIU its request: %w", err)
	}
	buf := make([]byte, 10*4096)
	for {
		n, _, _, _, err := s.conn.ReadMsgUnix(buf, nil)
		switch {
		case err != nil:
			return fmt.Errorf("read CRIU's answer: %w", err)
		case n == 0:
			return errors.New("unexpected EOF")
		case n == len(buf):
			return errors.New("buffer is too small")
		}
		resp := new(criurpc.CriuResp)
		if err := proto.Unmarshal(buf[:n], resp); err != nil {
			return err
		}
		t := resp.GetType()
		if !resp.GetSuccess() {
			return fmt.Errorf("criu failed: type %s errno %d", t, resp.GetCrErrno())
		}
		switch t {
		case criurpc.CriuReqType_NOTIFY:
			ack, err := proto.Marshal(&criurpc.CriuReq{Type: &t, NotifySuccess: proto.Bool(true)})
			if err != nil {
				return err
			}
			if _, err := s.conn.Write(ack); err != nil {
				return fmt.Errorf("answer CRIU's notification: %w", err)
			}
		case req.GetType():
			return nil
		default:
			return fmt.Errorf("unable to parse the response %s", resp.String())
		}
	}
}
