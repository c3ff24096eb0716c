package idem_test

import (
	"bytes"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// proxy forwards bytes both ways between the library and a server,
// reading the commands the library sends (RESP arrays of bulk strings).
// Armed (cut), it cuts the connection at the next command of a name:
// after forwarding it, before its reply reaches the library (cut_reply),
// or without forwarding it (cut_request). It goes on accepting, so the
// library reconnects.
type proxy struct {
	ln    net.Listener
	mu    sync.Mutex
	rules []*cutRule
}

type cutRule struct {
	command string // the case's name: claim, done, release, mdone, mrelease
	request bool   // cut before the server sees it
	left    int    // times left; -1: every time
}

func startProxy(t *testing.T, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				client.Close()
				continue
			}
			go p.pipe(client, server)
		}
	}()
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

// cut arms a rule: times > 0, or -1 for every time.
func (p *proxy) cut(command string, request bool, times int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rules = append(p.rules, &cutRule{command: command, request: request, left: times})
}

// proxyNames are the case's names of a command (cases.json's README).
func proxyNames(name, function string) []string {
	switch strings.ToUpper(name) {
	case "IDEM.CLAIM":
		return []string{"claim"}
	case "IDEM.DONE":
		return []string{"done"}
	case "IDEM.RELEASE":
		return []string{"release"}
	case "IDEM.MDONE":
		return []string{"mdone"}
	case "IDEM.MRELEASE":
		return []string{"mrelease"}
	case "FCALL":
		switch function {
		case "idem_claim":
			return []string{"claim"}
		case "idem_done":
			return []string{"done", "mdone"}
		case "idem_release":
			return []string{"release", "mrelease"}
		}
	}
	return nil
}

// match takes one time of the first armed rule the command matches.
func (p *proxy) match(names []string) *cutRule {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range p.rules {
		for _, n := range names {
			if r.left != 0 && r.command == n {
				if r.left > 0 {
					r.left--
				}
				return r
			}
		}
	}
	return nil
}

func (p *proxy) pipe(client, server net.Conn) {
	var muted atomic.Bool
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := server.Read(buf)
			if n > 0 && !muted.Load() {
				if _, werr := client.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil || muted.Load() {
				break
			}
		}
		client.Close()
	}()
	defer client.Close()
	var pending []byte
	buf := make([]byte, 64<<10)
	for {
		n, err := client.Read(buf)
		pending = append(pending, buf[:n]...)
		for {
			end, names, ok := nextCommand(pending)
			if !ok {
				break
			}
			rule := p.match(names)
			if rule != nil && rule.request {
				server.Close()
				return
			}
			if rule != nil {
				muted.Store(true)
			}
			if _, werr := server.Write(pending[:end]); werr != nil {
				server.Close()
				return
			}
			pending = pending[end:]
			if rule != nil {
				// The server runs what it read; the library never hears it.
				time.AfterFunc(500*time.Millisecond, func() { server.Close() })
				return
			}
		}
		if err != nil {
			server.Close()
			return
		}
	}
}

// nextCommand reads one RESP array of bulk strings at the start of b: its
// length in bytes and its case names; ok false when b holds less.
func nextCommand(b []byte) (int, []string, bool) {
	line := func(at int) (string, int, bool) {
		end := bytes.Index(b[at:], []byte("\r\n"))
		if end < 0 {
			return "", 0, false
		}
		return string(b[at : at+end]), at + end + 2, true
	}
	head, at, ok := line(0)
	if !ok || len(head) < 2 || head[0] != '*' {
		return 0, nil, false
	}
	count, _ := strconv.Atoi(head[1:])
	var args []string
	for range count {
		h, next, ok := line(at)
		if !ok || len(h) < 2 || h[0] != '$' {
			return 0, nil, false
		}
		size, _ := strconv.Atoi(h[1:])
		if next+size+2 > len(b) {
			return 0, nil, false
		}
		if len(args) < 2 {
			args = append(args, string(b[next:next+size]))
		}
		at = next + size + 2
	}
	if len(args) == 0 {
		return at, nil, true
	}
	function := ""
	if len(args) > 1 {
		function = args[1]
	}
	return at, proxyNames(args[0], function), true
}
