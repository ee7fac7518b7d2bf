package extproc

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/klog/v2"
)

// writePair writes a new self-signed certificate and its key into dir, as
// a mounted TLS Secret holds them, and returns the certificate's serial.
func writePair(t *testing.T, dir string, mod time.Time) string {
	t.Helper()
	cert, err := selfSigned(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	key, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	for name, block := range map[string]*pem.Block{
		CertFile: {Type: "CERTIFICATE", Bytes: cert.Certificate[0]}, KeyFile: {Type: "PRIVATE KEY", Bytes: key},
	} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, mod, mod); err != nil {
			t.Fatal(err)
		}
	}
	parsed, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return parsed.SerialNumber.String()
}

func servedSerial(t *testing.T, get func(*tls.ClientHelloInfo) (*tls.Certificate, error)) string {
	t.Helper()
	c, err := get(&tls.ClientHelloInfo{})
	if err != nil {
		t.Fatal(err)
	}
	parsed, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return parsed.SerialNumber.String()
}

func TestACertificateDirectoryIsServedAndItsRenewalPickedUp(t *testing.T) {
	dir := t.TempDir()
	first := writePair(t, dir, time.Now().Add(-time.Hour))
	cfg, err := TLSConfig(dir, klog.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got := servedSerial(t, cfg.GetCertificate); got != first {
		t.Fatalf("served certificate %s, want %s", got, first)
	}
	r := &certReloader{certFile: filepath.Join(dir, CertFile), keyFile: filepath.Join(dir, KeyFile), log: klog.Background()}
	if err := r.load(); err != nil {
		t.Fatal(err)
	}
	renewed := writePair(t, dir, time.Now())
	if got := servedSerial(t, r.get); got != renewed {
		t.Errorf("after renewal served %s, want %s", got, renewed)
	}
	// A broken renewal keeps the pair that works.
	if err := os.WriteFile(filepath.Join(dir, KeyFile), []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(filepath.Join(dir, KeyFile), time.Now().Add(time.Minute), time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if got := servedSerial(t, r.get); got != renewed {
		t.Errorf("after a broken renewal served %s, want %s", got, renewed)
	}
	if _, err := TLSConfig(filepath.Join(dir, "missing"), klog.Background()); err == nil {
		t.Error("a directory without the pair was accepted")
	}
}
