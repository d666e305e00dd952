package setup

import (
	"encoding/json"
	"net"
	"strings"
	"testing"
)

func TestFreeSubnet(t *testing.T) {
	first, err := freeSubnet("/srv/a", nil)
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := freeSubnet("/srv/a", nil); again != first {
		t.Fatalf("the same root chose %s, then %s", first, again)
	}
	if other, _ := freeSubnet("/srv/b", nil); other == first {
		t.Errorf("two roots chose the same subnet %s", first)
	}
	_, base, _ := net.ParseCIDR("10.224.0.0/11")
	_, chosen, _ := net.ParseCIDR(first)
	if !base.Contains(chosen.IP) {
		t.Fatalf("%s is outside 10.224.0.0/11", first)
	}
	// An interface in the chosen subnet moves the choice on.
	gateway := chosen.IP.To4()
	next, err := freeSubnet("/srv/a", []net.IP{net.IPv4(gateway[0], gateway[1], gateway[2], 1)})
	if err != nil || next == first {
		t.Fatalf("with %s in use, chose %s (%v)", first, next, err)
	}
}

func TestNetworkConfig(t *testing.T) {
	o := Options{Root: "/srv/ck", Subnet: "10.224.7.0/24"}
	b, err := networkConfig(o)
	if err != nil {
		t.Fatal(err)
	}
	var conf struct {
		Name    string            `json:"name"`
		Labels  map[string]string `json:"nerdctlLabels"`
		Plugins []struct {
			Type   string `json:"type"`
			Bridge string `json:"bridge"`
			IPAM   struct {
				Ranges  [][]map[string]string `json:"ranges"`
				DataDir string                `json:"dataDir"`
			} `json:"ipam"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal([]byte(b), &conf); err != nil {
		t.Fatal(err)
	}
	bridge := conf.Plugins[0]
	if conf.Name != "bridge" || conf.Labels[defaultNetworkLabel] != "true" || bridge.Type != "bridge" || bridge.Bridge != (Layout{o.Root}).Bridge() {
		t.Fatalf("not nerdctl's default network on the instance's bridge: %s", b)
	}
	if r := bridge.IPAM.Ranges[0][0]; r["subnet"] != o.Subnet || r["gateway"] != "10.224.7.1" || !strings.HasPrefix(bridge.IPAM.DataDir, o.Root+"/") {
		t.Fatalf("IPAM %+v: want subnet %s, gateway .1, allocations below the root", bridge.IPAM, o.Subnet)
	}
	if name := (Layout{o.Root}).Bridge(); len(name) > 15 {
		t.Fatalf("bridge name %s is longer than an interface name may be", name)
	}
}
