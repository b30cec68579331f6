package proxy

import (
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"testing"
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
	// The same CA next time; a new one for another domain.
	cfg2, _ := AutoTLS(dir, "sbx.test", ips)
	if string(cfg2.Certificates[0].Certificate[1]) != string(ca.Raw) {
		t.Fatal("the CA was not kept")
	}
	cfg3, _ := AutoTLS(dir, "other.test", ips)
	if string(cfg3.Certificates[0].Certificate[1]) == string(ca.Raw) {
		t.Fatal("a CA for sbx.test signed for other.test")
	}
}
