package harness

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// A one-node Kubernetes on a harness daemon: etcd and kube-apiserver on loopback, the
// controller-manager for service accounts, their tokens, the cluster's CA bundle and garbage
// collection, and a kubelet on the daemon's CRI plugin, all from Stack.Bin (`make deps-kube`),
// with certificates made for the test. There is no scheduler: Kube.Bind places a pod on the node
// as kube-scheduler would, so the pods' YAML is what a user applies to a real cluster.
//
// The kubelet runs with the cgroupfs driver below /<daemon namespace> (the daemon's teardown
// removes that tree), its own root directory inside the daemon's, and what this machine needs:
// cgroup v1 allowed (kubelet >= 1.35 refuses it otherwise), swap allowed. It rewrites a few host
// sysctls when it starts (kernel.panic, vm.overcommit_memory, ...): Close puts them back.

// kubeBins are what `make deps-kube` adds to Stack.Bin.
var kubeBins = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kubelet", "kubectl"}

// KubeNode is the node's name.
const KubeNode = "cklite-node"

// kubeletSysctls are the host settings the kubelet changes at start-up (its
// setupKernelTunables); Close restores them.
var kubeletSysctls = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
}

// Kube is a running one-node cluster.
type Kube struct {
	// Dir holds the cluster's certificates, configuration, etcd's data, the kubelet's root
	// directory and the logs (etcd.log, kube-apiserver.log, ...): inside the daemon's directory.
	Dir string
	// Kubeconfig is the admin's kubeconfig (group system:masters).
	Kubeconfig string
	// NodeIP is the address the kubelet serves and registers (the host's, not loopback: the
	// apiserver refuses to proxy exec and logs to a loopback kubelet).
	NodeIP string
	// KubeletAddr is the kubelet's HTTPS API, host:port.
	KubeletAddr string
	// KubeletRoot is the kubelet's root directory (checkpoint archives go to its checkpoints/).
	KubeletRoot string

	d          *Daemon
	pki        *kubePKI
	etcd       *proc
	apiserver  *proc
	controller *proc
	kubelet    *proc
	kubeletCmd []string
	etcdAddr   string
	sysctls    map[string]string
}

// StartKube starts the cluster on the daemon, whose CRI plugin must be ready (Daemon.CRI) with a
// pod network (CRI.UseBridge): the node is Ready only then. Close it before the daemon.
func (d *Daemon) StartKube(ctx context.Context) (_ *Kube, retErr error) {
	for _, b := range kubeBins {
		if !executable(filepath.Join(d.stack.Bin, b)) {
			return nil, fmt.Errorf("%s missing from %s: run 'make deps-kube' (contrib/install.sh --kube) first", b, d.stack.Bin)
		}
	}
	k := &Kube{d: d, Dir: filepath.Join(d.Dir, "kube"), sysctls: map[string]string{}}
	k.KubeletRoot = filepath.Join(k.Dir, "kubelet")
	for _, p := range []string{k.KubeletRoot, filepath.Join(k.Dir, "pod-logs")} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			return nil, err
		}
	}
	ip, err := hostIP()
	if err != nil {
		return nil, err
	}
	k.NodeIP = ip.String()
	if k.pki, err = newKubePKI(filepath.Join(k.Dir, "pki")); err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			_ = k.Close()
		}
	}()
	if err := k.startEtcd(); err != nil {
		return nil, err
	}
	if err := k.startAPIServer(ctx); err != nil {
		return nil, err
	}
	if err := k.startControllerManager(ctx); err != nil {
		return nil, err
	}
	if err := k.startKubelet(ctx); err != nil {
		return nil, err
	}
	return k, nil
}

func (k *Kube) bin(name string) string { return filepath.Join(k.d.stack.Bin, name) }

func (k *Kube) startEtcd() error {
	client, err := freeLoopbackAddr()
	if err != nil {
		return err
	}
	peer, err := freeLoopbackAddr()
	if err != nil {
		return err
	}
	k.etcd, err = startProc("etcd", filepath.Join(k.Dir, "etcd.log"), k.d.env(), k.bin("etcd"),
		"--name", "default", "--data-dir", filepath.Join(k.Dir, "etcd"),
		"--listen-client-urls", "http://"+client, "--advertise-client-urls", "http://"+client,
		"--listen-peer-urls", "http://"+peer, "--initial-advertise-peer-urls", "http://"+peer,
		"--initial-cluster", "default=http://"+peer,
		// The cluster lives as long as a test: durability buys nothing, fsyncs cost seconds.
		"--unsafe-no-fsync")
	if err != nil {
		return err
	}
	k.etcdAddr = client
	return k.etcd.waitReady(60*time.Second, func() error {
		resp, err := http.Get("http://" + client + "/health")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("etcd /health: %s", resp.Status)
		}
		return nil
	})
}

