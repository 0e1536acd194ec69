// SPDX-License-Identifier: Apache-2.0

package store

// The embedded etcd member. One goroutine per Embedded, monitor, owned by
// the Embedded: it waits for the server to fail (embed.Etcd.Err), to stop
// by itself (EtcdServer.StopNotify: fatal raft error, member removed) or
// to be closed (Close), records why, and closes done. Close stops the
// server and waits for monitor, so nothing of an Embedded outlives Close.

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// EmbedConfig configures an embedded etcd member.
type EmbedConfig struct {
	// Dir is the member's data directory (required). It is created with
	// mode 0700; an existing member's data there is reused.
	Dir string
	// Name is the member's name; default "vrdma".
	Name string
	// ClientURL is where clients reach the member. Default: a Unix socket
	// in Dir (unix:///<Dir>/etcd.sock), reachable only by Dir's owner, or,
	// when that path is too long for a socket, in a private directory of
	// this user under os.TempDir() (see PrivateSocketDir). The default is
	// never TCP.
	ClientURL string
	// PeerURL is where the other members reach this one. Default, for a
	// member alone (no InitialCluster): a Unix socket beside the client's
	// (peer.sock), which no other local user can reach. A cluster gives
	// each member's PeerURL; a TCP one (http:// or https://) needs
	// PeerTLS, or InsecurePeer to accept plaintext raft traffic that anyone
	// who reaches the port can read and join.
	PeerURL string
	// PeerTLS, if set, serves and dials peers over TLS with these files
	// (PeerURL https://); ClientCAFile then names the CA every peer's
	// certificate must be signed by.
	PeerTLS *ServerTLSFiles
	// InsecurePeer accepts a TCP PeerURL without PeerTLS.
	InsecurePeer bool
	// InitialCluster lists every member as name=peerURL, comma separated,
	// for a new cluster; default: this member alone. Ignored when Dir
	// already holds a member.
	InitialCluster string
	// ClusterToken keeps members of different clusters apart; default
	// "vrdma".
	ClusterToken string
	// ClientTLS, if set, serves clients over TLS; ClientURL must then be
	// https:// or unixs:// (the default is the Unix socket, unixs://).
	ClientTLS *ServerTLSFiles
	// TickMs and ElectionMs are raft's heartbeat and election timeout
	// (0: etcd's defaults, 100 and 1000).
	TickMs, ElectionMs uint
	// UnsafeNoFsync skips fsync: fast, and loses data on a crash. For
	// tests only.
	UnsafeNoFsync bool
	// StartTimeout bounds the wait for the member to be ready; default 60s.
	StartTimeout time.Duration
	// Log receives etcd's own log (JSON lines) at LogLevel ("error" by
	// default); nil discards it.
	Log io.Writer
	// Logger, if set, receives etcd's log instead of Log, through slog.
	Logger   *slog.Logger
	LogLevel string
}

// ServerTLSFiles names the PEM files of an embedded member's TLS listener.
type ServerTLSFiles struct {
	CertFile string // the member's certificate
	KeyFile  string
	// ClientCAFile, if set, requires every client to present a
	// certificate signed by this CA.
	ClientCAFile string
}

// info returns etcd's form of f.
func (f *ServerTLSFiles) info() transport.TLSInfo {
	return transport.TLSInfo{
		CertFile:       f.CertFile,
		KeyFile:        f.KeyFile,
		TrustedCAFile:  f.ClientCAFile,
		ClientCertAuth: f.ClientCAFile != "",
	}
}

// maxUnixPath is the longest Unix socket path we use (sun_path holds 108
// bytes, NUL included).
const maxUnixPath = 100

// EndpointFile is the file in the data directory of an embedded store where
// Open writes the client URL, so that a CLI on the same host finds it.
const EndpointFile = "client-url"

// Embedded is a running embedded etcd member. Its methods are safe for
// concurrent use.
type Embedded struct {
	cfg       EmbedConfig
	etcd      *embed.Etcd
	clientURL string
	peerURL   string

	stopc chan struct{} // closed by Close
	done  chan struct{} // closed by monitor when the member has stopped
	once  sync.Once
	mu    sync.Mutex
	// why the member stopped by itself
	stopErr error // +checklocks:mu
}

