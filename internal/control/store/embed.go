package store

// The embedded etcd member. One goroutine per Embedded, monitor, owned by
// the Embedded: it waits for the server to fail (embed.Etcd.Err), to stop
// by itself (EtcdServer.StopNotify: fatal raft error, member removed) or
// to be closed (Close), records why, and closes done. Close stops the
// server and waits for monitor, so nothing of an Embedded outlives Close.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
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
	// in Dir (unix:///<Dir>/etcd.sock), reachable only by Dir's owner, or
	// http://127.0.0.1:<free port> when that path is too long for a socket.
	ClientURL string
	// PeerURL is where the other members reach this one. Default:
	// http://127.0.0.1:<free port>. Only a cluster needs it to be known in
	// advance.
	PeerURL string
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
	Log      io.Writer
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
	if cfg.ClientURL == "" {
		if sock := filepath.Join(dir, "etcd.sock"); len(sock) <= maxUnixPath {
			os.Remove(sock) // a stale socket of a previous run; etcd would fail to bind
			cfg.ClientURL = "unix://" + sock
			if cfg.ClientTLS != nil {
				cfg.ClientURL = "unixs://" + sock
			}
		} else if cfg.ClientURL, err = freeLocalURL(); err != nil {
			return nil, err
		} else if cfg.ClientTLS != nil {
			cfg.ClientURL = "https" + strings.TrimPrefix(cfg.ClientURL, "http")
		}
	}
	if cfg.PeerURL == "" {
		if cfg.PeerURL, err = freeLocalURL(); err != nil {
			return nil, err
		}
	}
	curl, err := url.Parse(cfg.ClientURL)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd: client URL %q: %w", cfg.ClientURL, err)
	}
	purl, err := url.Parse(cfg.PeerURL)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd: peer URL %q: %w", cfg.PeerURL, err)
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
	if tls := cfg.ClientTLS; tls != nil {
		ec.ClientTLSInfo = transport.TLSInfo{
			CertFile:       tls.CertFile,
			KeyFile:        tls.KeyFile,
			TrustedCAFile:  tls.ClientCAFile,
			ClientCertAuth: tls.ClientCAFile != "",
		}
	}
	ec.Name = cfg.Name
	ec.Dir = dir
	ec.ListenClientUrls = []url.URL{*curl}
	ec.AdvertiseClientUrls = []url.URL{*curl}
	ec.ListenPeerUrls = []url.URL{*purl}
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
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zapLogger(cfg.Log, cfg.LogLevel))

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
		stopc:     make(chan struct{}),
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

// freeLocalURL returns http://127.0.0.1:<port> with a port that was free a
// moment ago.
func freeLocalURL() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("embedded etcd: find a free port: %w", err)
	}
	defer ln.Close()
	return "http://127.0.0.1:" + strconv.Itoa(ln.Addr().(*net.TCPAddr).Port), nil
}

// zapLogger returns a logger writing JSON lines to w at level; w == nil
// gives a logger that discards everything.
func zapLogger(w io.Writer, level string) *zap.Logger {
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
