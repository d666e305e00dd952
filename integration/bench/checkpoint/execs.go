package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
)

// The exec workload (issue 17): what an agent platform does most, a short command run with exec
// (`nerdctl exec`, CRI ExecSync and `ctr tasks exec` all drive the shim's Exec, Start, Wait and
// Delete, as the Go client does here), on both systems in turns; and a leave-running checkpoint of
// the idle busybox agent with no exec'd process and with execExtras of them (detached `sleep`s, a
// language server or dev server in a real sandbox). runc's checkpoint cannot hold exec'd processes
// (they are the shim's children, outside the tree CRIU dumps), so only the systems in
// execCheckpointers take the second series; after each of its checkpoints every exec'd process
// must still run with the same pid.

const (
	execRuns   = 30 // short execs per system
	execExtras = 5  // exec'd processes running through the second checkpoint series
)

// execCheckpointers are the systems whose checkpoints keep exec'd processes.
var execCheckpointers = []string{"cklite"}

// execWhere is the exec workload's row group.
var execWhere = where{"exec", fmt.Sprintf("0 / %d exec'd processes", execExtras)}

// runExecs runs the exec workload with k checkpoints a series and returns what each system did:
// measured.exec holds the execs, checkpoint the series without exec'd processes, ckptExecs the
// one with them.
func (e *env) runExecs(k int) (_ map[string]*measured, retErr error) {
	boxes := map[string]sandbox{}
	defer func() { retErr = errors.Join(retErr, closeAll(boxes)) }()
	res, tokens := map[string]*measured{}, map[string]string{}
	for _, sys := range systems {
		var b sandbox
		_, err := e.op(execWhere, sys, "starting the container", func() (err error) {
			if b, err = e.systems[sys].start(sys+"-exec", agentSpec{kind: busyboxAgent}); err != nil {
				return err
			}
			tokens[sys], err = e.ready(b)
			return err
		})
		if b != nil {
			boxes[sys] = b
		}
		if err == nil {
			res[sys] = &measured{}
		}
	}
	for i := range execRuns {
		for sys := range turns(i) {
			if res[sys] == nil {
				continue
			}
			if took, err := e.op(execWhere, sys, fmt.Sprintf("exec %d", i), func() error { return boxes[sys].exec("true") }); err == nil {
				res[sys].exec = append(res[sys].exec, took)
			}
		}
	}
	for _, sys := range systems {
		if m := res[sys]; m != nil {
			e.progress("%-6s exec p50 %6.1f ms   p95 %6.1f ms   (%d execs)", sys, percentile(m.exec, 0.5), percentile(m.exec, 0.95), len(m.exec))
		}
	}
	for _, sys := range execCheckpointers {
		if res[sys] != nil {
			e.execCheckpoints(sys, boxes[sys], res[sys], tokens[sys], k)
		}
	}
	for sys, m := range res {
		m.shimPeak = boxes[sys].shimPeak()
	}
	return res, e.ctx.Err()
}

// execCheckpoints takes k checkpoints of b, then starts execExtras exec'd processes and takes k
// more, checking after each that the agent and every exec'd process run on, same processes.
func (e *env) execCheckpoints(sys string, b sandbox, m *measured, token string, k int) {
	var pids []uint32
	for i := range 2 * k {
		if i == k {
			_, err := e.op(execWhere, sys, "starting the exec'd processes", func() error {
				for range execExtras {
					pid, err := b.startExec("sleep", "1000000")
					if err != nil {
						return err
					}
					pids = append(pids, pid)
				}
				return nil
			})
			if err != nil {
				return
			}
		}
		step := fmt.Sprintf("checkpoint %d with %d exec'd processes", i, len(pids))
		took, err := e.op(execWhere, sys, step, func() error { return b.checkpoint(i) })
		if err != nil {
			continue
		}
		_, err = e.op(execWhere, sys, "after "+step, func() error {
			if _, err := waitProbe(b.rootfs(), token); err != nil {
				return err
			}
			return b.execsRunning(pids)
		})
		if err != nil {
			continue
		}
		if len(pids) == 0 {
			m.checkpoint = append(m.checkpoint, took)
		} else {
			m.ckptExecs = append(m.ckptExecs, took)
		}
		e.progress("%-6s checkpoint %d/%d with %d exec'd processes %8s", sys, i%k+1, k, len(pids), fmtMs(took))
	}
}

// execMetrics are the exec workload's rows.
var execMetrics = []metric{
	{"exec p50", "ms", p50(func(m *measured) []time.Duration { return m.exec })},
	{"exec p95", "ms", p95(func(m *measured) []time.Duration { return m.exec })},
	{"checkpoint, no exec p50", "ms", p50(ckpt)},
	{fmt.Sprintf("checkpoint, %d execs p50", execExtras), "ms", p50(func(m *measured) []time.Duration { return m.ckptExecs })},
}

// execIn runs args in container cid as an exec process with the init's spec and no stdio. With
// wait it waits for the process to exit 0 and deletes it; without, it returns the running
// process's pid.
func (e *daemon) execIn(cid string, wait bool, args ...string) (uint32, error) {
	c, err := e.d.Client().LoadContainer(e.ctx, cid)
	if err != nil {
		return 0, err
	}
	task, err := c.Task(e.ctx, nil)
	if err != nil {
		return 0, err
	}
	spec, err := task.Spec(e.ctx)
	if err != nil {
		return 0, err
	}
	pspec := *spec.Process
	pspec.Args, pspec.Terminal = args, false
	p, err := task.Exec(e.ctx, fmt.Sprintf("bench-%d", time.Now().UnixNano()), &pspec, cio.NullIO)
	if err != nil {
		return 0, err
	}
	if !wait {
		if err := p.Start(e.ctx); err != nil {
			_, derr := p.Delete(context.WithoutCancel(e.ctx))
			return 0, errors.Join(err, derr)
		}
		return p.Pid(), nil
	}
	return 0, waitExec(e.ctx, p, args)
}

// waitExec starts p, waits for it to exit 0 and deletes it.
func waitExec(ctx context.Context, p client.Process, args []string) error {
	exited, err := p.Wait(ctx)
	if err == nil {
		err = p.Start(ctx)
	}
	if err != nil {
		_, derr := p.Delete(context.WithoutCancel(ctx))
		return errors.Join(err, derr)
	}
	st := <-exited
	if _, err := p.Delete(ctx); err != nil {
		return err
	}
	if st.ExitCode() != 0 {
		return fmt.Errorf("exec %q exited %d", args, st.ExitCode())
	}
	return nil
}

// processesRunning checks that every pid is a live process (not a zombie) running sleep.
func processesRunning(pids []uint32) error {
	for _, pid := range pids {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return fmt.Errorf("exec'd process %d is gone: %w", pid, err)
		}
		// pid (comm) state ...: comm may hold spaces, the state follows the last ')'.
		s := string(stat)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if !strings.Contains(s, "(sleep)") || len(fields) == 0 || slices.Contains([]string{"Z", "X"}, fields[0]) {
			return fmt.Errorf("exec'd process %d is not a running sleep: %s", pid, s)
		}
	}
	return nil
}
