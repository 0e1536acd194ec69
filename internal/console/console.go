// SPDX-License-Identifier: Apache-2.0

// Package console is vrdmactl console: a web console that shows the
// control plane's inventory (switches, port groups, hosts, VMs) and runs
// the VM procedures (Edit Settings, power on and off) through the local
// agent, as vrdmactl does. Its pages are plain HTML, CSS and JavaScript
// embedded in the binary (assets/): no build step, no request leaves for
// anywhere but the console itself.
//
// The console reads the control plane through a member.Cache and talks
// to the agent with the vrdma.Agent calls vrdmactl uses, so every write
// is checked by the agent exactly as vrdmactl's: the caller is the user
// running the console (the agent's SO_PEERCRED check), and the same
// rules refuse the same changes. Changes to the control plane's hosts,
// switches and port groups go through package admin, as vrdmactl's do.
// Whoever reaches the console acts as that user: it listens on loopback
// unless given a token or served over TLS with client certificates
// required (TLSConfig).
package console

import (
	"context"
	"crypto/subtle"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/control/admin"
	"github.com/vrdma/vrdma/internal/control/member"
	"github.com/vrdma/vrdma/internal/control/store"
)

//go:embed assets
var assets embed.FS

// Config says where the console finds the agent and the control plane,
// and who may use it.
type Config struct {
	// Socket is the local agent's Unix socket.
	Socket string
	// Cache is the control plane's inventory; nil without a control
	// plane (ControlErr then says why).
	Cache      *member.Cache
	ControlErr string
	// Store is the control plane's store, which host, switch and port
	// group changes write to (with the console user's access, as
	// vrdmactl's); nil without a control plane.
	Store *store.Store
	// Agents are the Unix sockets of other hosts' agents the live view
	// reads too: agents of this machine, or of other machines forwarded
	// here (ssh -L /tmp/h2.sock:/run/vrdma/agent.sock h2).
	Agents []string
	// Token, if not empty, is required of every API request: as the
	// cookie that GET /?token=TOKEN sets, or an Authorization: Bearer
	// header.
	Token string
	// ClientCerts says the console is served over TLS that requires a
	// client certificate of its client CA (TLSConfig): a request with a
	// verified certificate needs no token.
	ClientCerts bool
	// CallTimeout bounds each call to the agent.
	CallTimeout time.Duration
}

// cookieName is the cookie that carries the token.
const cookieName = "vrdma_console"

// writeHeader must be on every write request: a page of another site
// cannot set it without a CORS preflight, which the console never
// answers, so it cannot make a browser post to the console.
const writeHeader = "X-Vrdma-Console"

// maxBody bounds a request's body.
const maxBody = 64 << 10

// CheckListen says whether the console may listen on addr: anywhere with
// a token or with TLS client certificates required, only on a loopback
// address without either.
func CheckListen(addr, token string, clientCerts bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--listen %q: want HOST:PORT, e.g. 127.0.0.1:8470: %v", addr, err)
	}
	if token != "" || clientCerts || isLoopback(host) {
		return nil
	}
	return fmt.Errorf("--listen %s is not a loopback address: whoever reaches the console acts as you on the agent and the control plane, so give --token SECRET (and open http://%s/?token=SECRET), or require client certificates (--tls-cert, --tls-key, --tls-client-ca), or listen on 127.0.0.1", addr, addr)
}

// isLoopback reports whether host (a name or an IP literal) is loopback.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// server is the console's HTTP handler.
type server struct {
	cfg Config
	mux *http.ServeMux
}

