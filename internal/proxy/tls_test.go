package proxy

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestAutoTLS(t *testing.T) {
	dir := t.TempDir()
	ips := []net.IP{net.IPv4(127, 0, 0, 1)}
	cfg, err := AutoTLS(dir, "sbx.test", ips)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(cfg.Certificates[0].Certificate[0])
	pool := x509.NewCertPool()
	caPEM, err := os.ReadFile(filepath.Join(dir, CAFile))
	if err != nil || !pool.AppendCertsFromPEM(caPEM) {
		t.Fatalf("CA file: %v", err)
	}
	for _, name := range []string{"49983-abc.sbx.test", "sbx.test", "127.0.0.1"} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: name}); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	// The CA may sign for nothing else (name constraints).
	ca, _ := x509.ParseCertificate(cfg.Certificates[0].Certificate[1])
	if !ca.PermittedDNSDomainsCritical || len(ca.PermittedDNSDomains) != 1 || ca.PermittedDNSDomains[0] != "sbx.test" {
		t.Fatalf("CA constraints: %v", ca.PermittedDNSDomains)
	}
	// It signs server certificates only (EKU), and its key is the owner's.
	if len(ca.ExtKeyUsage) != 1 || ca.ExtKeyUsage[0] != x509.ExtKeyUsageServerAuth {
		t.Fatalf("CA extended key usage: %v", ca.ExtKeyUsage)
	}
	// A client certificate the CA's key signed does not verify under it.
	caCert, caKey, err := readCA(filepath.Join(dir, "tls", "ca.pem"), filepath.Join(dir, "tls", "ca-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	ck, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: serial(), DNSNames: []string{"c.sbx.test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, caCert, &ck.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	client, _ := x509.ParseCertificate(der)
	if _, err := client.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Fatal("the CA vouches for a client certificate")
	}
	keyPath := filepath.Join(dir, "tls", "ca-key.pem")
	if err := os.Chmod(keyPath, 0o644); err != nil {
		t.Fatal(err)
	}
	// The same CA next time, its key's mode put back; a new one for
	// another domain.
	cfg2, _ := AutoTLS(dir, "sbx.test", ips)
	if st, err := os.Stat(keyPath); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("CA key mode after a start: %v %v", st.Mode(), err)
	}
	if string(cfg2.Certificates[0].Certificate[1]) != string(ca.Raw) {
		t.Fatal("the CA was not kept")
	}
	cfg3, _ := AutoTLS(dir, "other.test", ips)
	if string(cfg3.Certificates[0].Certificate[1]) == string(ca.Raw) {
		t.Fatal("a CA for sbx.test signed for other.test")
	}
}
