package checkpoint

import (
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

// rec is a record created at minute minute of the test's clock, on parent.
func rec(id, parent string, minute int) Record {
	return Record{Meta: Meta{ID: id, Parent: parent, Created: time.Date(2026, 11, 21, 4, minute, 0, 0, time.UTC)}}
}

// render draws the tree one line a checkpoint, orphans marked with "?".
func render(t *Tree) string {
	var b strings.Builder
	for _, l := range t.Lines() {
		b.WriteString(l.Indent + l.ID)
		if l.Orphan {
			b.WriteString(" ?")
		}
		b.WriteString("\n")
	}
	return b.String()
}

func TestTree(t *testing.T) {
	for _, tc := range []struct {
		name    string
		records []Record
		want    string
	}{
		{"none", nil, ""},
		{"one", []Record{rec("a", "", 0)}, "a\n"},
		{
			"chain and siblings",
			[]Record{rec("a", "", 0), rec("b", "a", 1), rec("c", "b", 2), rec("d", "a", 3), rec("e", "d", 4)},
			"a\n├─ b\n│  └─ c\n└─ d\n   └─ e\n",
		},
		{
			"children ordered by creation, not by input",
			[]Record{rec("a", "", 0), rec("late", "a", 9), rec("early", "a", 1), rec("mid", "a", 5)},
			"a\n├─ early\n├─ mid\n└─ late\n",
		},
		{
			"same creation time: by id",
			[]Record{rec("a", "", 0), rec("y", "a", 1), rec("x", "a", 1)},
			"a\n├─ x\n└─ y\n",
		},
		{
			"multiple roots ordered by creation",
			[]Record{rec("r2", "", 5), rec("r1", "", 1), rec("c2", "r2", 6), rec("r3", "", 7)},
			"r1\nr2\n└─ c2\nr3\n",
		},
		{
			"parent removed: a marked root, its subtree under it",
			[]Record{rec("a", "", 0), rec("b", "gone", 1), rec("c", "b", 2)},
			"a\nb ?\n└─ c\n",
		},
		{
			"all parents removed",
			[]Record{rec("b", "gone1", 2), rec("a", "gone2", 1)},
			"a ?\nb ?\n",
		},
		{
			"own parent: a root, not an orphan",
			[]Record{rec("a", "a", 0)},
			"a\n",
		},
		{
			"parents that loop are cut where the loop closes",
			[]Record{rec("r", "", 0), rec("a", "b", 1), rec("b", "a", 2), rec("c", "a", 3)},
			"r\na\n├─ b\n└─ c\n",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tree := NewTree(tc.records)
			if got := render(tree); got != tc.want {
				t.Fatalf("tree:\n%s\nwant:\n%s", got, tc.want)
			}
			if n := len(tree.Lines()); n != len(tc.records) {
				t.Fatalf("%d lines for %d records", n, len(tc.records))
			}
		})
	}
}

// lookupCase is a ref and what Tree.Lookup and Find answer for it among lookupRecords.
type lookupCase struct {
	id    string
	want  string
	isErr func(error) bool
	says  string
}

// lookupRecords are the checkpoints lookupCases name: ids that prefix others, names shared by
// two containers, a name that prefixes an id, labels.
func lookupRecords() []Record {
	named := func(id, name, container string, labels map[string]string) Record {
		r := rec(id, "", 4)
		r.Name, r.Container, r.Labels = name, container, labels
		return r
	}
	return []Record{rec("0123456789ab", "", 0), rec("0123ffffffff", "", 1), rec("abc", "", 2), rec("abcdef", "", 3),
		named("111111111111", "step1", "web", map[string]string{"run": "7", "phase": "a"}),
		named("222222222222", "step1", "db", map[string]string{"run": "7", "phase": "b"}),
		named("333333333333", "only", "web", nil),
		named("444444444444", "0123ff", "web", nil), // a name wins over the id it prefixes
	}
}

var lookupCases = []lookupCase{
	{id: "0123456789ab", want: "0123456789ab"},
	{id: "01234", want: "0123456789ab"},
	{id: "0123f", want: "0123ffffffff"},
	{id: "abc", want: "abc"}, // a whole id wins over the longer ids it prefixes
	{id: "abcd", want: "abcdef"},
	{id: "0123", isErr: errdefs.IsInvalidArgument, says: "matches 0123456789ab, 0123ffffffff"},
	{id: "fff", isErr: errdefs.IsNotFound, says: `no checkpoint "fff"`},
	{id: "", isErr: errdefs.IsInvalidArgument, says: "empty"},
	{id: "only", want: "333333333333"},
	{id: "0123ff", want: "444444444444"},
	{id: "step1", isErr: errdefs.IsInvalidArgument, says: `checkpoint name "step1" is ambiguous: it matches 111111111111 (name step1, container web), 222222222222 (name step1, container db)`},
	{id: "phase=b", want: "222222222222"},
	{id: "run=7", isErr: errdefs.IsInvalidArgument, says: `checkpoint label "run=7" is ambiguous`},
	{id: "run=8", isErr: errdefs.IsNotFound, says: `no checkpoint "run=8"`},
}

// check fails t unless id and err are what tc wants.
func (tc lookupCase) check(t *testing.T, id string, err error) {
	t.Helper()
	if tc.isErr != nil {
		if err == nil || !tc.isErr(err) || !strings.Contains(err.Error(), tc.says) {
			t.Fatalf("lookup of %q = %s, %v; want an error saying %q", tc.id, id, err, tc.says)
		}
		return
	}
	if err != nil || id != tc.want {
		t.Fatalf("lookup of %q = %s, %v; want %s", tc.id, id, err, tc.want)
	}
}

func TestLookup(t *testing.T) {
	tree := NewTree(lookupRecords())
	for _, tc := range lookupCases {
		t.Run(tc.id, func(t *testing.T) {
			n, err := tree.Lookup(tc.id)
			id := ""
			if n != nil {
				id = n.ID
			}
			tc.check(t, id, err)
		})
	}
}
