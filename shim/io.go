package shim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/fifo"
	"github.com/containerd/log"
	"github.com/opencontainers/runc/libcontainer"
)

// stdio is what containerd asked for a process: FIFO paths or, for stdout, a log URI.
type stdio struct {
	Stdin, Stdout, Stderr string
	Terminal              bool
}

func (s stdio) isNull() bool {
	return s.Stdin == "" && s.Stdout == "" && s.Stderr == ""
}

// ioTarget is where a process's output goes, parsed from the stdout URI the way
// containerd-shim-runc-v2 does: a bare path or fifo:// is a FIFO, file:// a file that takes
// both streams, binary:// (and binary-v2://) a logging program fed through pipes.
type ioTarget struct {
	scheme string
	uri    *url.URL
}

func parseIOTarget(stdout string) (ioTarget, error) {
	u, err := url.Parse(stdout)
	if err != nil {
		return ioTarget{}, fmt.Errorf("unable to parse stdout uri %q: %w: %w", stdout, err, errdefs.ErrInvalidArgument)
	}
	if u.Scheme == "" {
		u.Scheme = "fifo"
	}
	switch u.Scheme {
	case "fifo", "file", "binary", "binary-v2":
	default:
		return ioTarget{}, fmt.Errorf("unknown STDIO scheme %s: %w", u.Scheme, errdefs.ErrInvalidArgument)
	}
	if u.Scheme == "file" && u.Path == "" {
		return ioTarget{}, fmt.Errorf("file:// stdout uri without a path: %w", errdefs.ErrInvalidArgument)
	}
	return ioTarget{scheme: u.Scheme, uri: u}, nil
}

// processIO connects one container process to its stdio. The child ends are handed to
// libcontainer (nil means /dev/null); the shim copies between its ends and containerd's FIFOs,
// a log file or a logging binary.
type processIO struct {
	stdio stdio

	childIn, childOut, childErr *os.File

	stdinKeep io.Closer // the stdin FIFO held open for writing until CloseIO
	logger    *logger
	closers   []io.Closer
	wg        sync.WaitGroup // output copies; Delete drains them before closing
}

