// Package shimproc finds the shim process serving a container and reads its memory use, for the
// shim tests (nothing may outlive a container) and the shim benchmark (how much memory a shim takes).
package shimproc

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Find returns the pids of shims serving container id for the containerd at address. containerd
// starts every shim, whatever its runtime, with "-id ID" and "-address ADDRESS" arguments.
func Find(address, id string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		args := strings.Split(string(data), "\x00")
		if hasFlag(args, "-id", id) && hasFlag(args, "-address", address) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func hasFlag(args []string, flag, value string) bool {
	i := slices.Index(args, flag)
	return i >= 0 && i+1 < len(args) && args[i+1] == value
}

// Memory is a process's resident memory, in bytes.
type Memory struct {
	RSS  uint64 // VmRSS: now
	Peak uint64 // VmHWM: the high-water mark over the process's life
	// Anon is RssAnon: the part of RSS that is the process's own. The rest is mostly pages of the
	// shim binary and its libraries, which every shim of the same runtime shares.
	Anon uint64
}

// ReadMemory reads pid's resident memory from /proc/PID/status.
func ReadMemory(pid int) (Memory, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return Memory{}, err
	}
	var m Memory
	var found int
	for _, line := range strings.Split(string(data), "\n") {
		key, value, _ := strings.Cut(line, ":")
		var dst *uint64
		switch key {
		case "VmRSS":
			dst = &m.RSS
		case "VmHWM":
			dst = &m.Peak
		case "RssAnon":
			dst = &m.Anon
		default:
			continue
		}
		kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 10, 64)
		if err != nil {
			return Memory{}, fmt.Errorf("/proc/%d/status: %s: %w", pid, line, err)
		}
		*dst = kb * 1024
		found++
	}
	if found != 3 {
		return Memory{}, fmt.Errorf("/proc/%d/status has no VmRSS, VmHWM and RssAnon (a zombie?)", pid)
	}
	return m, nil
}

// Binary is the shim binary containerd runs for runtime: io.containerd.NAME.vN runs
// containerd-shim-NAME-vN.
func Binary(runtime string) string {
	parts := strings.Split(runtime, ".")
	if len(parts) != 4 {
		return ""
	}
	return "containerd-shim-" + parts[2] + "-" + parts[3]
}
