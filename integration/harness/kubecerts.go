package harness

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// kubePKI is the one-node cluster's certificate authority, in a directory of PEM files: every
// certificate of the cluster (the apiserver's and the kubelet's serving certificates, the client
// certificates of the admin, the kubelet and the apiserver calling the kubelet) is signed by it,
// and the service-account signing key sits beside it. It lives and dies with the test's cluster.
type kubePKI struct {
	dir    string
	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
}

func newKubePKI(dir string) (*kubePKI, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "cklite-test-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("self-signing the test CA: %w", err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	p := &kubePKI{dir: dir, caCert: ca, caKey: key}
	if err := writePEM(p.path("ca.crt"), "CERTIFICATE", der); err != nil {
		return nil, err
	}
	return p, p.writeServiceAccountKey()
}

func (p *kubePKI) path(name string) string { return filepath.Join(p.dir, name) }

// issue writes NAME.crt and NAME.key: a certificate for cn in orgs (Kubernetes reads the
// organisations as groups), valid for serving at ips when any are given, for client auth always.
func (p *kubePKI) issue(name, cn string, orgs []string, ips ...net.IP) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if len(ips) > 0 {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
		tmpl.IPAddresses = ips
		tmpl.DNSNames = []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, &key.PublicKey, p.caKey)
	if err != nil {
		return fmt.Errorf("signing the certificate %s: %w", name, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := writePEM(p.path(name+".crt"), "CERTIFICATE", der); err != nil {
		return err
	}
	return writePEM(p.path(name+".key"), "EC PRIVATE KEY", keyDER)
}

// writeServiceAccountKey writes sa.key and sa.pub, the key the apiserver signs service-account
// tokens with (and the controller-manager signs legacy ones with).
func (p *kubePKI) writeServiceAccountKey() error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return err
	}
	if err := writePEM(p.path("sa.key"), "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(key)); err != nil {
		return err
	}
	return writePEM(p.path("sa.pub"), "PUBLIC KEY", pub)
}

// kubeconfig writes a kubeconfig at NAME.kubeconfig for the client certificate NAME against the
// apiserver at server.
func (p *kubePKI) kubeconfig(name, server string) (string, error) {
	path := p.path(name + ".kubeconfig")
	conf := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: %s
  user:
    client-certificate: %s
    client-key: %s
contexts:
- name: test
  context: {cluster: test, user: %s}
current-context: test
`, server, p.path("ca.crt"), name, p.path(name+".crt"), p.path(name+".key"), name)
	return path, os.WriteFile(path, []byte(conf), 0o600)
}

func writePEM(path, kind string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600)
}
