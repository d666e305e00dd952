// Command probe runs inside the benchmark's containers, next to the busybox counter. It holds
// -mem MB of touched memory (the memory workload; 0 for the others) and measures, from inside,
// how long the container stops during a checkpoint: it ticks every millisecond (-tick) and appends every
// gap between ticks longer than -min-gap to /tmp/gaps as "END_UNIX_NANO GAP_NANO". A CRIU dump
// freezes it and a restore resumes it, so the gap is the downtime the container's processes saw.
// It also writes "TOKEN TICKS" to /tmp/probe, so the benchmark can tell that a restored container
// still has this very process (same token), alive (ticks advance).
//
// It is built static (CGO_ENABLED=0) into the benchmark's busybox image.
package main

import (
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"time"
)

// held is the memory the process holds; a package variable, so it stays reachable for the
// garbage collector as long as the process runs.
var held []byte

func main() {
	mem := flag.Int("mem", 0, "`MB` of memory to allocate and touch")
	tick := flag.Duration("tick", time.Millisecond, "how often to tick")
	minGap := flag.Duration("min-gap", 10*time.Millisecond, "record gaps between ticks longer than this")
	flag.Parse()

	// Every page gets a distinct non-zero byte, so that no page is left out as zero by CRIU.
	held = make([]byte, *mem<<20)
	var sum uint64
	for i := 0; i < len(held); i += 4096 {
		held[i] = byte(i>>12) | 1
		sum += uint64(held[i])
	}
	token := make([]byte, 8)
	_, _ = rand.Read(token)
	tok := hex.EncodeToString(token)

	last := time.Now()
	var ticks uint64
	for {
		time.Sleep(*tick)
		now := time.Now()
		// time.Now carries the monotonic clock: a restore on the same host continues it, so
		// the difference is the real time the process did not run.
		if gap := now.Sub(last); gap > *minGap {
			record(fmt.Sprintf("%d %d\n", now.UnixNano(), gap.Nanoseconds()))
		}
		last = now
		ticks++
		if ticks%max(1, uint64(20*time.Millisecond / *tick)) == 0 {
			status(fmt.Sprintf("%s %d %d\n", tok, ticks, sum))
		}
	}
}

// record appends a line to /tmp/gaps, opening the file each time: a restore reopens files by
// path, and the benchmark reads the file from the host.
func record(line string) {
	f, err := os.OpenFile("/tmp/gaps", os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return
	}
	_, _ = f.WriteString(line)
	_ = f.Close()
}

func status(line string) {
	if err := os.WriteFile("/tmp/probe.new", []byte(line), 0o644); err == nil {
		_ = os.Rename("/tmp/probe.new", "/tmp/probe")
	}
}
