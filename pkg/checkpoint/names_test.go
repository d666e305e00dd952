package checkpoint

import (
	"reflect"
	"testing"

	"github.com/containerd/errdefs"
)

func TestValidateName(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"step-1", true},
		{"a.b_c", true},
		{"abc", true},
		{"0123456789ab", false}, // reads as an id
		{"", false},
		{"-x", false},
		{"a/b", false},
		{"a b", false},
	} {
		err := ValidateName(tc.name)
		if (err == nil) != tc.ok || (err != nil && !errdefs.IsInvalidArgument(err)) {
			t.Errorf("ValidateName(%q) = %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}

func TestRequestedNameAndLabels(t *testing.T) {
	labels := map[string]string{NameKey: "step-1", LabelsKey: EncodeLabels(map[string]string{"run": "7", "a": ""})}
	name, err := RequestedName(labels)
	if err != nil || name != "step-1" {
		t.Fatalf("RequestedName = %q, %v", name, err)
	}
	got, err := RequestedLabels(labels)
	if err != nil || !reflect.DeepEqual(got, map[string]string{"run": "7", "a": ""}) {
		t.Fatalf("RequestedLabels = %v, %v", got, err)
	}
	if _, err := RequestedLabels(map[string]string{LabelsKey: "run=7"}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("RequestedLabels of a non-JSON value: %v", err)
	}
	if _, err := RequestedName(map[string]string{NameKey: "a/b"}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("RequestedName of a bad name: %v", err)
	}
	if name, err := RequestedName(nil); name != "" || err != nil {
		t.Fatalf("RequestedName(nil) = %q, %v", name, err)
	}
}

func TestParseLabel(t *testing.T) {
	for _, tc := range []struct{ in, k, v string }{{"a=b", "a", "b"}, {"a=", "a", ""}, {"a=b=c", "a", "b=c"}} {
		if k, v, err := ParseLabel(tc.in); err != nil || k != tc.k || v != tc.v {
			t.Errorf("ParseLabel(%q) = %q %q %v", tc.in, k, v, err)
		}
	}
	for _, bad := range []string{"a", "=b", ""} {
		if _, _, err := ParseLabel(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("ParseLabel(%q) = %v, want invalid", bad, err)
		}
	}
}