func (k *Kube) startAPIServer(ctx context.Context) error {
	addr, err := freeLoopbackAddr()
	if err != nil {
		return err
	}
	_, port, _ := net.SplitHostPort(addr)
	p := k.pki
	if err := p.issue("apiserver", "kube-apiserver", nil, net.ParseIP("127.0.0.1"), net.ParseIP(k.NodeIP), net.ParseIP("10.96.0.1")); err != nil {
		return err
	}
	for _, c := range []struct{ name, cn string }{
		{"admin", "cklite-test-admin"},
		{"apiserver-kubelet-client", "kube-apiserver-kubelet-client"},
		{"controller-manager", "system:kube-controller-manager"},
		{"kubelet", "system:node:" + KubeNode},
	} {
		if err := p.issue(c.name, c.cn, []string{"system:masters"}); err != nil {
			return err
		}
	}
	server := "https://" + addr
	for _, name := range []string{"admin", "controller-manager", "kubelet"} {
		if _, err := p.kubeconfig(name, server); err != nil {
			return err
		}
	}
	k.Kubeconfig = p.path("admin.kubeconfig")
	k.apiserver, err = startProc("kube-apiserver", filepath.Join(k.Dir, "kube-apiserver.log"), k.d.env(), k.bin("kube-apiserver"),
		"--etcd-servers", "http://"+k.etcdAddr,
		"--bind-address", "127.0.0.1", "--secure-port", port, "--advertise-address", k.NodeIP,
		// One apiserver, no Service to keep pointing at it: the endpoint reconciler would only
		// log that a loopback address is not a valid endpoint.
		"--endpoint-reconciler-type", "none",
		"--tls-cert-file", p.path("apiserver.crt"), "--tls-private-key-file", p.path("apiserver.key"),
		"--client-ca-file", p.path("ca.crt"),
		"--kubelet-client-certificate", p.path("apiserver-kubelet-client.crt"),
		"--kubelet-client-key", p.path("apiserver-kubelet-client.key"),
		"--kubelet-certificate-authority", p.path("ca.crt"),
		"--kubelet-preferred-address-types", "InternalIP",
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", p.path("sa.pub"), "--service-account-signing-key-file", p.path("sa.key"),
		"--service-cluster-ip-range", "10.96.0.0/24",
		"--authorization-mode", "AlwaysAllow", "--allow-privileged=true",
		"--cert-dir", filepath.Join(k.Dir, "apiserver-certs"),
		"--enable-priority-and-fairness=false", "--profiling=false")
	if err != nil {
		return err
	}
	return k.apiserver.waitReady(120*time.Second, func() error {
		_, err := k.Kubectl(ctx, "get", "--raw", "/readyz")
		return err
	})
}

func (k *Kube) startControllerManager(ctx context.Context) error {
	var err error
	p := k.pki
	k.controller, err = startProc("kube-controller-manager", filepath.Join(k.Dir, "kube-controller-manager.log"), k.d.env(),
		k.bin("kube-controller-manager"),
		"--kubeconfig", p.path("controller-manager.kubeconfig"),
		"--controllers", "serviceaccount-controller,serviceaccount-token-controller,root-ca-certificate-publisher-controller,garbage-collector-controller,namespace-controller",
		"--service-account-private-key-file", p.path("sa.key"), "--root-ca-file", p.path("ca.crt"),
		"--use-service-account-credentials=false", "--leader-elect=false", "--secure-port=0")
	if err != nil {
		return err
	}
	// Pods are admitted only once their namespace's service account exists.
	return k.controller.waitReady(120*time.Second, func() error {
		_, err := k.Kubectl(ctx, "get", "serviceaccount", "default", "-n", "default")
		return err
	})
}

