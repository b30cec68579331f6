package proxy

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// TLS for the preview proxy: a wildcard certificate for *.<domain>, given
// as files or issued at start by a local CA kept in the data dir (clients
// trust that CA: `agentvm ca` prints it).

// CAFile is the local CA's certificate under the data dir.
const CAFile = "tls/ca.pem"

// LoadTLS reads a certificate and key (PEM files).
func LoadTLS(certFile, keyFile string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("preview proxy TLS: %w", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// AutoTLS issues a certificate for *.domain, domain and the given IPs from
// the local CA in dataDir/tls (created on first use).
func AutoTLS(dataDir, domain string, ips []net.IP) (*tls.Config, error) {
	dir := filepath.Join(dataDir, "tls")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	ca, caKey, err := loadOrCreateCA(dir, domain, ips)
	if err != nil {
		return nil, fmt.Errorf("preview proxy TLS: local CA: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "*." + domain},
		DNSNames:     []string{"*." + domain, domain},
		IPAddresses:  ips,
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(397 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	cert := tls.Certificate{Certificate: [][]byte{der, ca.Raw}, PrivateKey: key}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	return n
}

// covers reports whether a CA's name constraints admit domain and ips.
func covers(ca *x509.Certificate, domain string, ips []net.IP) bool {
	if len(ca.PermittedDNSDomains) != 1 || ca.PermittedDNSDomains[0] != domain {
		return false
	}
	// Only server certificates: a CA from before this limit is made anew.
	if len(ca.ExtKeyUsage) != 1 || ca.ExtKeyUsage[0] != x509.ExtKeyUsageServerAuth {
		return false
	}
	for _, ip := range ips {
		ok := false
		for _, n := range ca.PermittedIPRanges {
			ok = ok || n.Contains(ip)
		}
		if !ok {
			return false
		}
	}
	return true
}

// loadOrCreateCA returns the local CA, made anew when there is none or when
// the one there does not cover domain and ips: the CA may only sign for the
// preview domain and those addresses (name constraints), so that trusting
// it trusts nothing else.
func loadOrCreateCA(dir, domain string, ips []net.IP) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	certPath, keyPath := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	// The key's mode is enforced on every start: a key another user could
	// read (copied, restored from a backup) would let them sign for the
	// preview domain.
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, nil, err
	}
	if err := os.Chmod(keyPath, 0o600); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, nil, err
	}
	if ca, key, err := readCA(certPath, keyPath); err == nil && covers(ca, domain, ips) {
		return ca, key, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	var ranges []*net.IPNet
	for _, ip := range ips {
		bits := 128
		if ip.To4() != nil {
			ip, bits = ip.To4(), 32
		}
		ranges = append(ranges, &net.IPNet{IP: ip, Mask: net.CIDRMask(bits, bits)})
	}
	host, _ := os.Hostname()
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:                serial(),
		Subject:                     pkix.Name{CommonName: "agentvm local CA for " + domain + " (" + host + ")", Organization: []string{"agentvm"}},
		NotBefore:                   now.Add(-time.Hour),
		NotAfter:                    now.Add(10 * 365 * 24 * time.Hour),
		IsCA:                        true,
		BasicConstraintsValid:       true,
		MaxPathLenZero:              true,
		KeyUsage:                    x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		ExtKeyUsage:                 []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		PermittedDNSDomainsCritical: true,
		PermittedDNSDomains:         []string{domain},
		PermittedIPRanges:           ranges,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return nil, nil, err
	}
	if err := os.Chmod(keyPath, 0o600); err != nil { // WriteFile keeps an old file's mode
		return nil, nil, err
	}
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return nil, nil, err
	}
	ca, err := x509.ParseCertificate(der)
	return ca, key, err
}

func readCA(certPath, keyPath string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	cb, err := os.ReadFile(certPath)
	if err != nil {
		return nil, nil, err
	}
	kb, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, nil, err
	}
	cblk, _ := pem.Decode(cb)
	kblk, _ := pem.Decode(kb)
	if cblk == nil || kblk == nil {
		return nil, nil, errors.New("bad PEM in " + certPath)
	}
	ca, err := x509.ParseCertificate(cblk.Bytes)
	if err != nil {
		return nil, nil, err
	}
	key, err := x509.ParseECPrivateKey(kblk.Bytes)
	if err != nil {
		return nil, nil, err
	}
	return ca, key, nil
}