// newProcessIO prepares stdio for a process. With a terminal only stdin/stdout sinks are
// prepared; the console is wired by attachConsole once the process has started.
func newProcessIO(ctx context.Context, id string, s stdio, uid, gid int, r *reaper) (_ *processIO, retErr error) {
	p := &processIO{stdio: s}
	defer func() {
		if retErr != nil {
			p.Close()
		}
	}()
	if s.isNull() {
		return p, nil
	}
	target := ioTarget{scheme: "fifo"}
	if s.Stdout != "" {
		t, err := parseIOTarget(s.Stdout)
		if err != nil {
			return nil, err
		}
		target = t
	}
	if target.scheme == "binary" || target.scheme == "binary-v2" {
		l, err := startLogger(ctx, id, target, r)
		if err != nil {
			return nil, err
		}
		p.logger = l
		if !s.Terminal {
			// The logging binary reads the very pipes the process writes: no copy.
			p.childOut, p.childErr = l.outW, l.errW
		}
	}
	if !s.Terminal && p.logger == nil {
		outs, err := openSinks(ctx, target, s)
		if err != nil {
			return nil, err
		}
		// From here each sink belongs to its copy goroutine, which closes it at EOF.
		if p.childOut, err = p.pipeTo(ctx, outs[0], uid, gid); err != nil {
			closeAll(outs[:]...)
			return nil, err
		}
		if p.childErr, err = p.pipeTo(ctx, outs[1], uid, gid); err != nil {
			closeAll(outs[1])
			return nil, err
		}
	}
	if s.Stdin != "" && !s.Terminal {
		if err := p.pipeStdin(ctx, uid, gid); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// openSinks opens the stdout and stderr destinations (nil where the stream is not wanted).
func openSinks(ctx context.Context, t ioTarget, s stdio) ([2]io.WriteCloser, error) {
	var outs [2]io.WriteCloser
	if t.scheme == "file" {
		if err := os.MkdirAll(filepath.Dir(t.uri.Path), 0o755); err != nil {
			return outs, fmt.Errorf("create log directory: %w", err)
		}
		f, err := os.OpenFile(t.uri.Path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return outs, fmt.Errorf("open log file: %w", err)
		}
		// Both streams share the file; it closes when both copies are done.
		shared := newSharedWriter(f, 2)
		return [2]io.WriteCloser{shared, shared}, nil
	}
	for i, path := range []string{s.Stdout, s.Stderr} {
		if path == "" {
			continue
		}
		w, err := openFifoWriter(ctx, path)
		if err != nil {
			closeAll(outs[:]...)
			return outs, err
		}
		outs[i] = w
	}
	return outs, nil
}

// openFifoWriter opens a FIFO for writing. The read side is opened too, so that a client
// that has not opened (or has closed) its end never blocks nor breaks the container's output.
func openFifoWriter(ctx context.Context, path string) (io.WriteCloser, error) {
	w, err := fifo.OpenFifo(ctx, path, syscall.O_WRONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("open fifo %s for writing: %w", path, err)
	}
	r, err := fifo.OpenFifo(ctx, path, syscall.O_RDONLY, 0)
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("open fifo %s for reading: %w", path, err)
	}
	return &pairCloser{WriteCloser: w, other: r}, nil
}

// pipeTo creates a pipe whose write end goes to the process and copies its read end to dst.
func (p *processIO) pipeTo(ctx context.Context, dst io.WriteCloser, uid, gid int) (*os.File, error) {
	if dst == nil {
		return nil, nil
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("create stdio pipe: %w", err)
	}
	if err := w.Chown(uid, gid); err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("chown stdio pipe: %w", err)
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		copyAndClose(ctx, dst, r)
	}()
	return w, nil
}

// nullPipes gives each stream the process has no destination for a pipe that behaves like
// /dev/null: stdin reads EOF, output is discarded. A restore needs them: CRIU hands a restored
// process the shim's own file for every stdio pipe the process was dumped with, and without one
// that is the shim's /dev/null, which lies outside the container's mounts and fails the next dump.
func (p *processIO) nullPipes(ctx context.Context, uid, gid int) error {
	if p.stdio.Terminal {
		return nil
	}
	var err error
	if p.childIn == nil {
		r, w, perr := os.Pipe()
		if perr != nil {
			return fmt.Errorf("create stdin pipe: %w", perr)
		}
		w.Close()
		p.childIn = r
	}
	if p.childOut == nil {
		if p.childOut, err = p.pipeTo(ctx, discard{}, uid, gid); err != nil {
			return err
		}
	}
	if p.childErr == nil {
		if p.childErr, err = p.pipeTo(ctx, discard{}, uid, gid); err != nil {
			return err
		}
	}
	return nil
}

// wire gives lp the process's ends of its stdio; a stream it has none for (a terminal's) is left
// to libcontainer. A nil *os.File in an io.Reader/io.Writer would not read as "no stream" to
// exec.Cmd.
func (p *processIO) wire(lp *libcontainer.Process) {
	if p.childIn != nil {
		lp.Stdin = p.childIn
	}
	if p.childOut != nil {
		lp.Stdout = p.childOut
	}
	if p.childErr != nil {
		lp.Stderr = p.childErr
	}
}

// discard is the sink of an output nobody reads.
type discard struct{}

func (discard) Write(b []byte) (int, error) { return len(b), nil }
func (discard) Close() error                { return nil }

// pipeStdin feeds the stdin FIFO into a pipe read by the process.
func (p *processIO) pipeStdin(ctx context.Context, uid, gid int) error {
	in, err := p.openStdin()
	if err != nil {
		return err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("create stdin pipe: %w", err)
	}
	if err := r.Chown(uid, gid); err != nil {
		closeAll(r, w)
		return fmt.Errorf("chown stdin pipe: %w", err)
	}
	p.childIn = r
	go copyAndClose(ctx, w, in)
	return nil
}

