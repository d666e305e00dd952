package checkpoint

import (
	"cmp"
	"maps"
	"slices"
	"strings"
)

// Node is one checkpoint in a Tree.
type Node struct {
	Record
	// Orphan is set on a root whose Parent is not in the tree: the parent checkpoint was removed
	// or expired. Its frozen layer still exists (this checkpoint's layer keeps it), but no
	// checkpoint names it any more.
	Orphan   bool
	Children []*Node
	// Current are the containers whose state is this checkpoint (SetCurrent): the checkpoint
	// they last took, or were restored, forked or rolled back to.
	Current []string
}

// Tree is the checkpoints of a namespace arranged by Parent, each level oldest first.
type Tree struct {
	Roots []*Node
	byID  map[string]*Node
}

// NewTree arranges records by Parent. A record whose parent is not among records becomes a root
// marked Orphan. Parents that loop (only hand-edited lease labels can make them) are cut where
// the loop closes, so that every record appears in the tree exactly once.
func NewTree(records []Record) *Tree {
	t := &Tree{byID: make(map[string]*Node, len(records))}
	nodes := make([]*Node, len(records))
	for i, r := range records {
		nodes[i] = &Node{Record: r}
		t.byID[r.ID] = nodes[i]
	}
	// Oldest first at every level, whatever order records came in; the id breaks ties so the
	// output is stable.
	slices.SortStableFunc(nodes, func(a, b *Node) int {
		return cmp.Or(a.Created.Compare(b.Created), strings.Compare(a.ID, b.ID))
	})
	for _, n := range nodes {
		if p, ok := t.byID[n.Parent]; ok && p != n {
			p.Children = append(p.Children, n)
		} else {
			n.Orphan = n.Parent != "" && !ok
			t.Roots = append(t.Roots, n)
		}
	}
	reached := make(map[*Node]bool, len(nodes))
	var mark func(*Node)
	mark = func(n *Node) {
		reached[n] = true
		for _, c := range n.Children {
			mark(c)
		}
	}
	for _, r := range t.Roots {
		mark(r)
	}
	// What the roots do not reach has ancestors that loop: walk up from it until the walk closes
	// the loop, and cut the loop there.
	for _, n := range nodes {
		if reached[n] {
			continue
		}
		seen := map[*Node]bool{}
		for !seen[n] {
			seen[n] = true
			n = t.byID[n.Parent]
		}
		p := t.byID[n.Parent]
		p.Children = slices.DeleteFunc(p.Children, func(c *Node) bool { return c == n })
		t.Roots = append(t.Roots, n)
		mark(n)
	}
	return t
}

// Line is one row of the tree as `cklite checkpoint ls` prints it.
type Line struct {
	*Node
	Indent string // the tree drawn before the id: "" for a root, then "├─ ", "│  └─ ", ...
}

// Lines walks the tree depth first, parents before their children.
func (t *Tree) Lines() []Line {
	var out []Line
	var walk func(n *Node, indent, childIndent string)
	walk = func(n *Node, indent, childIndent string) {
		out = append(out, Line{Node: n, Indent: indent})
		for i, c := range n.Children {
			if i == len(n.Children)-1 {
				walk(c, childIndent+"└─ ", childIndent+"   ")
			} else {
				walk(c, childIndent+"├─ ", childIndent+"│  ")
			}
		}
	}
	for _, r := range t.Roots {
		walk(r, "", "")
	}
	return out
}

// SetCurrent marks each container's current node: the first checkpoint of its lineage (the
// container label LineageKey, keyed here by container id), which the shim sets to the checkpoint
// the container last took or was restored, forked or rolled back to. A container whose current
// checkpoint is not in the tree (removed, or filtered out) marks nothing.
func (t *Tree) SetCurrent(lineages map[string]Lineage) {
	for _, id := range slices.Sorted(maps.Keys(lineages)) {
		if l := lineages[id]; len(l) > 0 {
			if n, ok := t.byID[l[0]]; ok {
				n.Current = append(n.Current, id)
			}
		}
	}
}

// Subtree is n and its descendants, children before their parents: the order in which a
// removal that stops half way still leaves a tree whose every node has its ancestors.
func (n *Node) Subtree() []*Node {
	var out []*Node
	for _, c := range n.Children {
		out = append(out, c.Subtree()...)
	}
	return append(out, n)
}
