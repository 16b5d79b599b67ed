// Package testcert writes a throw-away CA, a server certificate for
// 127.0.0.1/localhost and a client certificate, for tests of TLS and
// mutual TLS.
package testcert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Files are the PEM files Write made.
type Files struct {
	CA, ServerCert, ServerKey, ClientCert, ClientKey string
	// OtherCA signed OtherClientCert/Key: a client the server must refuse.
	OtherClientCert, OtherClientKey string
}

// Write makes the certificates in dir; it panics on error (tests only).
func Write(dir string) Files {
	ca, caKey := newCA("glmflash test CA")
	other, otherKey := newCA("another CA")
	f := Files{CA: filepath.Join(dir, "ca.pem")}
	writePEM(f.CA, "CERTIFICATE", ca.Raw)
	f.ServerCert, f.ServerKey = leaf(dir, "server", ca, caKey, true)
	f.ClientCert, f.ClientKey = leaf(dir, "client", ca, caKey, false)
	f.OtherClientCert, f.OtherClientKey = leaf(dir, "other-client", other, otherKey, false)
	return f
}

func newCA(name string) (*x509.Certificate, *ecdsa.PrivateKey) {
	key := must(ecdsa.GenerateKey(elliptic.P256(), rand.Reader))
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der := must(x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key))
	return must(x509.ParseCertificate(der)), key
}

func leaf(dir, name string, ca *x509.Certificate, caKey *ecdsa.PrivateKey, server bool) (string, string) {
	key := must(ecdsa.GenerateKey(elliptic.P256(), rand.Reader))
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), KeyUsage: x509.KeyUsageDigitalSignature}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		tmpl.DNSNames = []string{"localhost"}
	} else {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	der := must(x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey))
	cert, keyFile := filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
	writePEM(cert, "CERTIFICATE", der)
	writePEM(keyFile, "EC PRIVATE KEY", must(x509.MarshalECPrivateKey(key)))
	return cert, keyFile
}

func writePEM(path, typ string, der []byte) {
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		panic(err)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
