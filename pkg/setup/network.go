package setup

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
)

// A private instance gets a default network of its own. nerdctl's would be the host's: it is
// always the bridge nerdctl0 on 10.4.0.0/24, which nerdctl refuses to create in a second
// configuration directory once any nerdctl made it ("subnet 10.4.0.0/24 overlaps"), and which
// would join every instance's containers on one bridge. setup writes nerdctl's default network
// (the name "bridge", nerdctl's label) into the instance's CNI directory instead, with a bridge
// named after the root and a subnet no interface of the host uses.

// subnetBase is where the instances' subnets come from: 10.224.0.0/11, 2048 /24s (below it the
// harness's test networks take 10.213.x.0/24).
var subnetBase = net.IPv4(10, 224, 0, 0).To4()

const subnetCount = 2048

// Bridge is the name of the instance's bridge device: "ck-" and 8 hex digits of the root's hash.
func (l Layout) Bridge() string {
	sum := sha256.Sum256([]byte(l.Root))
	return "ck-" + hex.EncodeToString(sum[:4])
}

// FreeSubnet chooses the instance's subnet: the first /24 from the root's hash on in 10.224.0.0/11
// that no address of the host's interfaces falls in, but for the instance's own bridge (setup may
// run again once its network is up, and must choose the same).
func FreeSubnet(root string) (string, error) {
	addrs, err := hostAddrs(Layout{root}.Bridge())
	if err != nil {
		return "", err
	}
	return freeSubnet(root, addrs)
}

// freeSubnet is the first /24 from root's hash on that holds none of used.
func freeSubnet(root string, used []net.IP) (string, error) {
	sum := sha256.Sum256([]byte(root))
	first := binary.BigEndian.Uint32(sum[4:8]) % subnetCount
	for i := range uint32(subnetCount) {
		n := (first + i) % subnetCount
		ip := net.IPv4(subnetBase[0], subnetBase[1]+byte(n/256), byte(n%256), 0).To4()
		subnet := &net.IPNet{IP: ip, Mask: net.CIDRMask(24, 32)}
		if !containsAny(subnet, used) {
			return subnet.String(), nil
		}
	}
	return "", fmt.Errorf("no /24 in 10.224.0.0/11 is free of the host's addresses: --subnet")
}

// hostAddrs are the addresses of the host's interfaces but the one named except.
func hostAddrs(except string) ([]net.IP, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("the host's interfaces: %w", err)
	}
	var ips []net.IP
	for _, iface := range ifaces {
		if iface.Name == except {
			continue
		}
		addrs, err := iface.Addrs()
		if err != nil {
			return nil, fmt.Errorf("addresses of %s: %w", iface.Name, err)
		}
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok {
				ips = append(ips, ipn.IP)
			}
		}
	}
	return ips, nil
}

func containsAny(subnet *net.IPNet, ips []net.IP) bool {
	for _, ip := range ips {
		if subnet.Contains(ip) {
			return true
		}
	}
	return false
}

// defaultNetworkName and defaultNetworkLabel are how nerdctl recognises its default network
// (nerdctl's netutil.DefaultNetworkName and labels.NerdctlDefaultNetwork).
const (
	defaultNetworkName  = "bridge"
	defaultNetworkLabel = "nerdctl/default-network"
)

// networkConfig is nerdctl's default network for the instance: what nerdctl itself writes for it
// (nerdctl network inspect bridge shows it as its own), with the instance's bridge and subnet and
// the IP allocations kept below the root.
func networkConfig(o Options) (string, error) {
	_, subnet, err := net.ParseCIDR(o.Subnet)
	if err != nil || subnet.String() != o.Subnet {
		return "", fmt.Errorf("subnet %q: want a network such as 10.224.0.0/24", o.Subnet)
	}
	gateway := make(net.IP, len(subnet.IP))
	copy(gateway, subnet.IP)
	gateway[len(gateway)-1]++
	l := Layout{o.Root}
	id := sha256.Sum256([]byte(defaultNetworkName))
	type object = map[string]any
	conf := object{
		"cniVersion":    "1.0.0",
		"name":          defaultNetworkName,
		"nerdctlID":     hex.EncodeToString(id[:]),
		"nerdctlLabels": object{defaultNetworkLabel: "true"},
		"plugins": []object{
			{
				"type": "bridge", "bridge": l.Bridge(), "isGateway": true, "ipMasq": true, "hairpinMode": true,
				"ipam": object{
					"type":    "host-local",
					"ranges":  [][]object{{{"subnet": subnet.String(), "gateway": gateway.String()}}},
					"routes":  []object{{"dst": "0.0.0.0/0"}},
					"dataDir": l.path("lib", "cni", "networks"),
				},
			},
			{"type": "portmap", "capabilities": object{"portMappings": true}},
			// Containers of other bridges (other instances) do not reach this one's.
			{"type": "firewall", "ingressPolicy": "same-bridge"},
			{"type": "tuning"},
		},
	}
	b, err := json.MarshalIndent(conf, "", "  ")
	return string(b) + "\n", err
}

// RemoveBridge removes the instance's bridge device, which CNI makes for the first container and
// leaves behind: when no interface is attached to it any more, or whatever is when force is set.
func RemoveBridge(root string, force bool) error {
	name := Layout{root}.Bridge()
	link, err := netlink.LinkByName(name)
	var notFound netlink.LinkNotFoundError
	if errors.As(err, &notFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("bridge %s: %w", name, err)
	}
	if !force {
		links, err := netlink.LinkList()
		if err != nil {
			return fmt.Errorf("bridge %s: %w", name, err)
		}
		for _, l := range links {
			if l.Attrs().MasterIndex == link.Attrs().Index {
				return nil // a container's interface is on it still
			}
		}
	}
	if err := netlink.LinkDel(link); err != nil {
		return fmt.Errorf("remove bridge %s: %w", name, err)
	}
	return nil
}
