package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReadReport: each state of a Ginkgo JSON report, as this program counts it.
func TestReadReport(t *testing.T) {
	report := `[{"SpecReports": [
  {"LeafNodeType": "BeforeSuite", "State": "passed"},
  {"ContainerHierarchyTexts": ["[k8s.io] Container"], "LeafNodeType": "It", "LeafNodeText": "runs", "State": "passed", "NumAttempts": 1},
  {"ContainerHierarchyTexts": ["[k8s.io] Container"], "LeafNodeType": "It", "LeafNodeText": "breaks", "State": "failed", "NumAttempts": 1, "Failure": {"Message": "failed to pull image\nmore"}},
  {"ContainerHierarchyTexts": ["[k8s.io] Container"], "LeafNodeType": "It", "LeafNodeText": "hangs", "State": "timedout", "NumAttempts": 1},
  {"ContainerHierarchyTexts": ["[k8s.io] Security", "UserNamespaces"], "LeafNodeType": "It", "LeafNodeText": "pod", "State": "skipped", "NumAttempts": 1, "Failure": {"Message": "no runtime handler found"}},
  {"ContainerHierarchyTexts": ["[k8s.io] NRI"], "LeafNodeType": "It", "LeafNodeText": "filtered", "State": "skipped"}
]}]`
	path := filepath.Join(t.TempDir(), "report.json")
	if err := os.WriteFile(path, []byte(report), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := readReport(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, state, message string
	}{
		{"[k8s.io] Container runs", "passed", ""},
		{"[k8s.io] Container breaks", "failed", "failed to pull image\nmore"},
		{"[k8s.io] Container hangs", "failed", ""},
		{"[k8s.io] Security UserNamespaces pod", "skipped", "no runtime handler found"},
		{"[k8s.io] NRI filtered", "not run", ""},
	} {
		if got := res[tc.name]; got.state != tc.state || got.message != tc.message {
			t.Errorf("%s: %+v, want state %q message %q", tc.name, got, tc.state, tc.message)
		}
	}
	if len(res) != 5 {
		t.Errorf("%d cases, want the 5 It specs: %v", len(res), res)
	}
}

// TestPrintSummary: the counts of each handler, and only the cases whose state differs, with the
// first line of each message.
func TestPrintSummary(t *testing.T) {
	all := map[string]results{
		"cklite": {"a": {state: "passed"}, "b": {state: "skipped", message: "no handler\nsecond line"}, "c": {state: "failed", message: "x"}},
		"runc":   {"a": {state: "passed"}, "b": {state: "passed"}, "c": {state: "failed", message: "y"}},
	}
	var out bytes.Buffer
	printSummary(&out, []string{"cklite", "runc"}, all)
	for _, want := range []string{
		"cklite   1       1       1        0",
		"runc     2       1       0        0",
		"1 cases differ between cklite and runc\n- b\n    cklite: skipped: no handler\n    runc: passed\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, out.String())
		}
	}
}