func (k *Kube) startKubelet(ctx context.Context) error {
	p := k.pki
	if err := p.issue("kubelet-serving", "system:node:"+KubeNode, []string{"system:nodes"}, net.ParseIP(k.NodeIP)); err != nil {
		return err
	}
	port, err := freePort(k.NodeIP)
	if err != nil {
		return err
	}
	k.KubeletAddr = net.JoinHostPort(k.NodeIP, port)
	// The kubelet checks that its cgroup root exists in every hierarchy; the daemon's teardown
	// removes /<namespace> and everything below it, the kubelet's pods included.
	for _, mnt := range cgroupMounts() {
		if err := os.MkdirAll(filepath.Join(mnt, k.d.Namespace), 0o755); err != nil {
			return fmt.Errorf("cgroup root for the kubelet: %w", err)
		}
	}
	conf := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %q
port: %s
readOnlyPort: 0
healthzPort: 0
tlsCertFile: %q
tlsPrivateKeyFile: %q
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: %q}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
cgroupRoot: %q
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: %q
podLogsDir: %q
serializeImagePulls: false
evictionHard: {memory.available: "50Mi", nodefs.available: "1%%", imagefs.available: "1%%"}
`, k.NodeIP, port, p.path("kubelet-serving.crt"), p.path("kubelet-serving.key"), p.path("ca.crt"),
		"/"+k.d.Namespace, "unix://"+k.d.Address, filepath.Join(k.Dir, "pod-logs"))
	confPath := filepath.Join(k.Dir, "kubelet.yaml")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		return err
	}
	for _, s := range kubeletSysctls {
		if v, err := os.ReadFile(filepath.Join("/proc/sys", s)); err == nil {
			k.sysctls[s] = strings.TrimSpace(string(v))
		}
	}
	k.kubeletCmd = []string{"--config", confPath, "--kubeconfig", p.path("kubelet.kubeconfig"),
		"--root-dir", k.KubeletRoot, "--hostname-override", KubeNode, "--node-ip", k.NodeIP}
	return k.runKubelet(ctx)
}

// runKubelet starts the kubelet and waits until its node is Ready and it knows the node's pods.
func (k *Kube) runKubelet(ctx context.Context) error {
	var err error
	k.kubelet, err = startProc("kubelet", filepath.Join(k.Dir, "kubelet.log"), k.d.env(), k.bin("kubelet"), k.kubeletCmd...)
	if err != nil {
		return err
	}
	return k.kubelet.waitReady(180*time.Second, func() error {
		out, err := k.Kubectl(ctx, "get", "node", KubeNode, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		if err == nil && out != "True" {
			err = fmt.Errorf("node %s is not Ready (%q)", KubeNode, out)
		}
		if err == nil {
			err = k.kubeletKnowsPods(ctx)
		}
		return err
	})
}

// RestartKubelet stops the kubelet and starts it again, as an operator's restart does; the pods
// keep running in containerd meanwhile.
func (k *Kube) RestartKubelet(ctx context.Context) error {
	if err := k.kubelet.stop(30 * time.Second); err != nil {
		return err
	}
	return k.runKubelet(ctx)
}

// Kubectl runs kubectl as the cluster's admin and returns its standard output; a failure quotes
// its standard error.
func (k *Kube) Kubectl(ctx context.Context, args ...string) (string, error) {
	return k.kubectlIn(ctx, nil, args...)
}

// Apply runs `kubectl apply -f -` with manifest on its standard input.
func (k *Kube) Apply(ctx context.Context, manifest string) error {
	_, err := k.kubectlIn(ctx, strings.NewReader(manifest), "apply", "-f", "-")
	return err
}

func (k *Kube) kubectlIn(ctx context.Context, stdin io.Reader, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, k.bin("kubectl"), args...)
	cmd.Env = append(k.d.env(), "KUBECONFIG="+k.Kubeconfig)
	cmd.Stdin = stdin
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// Bind places pod namespace/name on the node, which is what kube-scheduler does: a Binding
// through the API.
func (k *Kube) Bind(ctx context.Context, namespace, name string) error {
	binding, err := json.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "Binding",
		"metadata": map[string]string{"name": name, "namespace": namespace},
		"target":   map[string]string{"apiVersion": "v1", "kind": "Node", "name": KubeNode},
	})
	if err != nil {
		return err
	}
	_, err = k.kubectlIn(ctx, bytes.NewReader(binding), "create", "--raw",
		fmt.Sprintf("/api/v1/namespaces/%s/pods/%s/binding", namespace, name), "-f", "-")
	return err
}

// WaitPod waits up to timeout until pod namespace/name is in phase.
func (k *Kube) WaitPod(ctx context.Context, namespace, name, phase string, timeout time.Duration) error {
	return k.kubelet.waitReady(timeout, func() error {
		out, err := k.Kubectl(ctx, "get", "pod", "-n", namespace, name, "-o", "jsonpath={.status.phase}")
		if err == nil && out != phase {
			err = fmt.Errorf("pod %s/%s is %q, waiting for %s", namespace, name, out, phase)
		}
		return err
	})
}

// Checkpoint calls the kubelet's checkpoint API for a container of a pod, as the apiserver's
// client of the kubelet, and returns the path of the archive the kubelet wrote.
func (k *Kube) Checkpoint(ctx context.Context, namespace, pod, container string) (string, error) {
	body, err := k.kubeletCall(ctx, http.MethodPost, fmt.Sprintf("/checkpoint/%s/%s/%s?timeout=120", namespace, pod, container))
	if err != nil {
		return "", fmt.Errorf("kubelet checkpoint API: %w", err)
	}
	var items struct {
		Items []string `json:"items"`
	}
	if err := json.Unmarshal(body, &items); err != nil || len(items.Items) != 1 {
		return "", fmt.Errorf("kubelet checkpoint API: unexpected answer %q (%v)", body, err)
	}
	return items.Items[0], nil
}

// kubeletCall makes a request of the kubelet's HTTPS API as the apiserver does (its kubelet
// client certificate) and returns the body of a 200 answer.
func (k *Kube) kubeletCall(ctx context.Context, method, path string) ([]byte, error) {
	cert, err := tls.LoadX509KeyPair(k.pki.path("apiserver-kubelet-client.crt"), k.pki.path("apiserver-kubelet-client.key"))
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	roots.AddCert(k.pki.caCert)
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: roots}}}
	url := "https://" + k.KubeletAddr + path
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s %s: %s: %s", method, url, resp.Status, strings.TrimSpace(string(body)))
	}
	return body, nil
}

// kubeletKnowsPods fails unless the kubelet's own list of pods (its /pods) holds every pod the
// apiserver has bound to the node: a kubelet that just started reports its node Ready before it
// has read its pods from the apiserver, and until then it answers exec, logs and checkpoint
// requests for them with "pod does not exist".
func (k *Kube) kubeletKnowsPods(ctx context.Context) error {
	bound, err := k.Kubectl(ctx, "get", "pods", "-A", "--field-selector", "spec.nodeName="+KubeNode,
		"-o", `jsonpath={range .items[*]}{.metadata.namespace}/{.metadata.name} {end}`)
	if err != nil {
		return err
	}
	body, err := k.kubeletCall(ctx, http.MethodGet, "/pods")
	if err != nil {
		return err
	}
	var list struct {
		Items []struct {
			Metadata struct{ Namespace, Name string } `json:"metadata"`
		} `json:"items"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return fmt.Errorf("kubelet /pods: %w", err)
	}
	known := map[string]bool{}
	for _, p := range list.Items {
		known[p.Metadata.Namespace+"/"+p.Metadata.Name] = true
	}
	for _, p := range strings.Fields(bound) {
		if !known[p] {
			return fmt.Errorf("the kubelet does not know pod %s yet", p)
		}
	}
	return nil
}

