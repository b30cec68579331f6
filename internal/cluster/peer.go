package cluster

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"sync"
	"time"

	"github.com/agentvm/agentvm/internal/store"
)

// Nodes talk to each other over TLS in which both sides show a certificate
// of the cluster's CA naming their node id (PeerName): a node forwards a
// request to the node that owns its VM only to the node it meant, and
// accepts forwarded requests only from a node. The CA is made by the first
// node that needs it and kept in the database's meta table: whoever can
// read the database can already run the cluster, so it adds no new secret
// to guard.

// caKey is the meta key of the cluster CA.
const caKey = "cluster_ca"

// peerDomain is the DNS suffix of the names in node certificates.
const peerDomain = ".node.agentvm"

// PeerName is the name in node id's certificate, and the TLS server name
// other nodes dial it with.
func PeerName(nodeID string) string { return nodeID + peerDomain }

// NodeOf returns the node id a verified peer certificate names.
func NodeOf(cs *tls.ConnectionState) (string, error) {
	if cs == nil || len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return "", errors.New("no verified node certificate")
	}
	leaf := cs.VerifiedChains[0][0]
	for _, n := range leaf.DNSNames {
		if len(n) > len(peerDomain) && n[len(n)-len(peerDomain):] == peerDomain {
			return n[:len(n)-len(peerDomain)], nil
		}
	}
	return "", errors.New("the certificate names no node")
}

// PeerTLS is a node's side of node-to-node TLS.
type PeerTLS struct {
	pool   *x509.CertPool
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	nodeID string

	mu      sync.Mutex
	cert    tls.Certificate
	expires time.Time
}

// certLife is how long a node certificate is valid; it is issued again
// when less than certRenew of it is left, so a long-running node never
// shows an expired one.
const (
	certLife  = 30 * 24 * time.Hour
	certRenew = 7 * 24 * time.Hour
)

// current is this node's certificate, issued again when it nears its end.
func (p *PeerTLS) current() (*tls.Certificate, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if time.Until(p.expires) < certRenew {
		cert, exp, err := issue(p.ca, p.caKey, p.nodeID)
		if err != nil {
			return nil, err
		}
		p.cert, p.expires = cert, exp
	}
	return &p.cert, nil
}

type caRecord struct {
	Cert string `json:"cert"` // PEM
	Key  string `json:"key"`  // PEM, PKCS#8
}

// NewPeerTLS loads the cluster's CA from the store (making it if no node
// has yet) and issues node id a certificate for this run.
func NewPeerTLS(ctx context.Context, st *store.Store, nodeID string) (*PeerTLS, error) {
	fresh, err := newCA()
	if err != nil {
		return nil, err
	}
	b, _ := json.Marshal(fresh)
	have, err := st.MetaOnce(ctx, caKey, string(b))
	if err != nil {
		return nil, fmt.Errorf("cluster CA: %w", err)
	}
	var rec caRecord
	if err := json.Unmarshal([]byte(have), &rec); err != nil {
		return nil, fmt.Errorf("cluster CA: %w", err)
	}
	caCert, caKey, err := parseCA(rec)
	if err != nil {
		return nil, fmt.Errorf("cluster CA: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	p := &PeerTLS{pool: pool, ca: caCert, caKey: caKey, nodeID: nodeID}
	if _, err := p.current(); err != nil {
		return nil, err
	}
	return p, nil
}

// Server is the TLS configuration of the node-to-node listener: a client
// must show a node certificate of this cluster.
func (p *PeerTLS) Server() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return p.current() },
		ClientCAs:      p.pool,
		ClientAuth:     tls.RequireAndVerifyClientCert,
	}
}

// Client is the TLS configuration to dial node id: the server must show
// that node's certificate.
func (p *PeerTLS) Client(nodeID string) *tls.Config {
	return &tls.Config{
		MinVersion:           tls.VersionTLS13,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return p.current() },
		RootCAs:              p.pool,
		ServerName:           PeerName(nodeID),
	}
}

func newCA() (caRecord, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return caRecord{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "agentvm cluster CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(20, 0, 0),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return caRecord{}, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return caRecord{}, err
	}
	return caRecord{
		Cert: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
		Key:  string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})),
	}, nil
}

func parseCA(rec caRecord) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	cb, _ := pem.Decode([]byte(rec.Cert))
	kb, _ := pem.Decode([]byte(rec.Key))
	if cb == nil || kb == nil {
		return nil, nil, errors.New("not PEM")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, err
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, nil, err
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, nil, errors.New("the CA key is not ECDSA")
	}
	return cert, key, nil
}

// issue makes node id's certificate, for both ends of a connection, and
// returns when it expires.
func issue(ca *x509.Certificate, caKey *ecdsa.PrivateKey, nodeID string) (tls.Certificate, time.Time, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, time.Time{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: PeerName(nodeID)},
		DNSNames:     []string{PeerName(nodeID)},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(certLife),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, time.Time{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, tmpl.NotAfter, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	return n
}
