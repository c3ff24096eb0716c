package idem_test

import (
	"bytes"
	"net"
	"sync/atomic"
	"testing"
)

// proxy forwards bytes both ways between the library and a server. Armed,
// it forwards the next client chunk that holds a DONE (IDEM.DONE or
// idem_done) and then closes that client connection before the server's
// reply reaches it; it goes on accepting, so the library reconnects.
type proxy struct {
	ln    net.Listener
	armed atomic.Bool
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

func (p *proxy) pipe(client, server net.Conn) {
	defer client.Close()
	defer server.Close()
	var muted atomic.Bool
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := server.Read(buf)
			if n > 0 && !muted.Load() {
				if _, werr := client.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil || muted.Load() {
				client.Close()
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := client.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			cut := (bytes.Contains(chunk, []byte("IDEM.DONE")) || bytes.Contains(chunk, []byte("idem_done"))) &&
				p.armed.CompareAndSwap(true, false)
			if cut {
				muted.Store(true)
			}
			if _, werr := server.Write(chunk); werr != nil {
				return
			}
			if cut {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
