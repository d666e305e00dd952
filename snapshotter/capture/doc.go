// Package capture is the client side of cklite's leave-running checkpoint of a filesystem: it
// commits what the live upper directory of an active snapshot holds into a new immutable layer
// while the snapshot stays as it is, mounted and written to. The container's snapshot key is
// never removed or renamed, so a crash at any step leaves it intact; the only thing a crash can
// leave is the temporary snapshot "cklite/capturing/<name>", held by the caller's lease.
//
// A capture is a delta against the previous capture of the same upper directory, so that a chain
// of checkpoints stays one layer per checkpoint holding what changed since the previous one
// (disk does not grow with repeated copies of unchanged files). The previous capture is known by
// its Record: every path of the upper with its inode, birth and change times, size and mode, kept
// by the caller in memory (the shim, per container) and dropped whenever the upper changes. Plan
// walks the live upper and compares it with the record:
//
//   - an entry whose inode, birth time, change time, modification time, size or mode differ, or
//     which the record does not have, is written into the delta, with its parent directories;
//   - a path of the record that is gone becomes a whiteout (a 0/0 character device), unless a
//     directory above it is gone too or is written whole;
//   - a directory recreated since (another inode or birth time), or which the upper now marks
//     opaque, is written whole and opaque (trusted.overlay.opaque): the previous capture's
//     contents below it are hidden, as in the live view;
//   - the upper's own whiteouts and opaque directories are copied as they are.
//
// Change times are the kernel's coarse clock: a file changed just before one capture and again
// just after the thaw can keep the same times. An entry changed within racyWindow before the
// capture began is recorded as racy and written again by the next capture (as git does with its
// index), so no change is lost to the clock's resolution.
//
// Without a usable record (the first capture, the previous capture's layer gone, another upper)
// the whole upper is written onto the snapshot's parent, which is the same walk with an empty
// record. Regular files are copied with copy_file_range (io.Copy between files), keeping owners,
// modes, times and extended attributes; symbolic links, devices, fifos and sockets are recreated;
// hard links within one capture stay links.
//
// The walk is O(entries of the upper) and the copy O(bytes changed): the caller decides from a
// Plan's Stats whether writing the delta is worth it, or whether to switch the upper instead
// (freeze.Rootfs, which needs the upper unmounted).
package capture
