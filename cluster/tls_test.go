package cluster_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
	etcdembed "go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// pki writes a CA and two certificates it signs (a server one for
// 127.0.0.1, a client one) into dir, as PEM files.
type pki struct{ ca, serverCert, serverKey, clientCert, clientKey string }

func newPKI(t *testing.T, dir string) pki {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "drover test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	leaf := func(serial int64, cn string, usage x509.ExtKeyUsage) (string, string) {
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{usage}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, _ := x509.MarshalECPrivateKey(k)
		return write(cn+".pem", "CERTIFICATE", der), write(cn+"-key.pem", "EC PRIVATE KEY", kder)
	}
	p := pki{ca: write("ca.pem", "CERTIFICATE", caDER)}
	p.serverCert, p.serverKey = leaf(2, "server", x509.ExtKeyUsageServerAuth)
	p.clientCert, p.clientKey = leaf(3, "client", x509.ExtKeyUsageClientAuth)
	return p
}

// tlsEtcd starts an etcd member that serves clients over TLS only and
// requires a client certificate signed by the CA.
func tlsEtcd(t *testing.T, p pki) string {
	t.Helper()
	cfg := etcdembed.NewConfig()
	cfg.Dir = t.TempDir()
	addr := etcdtest.FreeAddr()
	cu, _ := url.Parse("https://" + addr)
	pu, _ := url.Parse("http://" + etcdtest.FreeAddr())
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	cfg.ClientTLSInfo.CertFile, cfg.ClientTLSInfo.KeyFile = p.serverCert, p.serverKey
	cfg.ClientTLSInfo.TrustedCAFile, cfg.ClientTLSInfo.ClientCertAuth = p.ca, true
	cfg.UnsafeNoFsync = true
	// bcrypt's lowest cost (4, against etcd's default 10): each password
	// check is 64 times cheaper. Under the race detector on a loaded
	// machine, the default cost made one login outlast a 30 s dial.
	cfg.BcryptCost = 4
	cfg.ZapLoggerBuilder = etcdembed.NewZapLoggerBuilder(zap.NewNop())
	e, err := etcdembed.StartEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		t.Fatal("TLS etcd not ready in 30 s")
	}
	return addr
}

// TestConnectTLSAndAuth: against a member that serves TLS only and
// requires client certificates, Connect works with the CA, certificate and
// key, and fails without them; once etcd's auth is on, it works with the
// user's password and fails with a wrong one; a certificate without its
// key is refused before dialing, naming the flag.
func TestConnectTLSAndAuth(t *testing.T) {
	t.Parallel()
	p := newPKI(t, t.TempDir())
	addr := tlsEtcd(t, p)
	ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second)
	defer cancel()
	// Connections that must work get a dial timeout that only guards
	// against a hang (a TLS handshake on a busy machine takes its time);
	// those that must fail get a short one, which load cannot turn into a
	// success.
	good := cluster.ClientConfig{Endpoints: []string{"https://" + addr}, DialTimeout: 30 * time.Second, CACert: p.ca, Cert: p.clientCert, Key: p.clientKey}
	cli, err := cluster.Connect(ctx, good)
	if err != nil {
		t.Fatalf("TLS with CA, certificate and key: %v", err)
	}
	defer cli.Close()
	var ue *cluster.UnreachableError
	if _, err := cluster.Connect(ctx, cluster.ClientConfig{Endpoints: []string{addr}, DialTimeout: 2 * time.Second}); !errors.As(err, &ue) {
		t.Fatalf("plain connection to a TLS-only member: %v, want an UnreachableError", err)
	}
	noCert := good
	noCert.Cert, noCert.Key, noCert.DialTimeout = "", "", 2*time.Second
	if c, err := cluster.Connect(ctx, noCert); err == nil {
		c.Close()
		t.Fatal("a connection without a client certificate was accepted")
	}
	half := good
	half.Key = ""
	var ie *drover.InputError
	if _, err := cluster.Connect(ctx, half); !errors.As(err, &ie) || ie.Field != "--etcd-cert" {
		t.Fatalf("certificate without key: %v, want an InputError naming --etcd-cert", err)
	}

	// Turn etcd's auth on: a root user with a password.
	if _, err := cli.UserAdd(ctx, "root", "s3cret-pass"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.UserGrantRole(ctx, "root", "root"); err != nil {
		t.Fatal(err)
	}
	// A least-privilege user: read and write under /drover/ only.
	if _, err := cli.RoleAdd(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.RoleGrantPermission(ctx, "app", "/drover/", clientv3.GetPrefixRangeEnd("/drover/"), clientv3.PermissionType(clientv3.PermReadWrite)); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.UserAdd(ctx, "app", "app-pass"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.UserGrantRole(ctx, "app", "app"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.AuthEnable(ctx); err != nil {
		t.Fatal(err)
	}
	app := good
	app.Username, app.Password = "app", "app-pass"
	appCli, err := cluster.Connect(ctx, app)
	if err != nil {
		t.Fatalf("a user allowed /drover/ only: %v", err)
	}
	defer appCli.Close()
	if _, err := appCli.Put(ctx, "/drover/app", "y"); err != nil {
		t.Fatalf("put within its role: %v", err)
	}
	withUser := good
	withUser.Cert, withUser.Key = p.clientCert, p.clientKey
	withUser.Username, withUser.Password = "root", "s3cret-pass"
	authed, err := cluster.Connect(ctx, withUser)
	if err != nil {
		t.Fatalf("with user and password: %v", err)
	}
	defer authed.Close()
	if _, err := authed.Put(ctx, "/drover/x", "y"); err != nil {
		t.Fatalf("put as root: %v", err)
	}
	withUser.Password = "wrong"
	if c, err := cluster.Connect(ctx, withUser); err == nil {
		c.Close()
		t.Fatal("a wrong password was accepted")
	}
}
