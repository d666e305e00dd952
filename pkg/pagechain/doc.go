// Package pagechain stores a checkpoint's memory as what changed since its parent checkpoint's,
// in CRIU's own format, so that CRIU restores it unchanged and every checkpoint costs the pages
// that changed rather than a full dump.
//
// CRIU's incremental dumps already define the format: an image directory may have a `parent`
// symbolic link to another image directory, and a pagemap run flagged in-parent (PE_PARENT) is
// read from the parent's images of the same process at the same addresses, recursively up the
// chain. cklite cannot have CRIU write such dumps (they need soft-dirty tracking, which this
// kernel lacks), so Dedup makes them afterwards: it compares each page of a full dump with the
// page the parent directory holds for the same process and address, rewrites the pagemap so that
// equal pages are in-parent, writes a pages file holding only the others, and makes the link.
// Pages are compared byte for byte, not by hash: both sides are in the page cache right after a
// dump, a comparison costs less than hashing both, and no collision can restore a wrong page.
//
// Zero pages: CRIU dumps neither pages never touched nor pages still mapped to the kernel's zero
// page (PAGEMAP_SCAN without PAGE_IS_PFNZERO); a page written with zeros is dumped like any other
// and is deduplicated like any other.
//
// Crash safety: a rewrite writes the new pages file under a new name (a new pages id), syncs it,
// then renames the new pagemap, which names it, over the old one, then removes the old pages
// file. At every point each pagemap names a complete pages file, and the parent link exists
// before any pagemap needs it, so a kill leaves the directory restorable: old images or new ones,
// per process. What a kill leaves over goes at the next rewrite (sweep).
//
// Concurrency: a directory is locked (flock on the directory itself) exclusively while it is
// rewritten and shared while it is read: a restore holds ReadLock for as long as CRIU reads the
// chain, Dedup holds the parent's chain shared while it compares. Locks are taken child first.
//
// The chain must keep each parent alive: Remove detaches a directory's children (Detach: the
// pages a child reads from the directory are copied into it, and its link moves to the
// directory's own parent) before removing it. An export writes each directory of the chain as a
// blob of its own, and an import links them again (pkg/ckimage).
// cklite deduplicates only between sibling directories (its own checkpoints directory of one
// namespace), which is where Remove looks for children, and admission (pkg/criuimage) accepts a
// parent link only below that directory, or below the cache that checkpoint images are extracted
// into, where the import made every link itself.
package pagechain
