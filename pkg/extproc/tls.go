package extproc

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// Names of the certificate files in a certificate directory, as a
// Kubernetes TLS Secret mounts them.
const (
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
)

// certCheckInterval is how often a certificate directory is checked for a
// renewed certificate, at the handshakes that follow.
const certCheckInterval = 10 * time.Second

// TLSConfig returns the server's TLS configuration: the certificate and key
// of dir (CertFile, KeyFile), read again when they change so that a renewed
// certificate is served without a restart, or, when dir is empty, a
// certificate the server signs itself at start, as the Gateway API
// Inference Extension's endpoint picker does (gateways connect to pickers
// over TLS without verifying them). It fails when dir's files cannot be
// loaded or a certificate cannot be made. A renewed pair that cannot be
// loaded is logged to log, and the previous one served.
func TLSConfig(dir string, log klog.Logger) (*tls.Config, error) {
	if dir == "" {
		cert, err := selfSigned(time.Now())
		if err != nil {
			return nil, err
		}
		return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
	}
	r := &certReloader{certFile: filepath.Join(dir, CertFile), keyFile: filepath.Join(dir, KeyFile), log: log,
		interval: certCheckInterval}
	if err := r.load(); err != nil {
		return nil, err
	}
	return &tls.Config{GetCertificate: r.get, MinVersion: tls.VersionTLS12}, nil
}

// selfSigned returns a self-signed ECDSA P-256 certificate valid for ten
// years from now.
func selfSigned(now time.Time) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("extproc: generate a key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("extproc: generate a serial number: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{Organization: []string{"kvgate"}, CommonName: "kvgate endpoint picker"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.AddDate(10, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("extproc: sign a certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// certReloader serves a certificate from files, loading them again when
// their modification time changes.
type certReloader struct {
	certFile, keyFile string
	log               klog.Logger
	// interval is how often the files are checked, at the handshakes.
	interval time.Duration

	mu        sync.Mutex
	cert      *tls.Certificate
	certMod   time.Time
	keyMod    time.Time
	checkedAt time.Time
}

func (r *certReloader) load() error {
	ci, err := os.Stat(r.certFile)
	if err != nil {
		return fmt.Errorf("extproc: certificate: %w", err)
	}
	ki, err := os.Stat(r.keyFile)
	if err != nil {
		return fmt.Errorf("extproc: key: %w", err)
	}
	cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		return fmt.Errorf("extproc: load %s and %s: %w", r.certFile, r.keyFile, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cert, r.certMod, r.keyMod = &cert, ci.ModTime(), ki.ModTime()
	return nil
}

// get returns the certificate, loading it again at most every interval
// when its files changed; a renewed pair that does not
// load leaves the previous one served.
func (r *certReloader) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	now := time.Now()
	check := now.Sub(r.checkedAt) >= r.interval
	if check {
		r.checkedAt = now
	}
	cert := r.cert
	certMod, keyMod := r.certMod, r.keyMod
	r.mu.Unlock()
	if !check {
		return cert, nil
	}
	ci, cerr := os.Stat(r.certFile)
	ki, kerr := os.Stat(r.keyFile)
	if cerr == nil && kerr == nil && (!ci.ModTime().Equal(certMod) || !ki.ModTime().Equal(keyMod)) {
		if err := r.load(); err != nil {
			r.log.Error(err, "The renewed certificate cannot be loaded; serving the previous one", "dir", filepath.Dir(r.certFile))
		} else {
			r.mu.Lock()
			cert = r.cert
			r.mu.Unlock()
		}
	}
	return cert, nil
}