// openStdin opens the stdin FIFO for reading, after keepStdin: the FIFO then always has a
// writer, so a read never sees a premature EOF before the client has opened its end.
func (p *processIO) openStdin() (io.ReadCloser, error) {
	if err := p.keepStdin(); err != nil {
		return nil, err
	}
	in, err := fifo.OpenFifo(context.Background(), p.stdio.Stdin, syscall.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("open stdin fifo %s: %w", p.stdio.Stdin, err)
	}
	p.closers = append(p.closers, in) // unblocks the copy on Delete
	return in, nil
}

// keepStdin holds the stdin FIFO open for writing, so that the process sees EOF only after
// CloseIO and not whenever the client reopens its end.
func (p *processIO) keepStdin() error {
	w, err := fifo.OpenFifo(context.Background(), p.stdio.Stdin, syscall.O_WRONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return fmt.Errorf("open stdin fifo %s: %w", p.stdio.Stdin, err)
	}
	p.stdinKeep = w
	return nil
}

// closeStdin implements CloseIO.
func (p *processIO) closeStdin() error {
	if p.stdinKeep == nil {
		return nil
	}
	err := p.stdinKeep.Close()
	p.stdinKeep = nil
	return err
}

// started drops the shim's copies of the child ends: the copies then see EOF when the process
// (and whatever inherited its stdio) is gone.
func (p *processIO) started() {
	closeAll(p.childIn, p.childOut, p.childErr)
	p.childIn, p.childOut, p.childErr = nil, nil, nil
}

// drain waits, at most d, for the output copies to finish.
func (p *processIO) drain(d time.Duration) error {
	done := make(chan struct{})
	go func() {
		p.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-time.After(d):
		return fmt.Errorf("stdio still open after %s: %w", d, context.DeadlineExceeded)
	}
}

// Close releases everything: child ends, stdin, sinks and the logging binary.
func (p *processIO) Close() error {
	p.started()
	errs := []error{p.closeStdin()}
	errs = append(errs, closeAll(p.closers...))
	if p.logger != nil {
		errs = append(errs, p.logger.Close())
	}
	return errors.Join(errs...)
}

func copyAndClose(ctx context.Context, dst io.WriteCloser, src io.ReadCloser) {
	buf := make([]byte, 4096) // PIPE_BUF: small, the shim's RSS matters
	if _, err := io.CopyBuffer(dst, src, buf); err != nil && !errors.Is(err, os.ErrClosed) && !errors.Is(err, syscall.EIO) {
		log.G(ctx).WithError(err).Debug("stdio copy ended")
	}
	dst.Close()
	src.Close()
}

func closeAll[C io.Closer](cs ...C) error {
	var errs []error
	for _, c := range cs {
		if v := any(c); v == nil || isNilFile(v) {
			continue
		}
		if err := c.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func isNilFile(v any) bool {
	f, ok := v.(*os.File)
	return ok && f == nil
}

// pairCloser closes a second handle (the FIFO's read side) with the writer.
type pairCloser struct {
	io.WriteCloser
	other io.Closer
}

func (p *pairCloser) Close() error {
	return errors.Join(p.WriteCloser.Close(), p.other.Close())
}

// sharedWriter closes the underlying writer on the last of n Close calls.
type sharedWriter struct {
	io.WriteCloser
	refs atomic.Int64
}

func newSharedWriter(w io.WriteCloser, n int64) *sharedWriter {
	s := &sharedWriter{WriteCloser: w}
	s.refs.Store(n)
	return s
}

func (s *sharedWriter) Close() error {
	if s.refs.Add(-1) > 0 {
		return nil
	}
	return s.WriteCloser.Close()
}