// LogTail is the end of component's log (etcd, kube-apiserver, kube-controller-manager, kubelet).
func (k *Kube) LogTail(component string, n int) string {
	return (&proc{logPath: filepath.Join(k.Dir, component+".log")}).logTail(n)
}

// Close stops the kubelet, the controller-manager, the apiserver and etcd, and puts back the
// sysctls the kubelet changed. The pods stay in containerd for the daemon's Close to remove.
func (k *Kube) Close() error {
	var errs []error
	for _, p := range []*proc{k.kubelet, k.controller, k.apiserver, k.etcd} {
		if p != nil {
			errs = append(errs, p.stop(30*time.Second))
		}
	}
	for s, v := range k.sysctls {
		if err := os.WriteFile(filepath.Join("/proc/sys", s), []byte(v), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restoring sysctl %s: %w", s, err))
		}
	}
	return errors.Join(errs...)
}

// hostIP is the address of the host's default route.
func hostIP() (net.IP, error) {
	// A UDP "connection" only picks the route and source address; nothing is sent.
	c, err := net.Dial("udp4", "192.0.2.1:9")
	if err != nil {
		return nil, fmt.Errorf("finding the host's address (no default route?): %w", err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).IP, nil
}

// freePort is a TCP port free on ip.
func freePort(ip string) (string, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		return "", fmt.Errorf("finding a free port on %s: %w", ip, err)
	}
	defer l.Close()
	_, port, err := net.SplitHostPort(l.Addr().String())
	return port, err
}