// StartEmbedded starts an etcd member and waits until it is ready to serve
// (it has joined its cluster and, for a cluster, a leader is elected), at
// most StartTimeout. For a cluster, start every member concurrently: none
// is ready before a majority runs.
func StartEmbedded(ctx context.Context, cfg EmbedConfig) (*Embedded, error) {
	if cfg.Dir == "" {
		return nil, errors.New("embedded etcd: no data directory")
	}
	if cfg.Name == "" {
		cfg.Name = "vrdma"
	}
	if cfg.ClusterToken == "" {
		cfg.ClusterToken = "vrdma"
	}
	if cfg.StartTimeout == 0 {
		cfg.StartTimeout = 60 * time.Second
	}
	if cfg.LogLevel == "" {
		cfg.LogLevel = "error"
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd: data directory: %w", err)
	}
	cfg.Dir = dir
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("embedded etcd: create data directory: %w", err)
	}
	sockDir := dir // where the default sockets go
	if len(filepath.Join(dir, "peer.sock")) > maxUnixPath && (cfg.ClientURL == "" || cfg.PeerURL == "") {
		if sockDir, err = PrivateSocketDir(dir); err != nil {
			return nil, err
		}
	}
	if cfg.ClientURL == "" {
		sock := filepath.Join(sockDir, "etcd.sock")
		os.Remove(sock) // a stale socket of a previous run; etcd would fail to bind
		cfg.ClientURL = "unix://" + sock
		if cfg.ClientTLS != nil {
			cfg.ClientURL = "unixs://" + sock
		}
	}
	if cfg.PeerURL == "" {
		if cfg.InitialCluster != "" {
			return nil, errors.New("embedded etcd: a member of a cluster (InitialCluster) needs its PeerURL")
		}
		cfg.PeerURL = "unix://" + filepath.Join(sockDir, "peer.sock")
	}
	curl, err := url.Parse(cfg.ClientURL)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd: client URL %q: %w", cfg.ClientURL, err)
	}
	purl, err := url.Parse(cfg.PeerURL)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd: peer URL %q: %w", cfg.PeerURL, err)
	}
	// etcd binds a peer listener to the URL's host, not its path: a Unix
	// socket's absolute path goes there (the advertised URL keeps the
	// parseable form, unix:///path).
	lpurl := *purl
	switch purl.Scheme {
	case "unix", "unixs":
		lpurl.Host, lpurl.Path = purl.Host+purl.Path, ""
		os.Remove(lpurl.Host) // a stale socket of a previous run
	case "http":
		if !cfg.InsecurePeer {
			return nil, fmt.Errorf("embedded etcd: peer URL %s is plaintext TCP: anyone who reaches it can read the control plane and join its raft; give PeerTLS (https://), or InsecurePeer to accept that", cfg.PeerURL)
		}
	case "https":
		if cfg.PeerTLS == nil || cfg.PeerTLS.CertFile == "" || cfg.PeerTLS.KeyFile == "" {
			return nil, fmt.Errorf("embedded etcd: peer URL %s needs PeerTLS with a certificate and a key file", cfg.PeerURL)
		}
	default:
		return nil, fmt.Errorf("embedded etcd: peer URL %q: want unix://, http:// or https://", cfg.PeerURL)
	}

	if tls := cfg.ClientTLS; tls != nil {
		if curl.Scheme != "https" && curl.Scheme != "unixs" {
			return nil, fmt.Errorf("embedded etcd: client URL %q: TLS needs https:// or unixs://", cfg.ClientURL)
		}
		if tls.CertFile == "" || tls.KeyFile == "" {
			return nil, errors.New("embedded etcd: TLS needs a certificate and a key file")
		}
	}

	ec := embed.NewConfig()
	if cfg.ClientTLS != nil {
		ec.ClientTLSInfo = cfg.ClientTLS.info()
	}
	if cfg.PeerTLS != nil {
		ec.PeerTLSInfo = cfg.PeerTLS.info()
	}
	ec.Name = cfg.Name
	ec.Dir = dir
	ec.ListenClientUrls = []url.URL{*curl}
	ec.AdvertiseClientUrls = []url.URL{*curl}
	ec.ListenPeerUrls = []url.URL{lpurl}
	ec.AdvertisePeerUrls = []url.URL{*purl}
	ec.InitialCluster = cfg.InitialCluster
	if ec.InitialCluster == "" {
		ec.InitialCluster = cfg.Name + "=" + cfg.PeerURL
	}
	ec.InitialClusterToken = cfg.ClusterToken
	ec.ClusterState = embed.ClusterStateFlagNew
	if cfg.TickMs != 0 {
		ec.TickMs = cfg.TickMs
	}
	if cfg.ElectionMs != 0 {
		ec.ElectionMs = cfg.ElectionMs
	}
	ec.UnsafeNoFsync = cfg.UnsafeNoFsync
	// Keep an hour of history for watchers that fall behind; a watcher
	// that falls further behind gets ErrCompacted and re-lists.
	ec.AutoCompactionMode = embed.CompactorModePeriodic
	ec.AutoCompactionRetention = "1h"
	stopc := make(chan struct{})
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(etcdLogger(cfg.Log, cfg.Logger, cfg.LogLevel, stopc))

	e, err := embed.StartEtcd(ec)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd in %s: %w", dir, err)
	}
	t := time.NewTimer(cfg.StartTimeout)
	defer t.Stop()
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("embedded etcd in %s: %w", dir, err)
	case <-t.C:
		e.Server.Stop()
		e.Close()
		return nil, fmt.Errorf("embedded etcd in %s: not ready after %v (for a cluster: are a majority of the members in %q running?)", dir, cfg.StartTimeout, ec.InitialCluster)
	case <-ctx.Done():
		e.Server.Stop()
		e.Close()
		return nil, fmt.Errorf("embedded etcd in %s: %w", dir, ctx.Err())
	}
	m := &Embedded{
		cfg:       cfg,
		etcd:      e,
		clientURL: cfg.ClientURL,
		peerURL:   cfg.PeerURL,
		stopc:     stopc,
		done:      make(chan struct{}),
	}
	go m.monitor()
	return m, nil
}