// New returns the console's HTTP handler.
func New(cfg Config) http.Handler {
	if cfg.CallTimeout == 0 {
		cfg.CallTimeout = 15 * time.Second
	}
	s := &server{cfg: cfg, mux: http.NewServeMux()}
	static, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err) // the embedded directory is part of the binary
	}
	files := http.FileServerFS(static)
	s.mux.HandleFunc("GET /{$}", s.index(files))
	s.mux.Handle("GET /app.js", files)
	s.mux.Handle("GET /app.css", files)
	s.mux.HandleFunc("GET /api/inventory", s.api(s.inventory))
	s.mux.HandleFunc("GET /api/vms/{name}", s.api(s.vm))
	s.mux.HandleFunc("POST /api/vms/{name}/edit", s.write(s.edit))
	s.mux.HandleFunc("POST /api/vms/{name}/power-on", s.write(s.powerOn))
	s.mux.HandleFunc("POST /api/vms/{name}/power-off", s.write(s.powerOff))
	s.mux.HandleFunc("POST /api/vms/{name}/connect", s.write(s.connect))
	s.mux.HandleFunc("POST /api/vms", s.write(s.createVM))
	s.mux.HandleFunc("POST /api/vms/{name}/delete", s.write(s.deleteVM))
	s.mux.HandleFunc("GET /api/hosts/{id}", s.api(s.host))
	s.mux.HandleFunc("POST /api/hosts/{id}/configure", s.write(s.configureHost))
	s.mux.HandleFunc("POST /api/hosts/{id}/uplinks/{uplink}/declare", s.write(s.declareUplink))
	s.mux.HandleFunc("POST /api/switches", s.write(s.createSwitch))
	s.mux.HandleFunc("POST /api/switches/{name}/set", s.write(s.setSwitch))
	s.mux.HandleFunc("POST /api/switches/{name}/delete", s.write(s.deleteSwitch))
	s.mux.HandleFunc("POST /api/portgroups", s.write(s.createPortGroup))
	s.mux.HandleFunc("POST /api/portgroups/{key}/set", s.write(s.setPortGroup))
	s.mux.HandleFunc("POST /api/portgroups/{key}/delete", s.write(s.deletePortGroup))
	s.mux.HandleFunc("GET /api/live", s.api(s.live))
	s.mux.HandleFunc("GET /api/network", s.api(s.network))
	s.mux.HandleFunc("GET /api/path", s.api(s.path))
	return s
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	// Without a token the console trusts whoever reaches loopback; a
	// page of another site that resolves its own name to 127.0.0.1 (DNS
	// rebinding) must not pass for the console's own.
	if s.cfg.Token == "" && !s.cfg.ClientCerts && !isLoopback(hostOnly(r.Host)) {
		http.Error(w, "this console answers only requests for a loopback address (Host: 127.0.0.1, [::1] or localhost)", http.StatusMisdirectedRequest)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// hostOnly returns the host of a Host header, without its port.
func hostOnly(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return hostport
}

// index serves the page; GET /?token=TOKEN with the right token sets the
// token's cookie and sends the browser to / (so the token leaves the
// address bar).
func (s *server) index(files http.Handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if t := r.URL.Query().Get("token"); t != "" && s.cfg.Token != "" {
			if !s.tokenOK(t) {
				http.Error(w, "wrong token: open the address vrdmactl console printed", http.StatusUnauthorized)
				return
			}
			http.SetCookie(w, &http.Cookie{Name: cookieName, Value: t, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
			http.Redirect(w, r, "/", http.StatusSeeOther)
			return
		}
		files.ServeHTTP(w, r)
	}
}

func (s *server) tokenOK(t string) bool {
	return subtle.ConstantTimeCompare([]byte(t), []byte(s.cfg.Token)) == 1
}

// authorized checks the token of an API request.
func (s *server) authorized(r *http.Request) bool {
	if s.cfg.ClientCerts && r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
		return true
	}
	if s.cfg.Token == "" {
		return !s.cfg.ClientCerts
	}
	if b, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && s.tokenOK(b) {
		return true
	}
	c, err := r.Cookie(cookieName)
	return err == nil && s.tokenOK(c.Value)
}

// httpError is an error with the HTTP status it answers.
type httpError struct {
	status int
	msg    string
}

func (e *httpError) Error() string { return e.msg }

// handler serves one API call: it returns the value to answer as JSON.
type handler func(ctx context.Context, r *http.Request) (any, error)

// api wraps a read: token check, a bounded context, JSON out.
func (s *server) api(h handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.authorized(r) {
			writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "no or wrong token: open the address vrdmactl console printed (http://HOST:PORT/?token=...)"})
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), s.cfg.CallTimeout)
		defer cancel()
		v, err := h(ctx, r)
		if err != nil {
			writeJSON(w, statusOf(err), map[string]string{"error": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, v)
	}
}

// write wraps a write: as api, and only from the console's own pages
// (writeHeader, a JSON body, no foreign Origin).
func (s *server) write(h handler) http.HandlerFunc {
	read := s.api(h)
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(writeHeader) != "1" || !strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") {
			writeJSON(w, http.StatusForbidden, map[string]string{"error": "a write needs the header " + writeHeader + ": 1 and a JSON body (Content-Type: application/json): the console's pages send both"})
			return
		}
		if o := r.Header.Get("Origin"); o != "" && o != "http://"+r.Host && o != "https://"+r.Host {
			writeJSON(w, http.StatusForbidden, map[string]string{"error": "a write from origin " + o + " refused: only the console's own pages write"})
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		read(w, r)
	}
}

// decode reads r's JSON body into v, refusing unknown fields.
func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return &httpError{http.StatusBadRequest, "the request's JSON body: " + err.Error()}
	}
	return nil
}

// statusOf maps an error to its HTTP status: the agent's error codes to
// theirs.
func statusOf(err error) int {
	var he *httpError
	if errors.As(err, &he) {
		return he.status
	}
	var ie *admin.InvalidError
	var ce *admin.ConflictError
	switch {
	case errors.As(err, &ie):
		return http.StatusBadRequest
	case errors.As(err, &ce):
		return http.StatusConflict
	case errors.Is(err, store.ErrNotFound):
		return http.StatusNotFound
	}
	var ae *vrdma.Error
	if errors.As(err, &ae) {
		switch ae.Code {
		case abi.CodeInvalid:
			return http.StatusBadRequest
		case abi.CodeNotFound:
			return http.StatusNotFound
		case abi.CodePermission:
			return http.StatusForbidden
		case abi.CodeState:
			return http.StatusConflict
		}
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return http.StatusGatewayTimeout
	}
	return http.StatusBadGateway
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(true)
	enc.Encode(v)
}

// agent dials the local agent for one call.
func (s *server) agent(ctx context.Context) (*vrdma.Agent, error) {
	ag, err := vrdma.DialAgent(ctx, vrdma.WithSocket(s.cfg.Socket))
	if err != nil {
		return nil, fmt.Errorf("%w; vrdmactl console --socket names another socket", err)
	}
	return ag, nil
}
