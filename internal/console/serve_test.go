// SPDX-License-Identifier: Apache-2.0

package console

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestConsoleServeTimeouts checks that Serve drops a client that sends
// a request's body too slowly and one that keeps an idle connection
// open (slowloris), instead of holding their connections for ever.
func TestConsoleServeTimeouts(t *testing.T) {
	oldRead, oldIdle := readTimeout, idleTimeout
	readTimeout, idleTimeout = 300*time.Millisecond, 300*time.Millisecond
	t.Cleanup(func() { readTimeout, idleTimeout = oldRead, oldIdle })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, ln, New(Config{Socket: "/nonexistent.sock"}), nil) }()
	t.Cleanup(func() { cancel(); <-done })

	// closed says whether the server closes c within 5 s.
	closed := func(c net.Conn) bool {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := io.Copy(io.Discard, c)
		return err == nil // EOF: the server closed it
	}

	// A body that never ends.
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "POST /api/switches HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Vrdma-Console: 1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"name\":")
	if !closed(c) {
		t.Error("a request whose body never ends still holds its connection after 5 s")
	}

	// A kept-alive connection left idle after a request.
	c2, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	io.WriteString(c2, "GET /app.css HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
	br := bufio.NewReader(c2)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET /app.css: %s", resp.Status)
	}
	c2.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.Copy(io.Discard, br); err != nil {
		t.Error("an idle kept-alive connection is still open after 5 s")
	}
}

// login opens GET /?token=TOKEN of srv without following its redirect:
// the answer's status and the token's cookie it sets (nil: none).
func login(t *testing.T, srv *httptest.Server, token string) (int, *http.Cookie) {
	t.Helper()
	noRedirect := *srv.Client()
	noRedirect.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := noRedirect.Get(srv.URL + "/?token=" + url.QueryEscape(token))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for _, c := range resp.Cookies() {
		if strings.HasPrefix(c.Name, cookieName) {
			return resp.StatusCode, c
		}
	}
	return resp.StatusCode, nil
}

// TestConsoleTokenCookie checks that a token of characters a cookie
// cannot carry (; " \ space, not ASCII) still logs the browser in: the
// cookie GET /?token= sets is let in, and the token itself is neither
// the cookie nor accepted as one.
func TestConsoleTokenCookie(t *testing.T) {
	const token = `a b;c"d\e,é-0123456789`
	srv := httptest.NewServer(New(Config{Socket: "/nonexistent.sock", Token: token}))
	defer srv.Close()
	code, cookie := login(t, srv, token)
	if code != http.StatusSeeOther || cookie == nil {
		t.Fatalf("GET /?token=: %d, cookie %+v", code, cookie)
	}
	get := func(c *http.Cookie) int {
		req, _ := http.NewRequest("GET", srv.URL+"/api/inventory", nil)
		req.AddCookie(c)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get(cookie); code != 200 {
		t.Errorf("GET /api/inventory with the cookie GET /?token= set (%q): %d, want 200", cookie.Value, code)
	}
	if code := get(&http.Cookie{Name: cookie.Name, Value: "0123456789"}); code != 401 {
		t.Errorf("GET /api/inventory with another cookie: %d, want 401", code)
	}
}

// TestConsoleHostileLinks opens pages of the console by links that name
// a VM, a switch and a host with HTML in it, and a VM with a malformed
// escape: the names show as text (no element is made of them, no
// script runs), and the malformed one still draws its page.
func TestConsoleHostileLinks(t *testing.T) {
	srv := httptest.NewServer(New(Config{Socket: "/nonexistent.sock"}))
	defer srv.Close()
	ctx := browser(t, 1000)
	const evil = `<img src=x onerror="document.body.dataset.pwned=1">`
	for _, c := range []struct{ hash, heading string }{
		{"#/vm/" + url.PathEscape(evil), "VM " + evil},
		{"#/switch/" + url.PathEscape(evil), "Switch " + evil},
		{"#/host/" + url.PathEscape(evil), "Host"},
		{"#/vm/%E0%A4%A", "VM %E0%A4%A"},
	} {
		do(t, ctx, "open "+c.hash, chromedp.Navigate(srv.URL+"/"+c.hash),
			chromedp.Poll[chromedp.Void](`document.body.dataset.ready === `+jsString(c.hash), chromedp.WithPollingTimeout(15*time.Second)),
			waitText("main h1", c.heading))
		bad, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`!!document.querySelector('main img') || document.body.dataset.pwned === '1'`))
		if err != nil || bad {
			t.Errorf("%s: an element was made of the name, or its script ran (%v)", c.hash, err)
		}
	}
}

// TestConsoleBodyTooLarge checks that a write's body over the bound is
// refused as too large (413), not read in full nor taken for bad JSON.
func TestConsoleBodyTooLarge(t *testing.T) {
	srv := httptest.NewServer(New(Config{Socket: "/nonexistent.sock"}))
	defer srv.Close()
	body := `{"name":"` + strings.Repeat("x", 2*maxBody) + `"}`
	req, _ := http.NewRequest("POST", srv.URL+"/api/switches", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(writeHeader, "1")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(b), "over 65536 bytes") {
		t.Errorf("a %d-byte body: %s %s", len(body), resp.Status, b)
	}
}

// TestConsoleTwoConsoles logs one browser (one cookie jar) in to two
// consoles on one host, on two ports with two tokens: each stays logged
// in, since the host's cookies are the same for all its ports.
func TestConsoleTwoConsoles(t *testing.T) {
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Jar: jar}
	var srvs []*httptest.Server
	for _, token := range []string{"rv-first-0123456789abcdef", "rv-second-0123456789abcdef"} {
		srv := httptest.NewServer(New(Config{Socket: "/nonexistent.sock", Token: token}))
		defer srv.Close()
		resp, err := client.Get(srv.URL + "/?token=" + token)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		srvs = append(srvs, srv)
	}
	for i, srv := range srvs {
		resp, err := client.Get(srv.URL + "/api/inventory")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("console %d (%s) after logging in to both: %s, want 200", i+1, srv.URL, resp.Status)
		}
	}
}
