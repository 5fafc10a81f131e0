// kube-apiserver-test: a real Kubernetes API server for the bridge's tests,
// with its etcd embedded in the same process (Debian's etcd is too old for
// kube-apiserver 1.31+; go.etcd.io/etcd/server/v3 is already in Kubernetes'
// module graph at the version it is tested with).
//
//	kube-apiserver-test -port PORT -data-dir DIR [-token-file FILE] [-- kube-apiserver flags...]
//
// Everything listens on 127.0.0.1 only: etcd on a port of its own choosing,
// the API server (HTTPS, a self-signed serving certificate written to
// DIR/certs/apiserver.crt at start) on PORT. Authentication by static bearer
// tokens (FILE, kube-apiserver's CSV format "token,user,uid,\"group1,group2\"";
// without -token-file, DIR/tokens.csv is written with token "test-token" for
// user "admin" in group system:masters), authorization Node,RBAC, so that a
// token without role bindings gets 403. Service-account signing keys are
// generated into DIR at start. Ready when GET /readyz answers 200. Flags after
// "--" go to kube-apiserver after ours (a later flag wins). There is no
// controller manager: EndpointSlices, service accounts and garbage collection
// are up to the tests. Killing the process (any signal) stops both servers.
package main

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // as cmd/kube-apiserver: client-go metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // as cmd/kube-apiserver: version metric
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	port := flag.Int("port", 0, "HTTPS port of the API server on 127.0.0.1 (required)")
	dataDir := flag.String("data-dir", "", "directory for etcd's data, certificates and keys (required; created)")
	tokenFile := flag.String("token-file", "", "static token file (CSV); default: DIR/tokens.csv with test-token for an admin in system:masters")
	flag.Parse()
	if *port <= 0 || *port > 65535 || *dataDir == "" {
		fmt.Fprintln(os.Stderr, "usage: kube-apiserver-test -port PORT -data-dir DIR [-token-file FILE] [-- kube-apiserver flags...]")
		os.Exit(2)
	}
	dir, err := filepath.Abs(*dataDir)
	if err != nil {
		fail("data dir: %v", err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "certs"), 0o700); err != nil {
		fail("data dir: %v", err)
	}

	tokens := *tokenFile
	if tokens == "" {
		tokens = filepath.Join(dir, "tokens.csv")
		if err := os.WriteFile(tokens, []byte("test-token,admin,admin,\"system:masters\"\n"), 0o600); err != nil {
			fail("token file: %v", err)
		}
	}

	saKey, saPub := filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")
	if err := writeServiceAccountKeys(saKey, saPub); err != nil {
		fail("service-account keys: %v", err)
	}

	etcdURL, err := startEtcd(filepath.Join(dir, "etcd"))
	if err != nil {
		fail("etcd: %v", err)
	}

	args := []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(*port),
		"--cert-dir=" + filepath.Join(dir, "certs"),
		"--token-auth-file=" + tokens,
		"--authorization-mode=Node,RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + saPub,
		"--service-account-signing-key-file=" + saKey,
		// Room for the 1,000-service tests (a /24 holds 254 ClusterIPs).
		"--service-cluster-ip-range=10.96.0.0/16",
		// No controller manager creates the "default" service accounts that
		// this admission plugin would wait for before admitting a Pod.
		"--disable-admission-plugins=ServiceAccount",
		// The "kubernetes" Service's endpoints would be the advertise address,
		// and loopback is not a valid endpoint: the reconciler would log an
		// error every 10 s. The Service stays, without endpoints.
		"--endpoint-reconciler-type=none",
		// Two cores shared with the tests: no request queueing, no profiling.
		"--enable-priority-and-fairness=false",
		"--profiling=false",
	}
	args = append(args, flag.Args()...)

	cmd := app.NewAPIServerCommand()
	cmd.SetArgs(args)
	code := cli.Run(cmd)
	os.Exit(code)
}

// startEtcd starts a single-member etcd in dir on loopback and returns its
// client URL once it serves. Both ports are found free just before (port 0
// would do for listening, but etcd also dials its configured client address
// for its HTTP gateway, and publishes its peer URL in the initial cluster).
func startEtcd(dir string) (string, error) {
	clientPort, err := freePort()
	if err != nil {
		return "", err
	}
	peerPort, err := freePort()
	if err != nil {
		return "", err
	}
	cfg := embed.NewConfig()
	cfg.Name = "kube-apiserver-test"
	cfg.Dir = dir
	client := url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(clientPort))}
	peer := url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(peerPort))}
	cfg.ListenClientUrls = []url.URL{client}
	cfg.AdvertiseClientUrls = []url.URL{client}
	cfg.ListenPeerUrls = []url.URL{peer}
	cfg.AdvertisePeerUrls = []url.URL{peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{"stderr"}
	// Test data: durability across power loss is not needed, speed is.
	cfg.UnsafeNoFsync = true

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return "", err
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		return "", err
	case <-time.After(60 * time.Second):
		e.Close()
		return "", fmt.Errorf("not ready after 60 s")
	}
	go func() {
		// etcd failing under a running API server: stop, loudly.
		if err, ok := <-e.Err(); ok && err != nil {
			fail("etcd stopped: %v", err)
		}
	}()
	return client.String(), nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// writeServiceAccountKeys writes a fresh RSA key pair (PKCS#1 private key,
// PKIX public key), unless both files are already there (a restart on the
// same data dir keeps the tokens it issued valid).
func writeServiceAccountKeys(keyPath, pubPath string) error {
	if _, err := os.Stat(keyPath); err == nil {
		if _, err := os.Stat(pubPath); err == nil {
			return nil
		}
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return err
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(pubPath, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644)
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "kube-apiserver-test: "+format+"\n", args...)
	os.Exit(1)
}