// monitor waits for the member to stop and records why. See the comment
// at the top of the file.
func (m *Embedded) monitor() {
	defer close(m.done)
	var why error
	select {
	case err, ok := <-m.etcd.Err():
		if ok && err != nil {
			why = fmt.Errorf("embedded etcd failed: %w", err)
		}
	case <-m.etcd.Server.StopNotify():
		why = errors.New("embedded etcd stopped")
	case <-m.stopc:
		return
	}
	select {
	case <-m.stopc: // closing: not a failure
	default:
		m.mu.Lock()
		m.stopErr = why
		m.mu.Unlock()
	}
}

// ClientURL returns the URL clients use to reach the member.
func (m *Embedded) ClientURL() string { return m.clientURL }

// PeerURL returns the URL the other members use to reach this one.
func (m *Embedded) PeerURL() string { return m.peerURL }

// Config returns the configuration the member runs with, defaults filled in:
// starting a member again with it reuses the same data directory and URLs.
func (m *Embedded) Config() EmbedConfig { return m.cfg }

// ID returns the member's ID in its cluster.
func (m *Embedded) ID() uint64 { return uint64(m.etcd.Server.MemberID()) }

// IsLeader reports whether the member is its cluster's raft leader now.
func (m *Embedded) IsLeader() bool { return m.etcd.Server.Leader() == m.etcd.Server.MemberID() }

// Done is closed when the member has stopped, by Close or by itself.
func (m *Embedded) Done() <-chan struct{} { return m.done }

// Err returns why the member stopped by itself; nil while it runs and
// after Close.
func (m *Embedded) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stopErr
}

// Kill stops the member's raft at once, as a crash would: no leadership
// transfer, no draining of client requests. Clients connected to it see
// requests fail and move to other endpoints. Call Close afterwards to
// release its listeners and data directory.
func (m *Embedded) Kill() {
	m.etcd.Server.HardStop()
}

// Close stops the member and waits until it has stopped. etcd lets open
// client streams (watches) drain for up to its request timeout (5 s + two
// election timeouts) first. Close may be called more than once. It may be called
// more than once.
func (m *Embedded) Close() {
	m.once.Do(func() {
		close(m.stopc)
		m.etcd.Close()
		<-m.done
	})
}

// PrivateSocketDir returns the directory for the sockets of a member whose
// data directory dataDir is too deep for a Unix socket path:
// os.TempDir()/vrdma-<uid>-<hash of dataDir>, created with mode 0700. An
// existing one is used only if it is a directory (not a symbolic link)
// owned by this user with mode 0700; anything else there is refused, since
// another user could then reach, or replace, the sockets.
func PrivateSocketDir(dataDir string) (string, error) {
	sum := sha256.Sum256([]byte(dataDir))
	uid := os.Getuid()
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("vrdma-%d-%x", uid, sum[:8]))
	if len(filepath.Join(dir, "peer.sock")) > maxUnixPath {
		return "", fmt.Errorf("embedded etcd: socket paths under %s and under the temporary directory %s are too long for a Unix socket: use a shorter data directory or TMPDIR", dataDir, os.TempDir())
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("embedded etcd: socket directory: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return "", fmt.Errorf("embedded etcd: socket directory: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || !ok || int(st.Uid) != uid || fi.Mode().Perm() != 0o700 {
		return "", fmt.Errorf("embedded etcd: socket directory %s is not a directory of uid %d with mode 0700 (%v): refusing to put the control plane's sockets there; remove it", dir, uid, fi.Mode())
	}
	return dir, nil
}

// etcdLogger returns the zap logger etcd logs through at level: to l
// (slogZap, closing as there) if set, else JSON lines to w; neither gives
// a logger that discards everything.
func etcdLogger(w io.Writer, l *slog.Logger, level string, closing <-chan struct{}) *zap.Logger {
	if l != nil {
		return slogZap(l, level, closing)
	}
	if w == nil {
		return zap.NewNop()
	}
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		lvl = zapcore.ErrorLevel
	}
	enc := zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
	return zap.New(zapcore.NewCore(enc, zapcore.AddSync(w), lvl))
}
