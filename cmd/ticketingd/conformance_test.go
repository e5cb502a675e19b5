package main

// Black-box conformance suite for the binding wire protocol
// (docs/protocol.md).
//
// Every test runs the real ticketingd binary and speaks raw bytes: frames are
// hex literals or are assembled here by hand, and replies are read with a
// four-line framer of this file, never with internal/wire, so that a codec
// bug cannot hide a server bug. Where the protocol fixes the bytes of a reply,
// the test compares all of them; where it does not (waited_ms, an E's
// message), the test checks the structure and the fixed fields.
//
// Run only this suite: go test ./cmd/ticketingd -run Conformance -count=1

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// ---------------------------------------------------------------- helpers

// conf is one running ticketingd for conformance tests.
type conf struct {
	sp    *subprocess
	addr  string
	admin string // "" unless started with withAdmin
}

const withAdmin = "--admin-listen=127.0.0.1:0"

// startConf runs ticketingd serve on a fresh data directory with node name
// "n1" (so that HELLO_OK is exactly the test vector) plus args.
func startConf(t *testing.T, args ...string) *conf {
	t.Helper()
	all := append([]string{"serve", "--listen", "127.0.0.1:0",
		"--data-dir", filepath.Join(t.TempDir(), "data"), "--log-format", "json", "--node-name", "n1"}, args...)
	sp := startBinary(t, buildBinary(t), all...)
	c := &conf{sp: sp, addr: sp.addr(t)}
	for _, a := range args {
		if a == withAdmin {
			c.admin = "http://" + sp.stderr.waitJSON(t, "admin listening", sp.done)["addr"].(string)
		}
	}
	return c
}

// statusClient bounds a /status read, so that a server that accepts the
// connection and never answers fails the test instead of hanging it.
var statusClient = &http.Client{Timeout: 10 * time.Second}

// status reads /status (needs withAdmin).
func (c *conf) status(t *testing.T) map[string]float64 {
	t.Helper()
	resp, err := statusClient.Get(c.admin + "/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for k, v := range m {
		if f, ok := v.(float64); ok {
			out[k] = f
		}
	}
	return out
}

// waitStatus polls /status until field == want.
func (c *conf) waitStatus(t *testing.T, field string, want float64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := c.status(t)[field]
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/status %s = %v, want %v", field, got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// x decodes hex, ignoring spaces.
func x(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatalf("bad hex %q: %v", s, err)
	}
	return b
}

// lenPrefix puts the u32 BE length in front of body (given in hex).
func lenPrefix(t testing.TB, bodyHex string) []byte {
	body := x(t, bodyHex)
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
}

// Hand-built request frames (hex, not internal/wire).
func helloF(t testing.TB, req uint32, token string) []byte {
	return lenPrefix(t, fmt.Sprintf("48%08x01%02x%x00", req, len(token), token))
}

// ownerHex is 16 bytes of b.
func ownerHex(b byte) string { return strings.Repeat(fmt.Sprintf("%02x", b), 16) }

func acqF(t testing.TB, req uint32, owner byte, waitS, leaseS uint8, key string) []byte {
	return lenPrefix(t, fmt.Sprintf("41%08x%s%02x%02x%02x%x", req, ownerHex(owner), waitS, leaseS, len(key), key))
}

func relF(t testing.TB, req uint32, token uint64, key string) []byte {
	return lenPrefix(t, fmt.Sprintf("55%08x%016x%02x%x", req, token, len(key), key))
}

func pingF(t testing.TB, req uint32) []byte { return lenPrefix(t, fmt.Sprintf("50%08x", req)) }

// simpleHex is the whole frame of a reply without fields (T B R N P).
func simpleHex(typ byte, req uint32) string { return fmt.Sprintf("00000005%02x%08x", typ, req) }

// Exact HELLO_OK of a server started with --node-name n1 (test vector).
func helloOKHex(req uint32) string { return fmt.Sprintf("0000000a4f%08x0101026e31", req) }

// Version 2 frames (hex, not internal/wire).
func cancelF(t testing.TB, req uint32) []byte { return lenPrefix(t, fmt.Sprintf("43%08x", req)) }

func relOwnedF(t testing.TB, req uint32, token uint64, owner byte, key string) []byte {
	return lenPrefix(t, fmt.Sprintf("56%08x%016x%s%02x%x", req, token, ownerHex(owner), len(key), key))
}

// Exact HELLO_OK version 2 of a server started with --node-name n1.
func helloOKv2Hex(req uint32) string { return fmt.Sprintf("0000000a4f%08x0201026e31", req) }

// raw is one TCP connection speaking raw bytes.
type raw struct {
	t  *testing.T
	nc net.Conn
	br *bufio.Reader
}

func dialConf(t *testing.T, addr string) *raw {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return &raw{t: t, nc: nc, br: bufio.NewReader(nc)}
}

// open dials and completes HELLO (no token) with req_id 1.
func openConf(t *testing.T, addr string) *raw {
	t.Helper()
	r := dialConf(t, addr)
	r.send(x(t, "000000084800000001010000")) // HELLO req 1, no token, no name
	r.expect(helloOKHex(1))
	return r
}

// openConfV2 dials and completes a version-2 HELLO (no token) with req_id 1.
func openConfV2(t *testing.T, addr string) *raw {
	t.Helper()
	r := dialConf(t, addr)
	r.send(x(t, "000000084800000001020000")) // HELLO req 1, version 2, no token, no name
	r.expect(helloOKv2Hex(1))
	return r
}

func (r *raw) send(b ...[]byte) {
	r.t.Helper()
	if _, err := r.nc.Write(bytes.Join(b, nil)); err != nil {
		r.t.Fatalf("write: %v", err)
	}
}

// frame reads one whole frame (length prefix included) within d.
func (r *raw) frame(d time.Duration) ([]byte, error) {
	r.nc.SetReadDeadline(time.Now().Add(d))
	hdr := make([]byte, 4)
	if _, err := io.ReadFull(r.br, hdr); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr)
	if n == 0 || n > 1024 {
		return nil, fmt.Errorf("server sent a frame of length %d", n)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r.br, body); err != nil {
		return nil, fmt.Errorf("frame cut short: %w", err)
	}
	return append(hdr, body...), nil
}

func (r *raw) next() []byte {
	r.t.Helper()
	f, err := r.frame(5 * time.Second)
	if err != nil {
		r.t.Fatalf("reading a reply: %v", err)
	}
	return f
}

// expect reads one frame and compares every byte with wantHex.
func (r *raw) expect(wantHex string) {
	r.t.Helper()
	got := r.next()
	if want := x(r.t, wantHex); !bytes.Equal(got, want) {
		r.t.Fatalf("got frame %x, want %x", got, want)
	}
}

// expectG reads a GRANTED for req and returns its token and waited_ms; all
// bytes but those two fields are fixed.
func (r *raw) expectG(req uint32) (token uint64, waited uint32) {
	r.t.Helper()
	return parseG(r.t, r.next(), req)
}

func parseG(t *testing.T, f []byte, req uint32) (uint64, uint32) {
	t.Helper()
	if len(f) != 21 || !bytes.Equal(f[:9], x(t, fmt.Sprintf("0000001147%08x", req))) {
		t.Fatalf("got frame %x, want GRANTED req %d (0000001147%08x + token u64 + waited_ms u32)", f, req, req)
	}
	return binary.BigEndian.Uint64(f[9:17]), binary.BigEndian.Uint32(f[17:21])
}

// expectGExact reads a GRANTED with the given token and waited_ms.
func (r *raw) expectGExact(req uint32, token uint64, waited uint32) {
	r.t.Helper()
	r.expect(fmt.Sprintf("0000001147%08x%016x%08x", req, token, waited))
}

// expectE reads an ERROR with code and req_id, checks its layout (msg_len
// matches the frame), then expects the server to close the connection.
func (r *raw) expectE(code uint16, req uint32) {
	r.t.Helper()
	f := r.next()
	checkE(r.t, f, code, req)
	r.expectEOF()
}

func checkE(t *testing.T, f []byte, code uint16, req uint32) {
	t.Helper()
	if len(f) < 13 || f[4] != 'E' {
		t.Fatalf("got frame %x, want ERROR", f)
	}
	n := binary.BigEndian.Uint32(f[:4])
	gotReq := binary.BigEndian.Uint32(f[5:9])
	gotCode := binary.BigEndian.Uint16(f[9:11])
	msgLen := binary.BigEndian.Uint16(f[11:13])
	if gotCode != code || gotReq != req {
		t.Fatalf("got E(%d) req %d %q, want E(%d) req %d", gotCode, gotReq, f[13:], code, req)
	}
	if int(n) != 9+int(msgLen) {
		t.Fatalf("E frame %x: length %d but msg_len %d", f, n, msgLen)
	}
}

// expectEOF: the server closes the connection (FIN, or a reset) and sends
// nothing more.
func (r *raw) expectEOF() {
	r.t.Helper()
	f, err := r.frame(5 * time.Second)
	if err == nil {
		r.t.Fatalf("got frame %x after a session-fatal reply, want the connection closed", f)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		r.t.Fatalf("connection still open 5 s after a session-fatal reply")
	}
}

// expectSilence: nothing arrives within d.
func (r *raw) expectSilence(d time.Duration) {
	r.t.Helper()
	f, err := r.frame(d)
	if err == nil {
		r.t.Fatalf("unexpected frame %x", f)
	}
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		r.t.Fatalf("unexpected error %v, want silence", err)
	}
}

// sync makes sure the server has handled everything sent before: PING req
// id answers only after the reader has handled every earlier frame.
func (r *raw) sync(id uint32) {
	r.t.Helper()
	r.send(pingF(r.t, id))
	r.expect(simpleHex('P', id))
}

// ---------------------------------------------------------------- vectors

// TestConformanceVectors: every test vector of docs/protocol.md that a server
// receives or sends, byte for byte.
func TestConformanceVectors(t *testing.T) {
	t.Parallel()
	t.Run("HELLO with token -> HELLO_OK", func(t *testing.T) {
		t.Parallel()
		s := startConf(t, "--client-token", "s3cret")
		r := dialConf(t, s.addr)
		r.send(x(t, "000000114800000001010673336372657403617070"))
		r.expect("0000000a4f000000010101026e31")
	})
	t.Run("HELLO without token -> HELLO_OK", func(t *testing.T) {
		t.Parallel()
		s := startConf(t)
		r := dialConf(t, s.addr)
		r.send(x(t, "000000084800000001010000"))
		r.expect("0000000a4f000000010101026e31")
	})
	t.Run("HELLO without token to a server with tokens -> E(3) req 1", func(t *testing.T) {
		t.Parallel()
		s := startConf(t, "--client-token", "s3cret")
		r := dialConf(t, s.addr)
		r.send(x(t, "000000084800000001010000"))
		f := r.next()
		checkE(t, f, 3, 1)
		if hex.EncodeToString(f) != "0000001545000000010003000c756e617574686f72697a6564" {
			t.Logf("E(3) message differs from the vector (allowed): %x", f)
		}
		r.expectEOF()
	})
	t.Run("ACQUIRE RELEASE PING T B N R", func(t *testing.T) {
		t.Parallel()
		s := startConf(t, "--max-locks", "1")
		r := openConf(t, s.addr)
		// ACQUIRE req 2, owner 00..0f, wait 5, lease 30, key "order-42" on a
		// fresh server: GRANTED req 2 token 1 (tokens start at 1 by
		// default, as docs/protocol.md says).
		r.send(x(t, "000000204100000002000102030405060708090a0b0c0d0e0f051e086f726465722d3432"))
		tok, waited := r.expectG(2)
		if tok != 1 {
			t.Fatalf("first token %d, want 1", tok)
		}
		if waited > 100 {
			t.Fatalf("waited_ms %d on a free key", waited)
		}
		// Another owner, wait 0: TIMED_OUT req 2.
		o := openConf(t, s.addr)
		o.send(acqF(t, 2, 0xee, 0, 30, "order-42"))
		o.expect("000000055400000002")
		// Held-lock limit 1 reached: BUSY req 2.
		o.send(acqF(t, 2, 0xee, 5, 30, "other"))
		o.expect("000000054200000002")
		// RELEASE req 3, token 42: NOT_HELD req 3.
		r.send(x(t, "000000165500000003000000000000002a086f726465722d3432"))
		r.expect("000000054e00000003")
		// RELEASE req 3, token 1: RELEASED req 3.
		r.send(x(t, "000000165500000003"+"0000000000000001"+"086f726465722d3432"))
		r.expect("000000055200000003")
		// PING req 4: PONG req 4.
		r.send(x(t, "000000055000000004"))
		r.expect("000000055000000004")
	})
	t.Run("standby HELLO -> NOT_ACTIVE", func(t *testing.T) {
		t.Parallel()
		s := startConf(t, "--standby", "--standby-hint", "node-b:5225")
		r := dialConf(t, s.addr)
		r.send(x(t, "000000084800000000010000")) // HELLO req 0
		r.expect("000000114d000000000b6e6f64652d623a35323235")
		r.expectEOF()
	})
}

// ---------------------------------------------------------------- session rules

// TestConformanceSessionRules: one subtest per rule of "Session rules" (and
// the E rules above them).
func TestConformanceSessionRules(t *testing.T) {
	t.Parallel()
	s := startConf(t, withAdmin)

	// Session rules (docs/protocol.md), the first: the first frame must be HELLO.
	t.Run("1/first frame PING -> E(1) with its req_id", func(t *testing.T) {
		r := dialConf(t, s.addr)
		r.send(x(t, "000000055000000004"))
		r.expectE(1, 4)
	})
	t.Run("1/first frame unknown type -> E(1) with its req_id", func(t *testing.T) {
		r := dialConf(t, s.addr)
		r.send(x(t, "000000055a00000009"))
		r.expectE(1, 9)
	})
	t.Run("1/first frame of 4 bytes -> E(1) req 0", func(t *testing.T) {
		r := dialConf(t, s.addr)
		r.send(x(t, "0000000448000000"))
		r.expectE(1, 0)
	})
	t.Run("1/second HELLO -> E(1) with its req_id", func(t *testing.T) {
		r := openConf(t, s.addr)
		r.send(x(t, "000000084800000005010000"))
		r.expectE(1, 5)
	})
	t.Run("1/second HELLO of 3 bytes -> E(1) req 0", func(t *testing.T) {
		r := openConf(t, s.addr)
		r.send(x(t, "00000003480000"))
		r.expectE(1, 0)
	})
	t.Run("1/HELLO with trailing byte -> E(1)", func(t *testing.T) {
		r := dialConf(t, s.addr)
		r.send(x(t, "00000009480000000201000000"))
		r.expectE(1, 2)
	})
	t.Run("1/HELLO name_len past the end -> E(1)", func(t *testing.T) {
		r := dialConf(t, s.addr)
		r.send(x(t, "00000009"+"4800000002"+"01"+"00"+"05"+"61"))
		r.expectE(1, 2)
	})
	t.Run("1/HELLO version 4 -> E(2)", func(t *testing.T) {
		r := dialConf(t, s.addr)
		r.send(x(t, "000000084800000003040000"))
		r.expectE(2, 3)
	})
	t.Run("1/HELLO version 0 -> E(2)", func(t *testing.T) {
		r := dialConf(t, s.addr)
		r.send(x(t, "000000084800000003000000"))
		r.expectE(2, 3)
	})
	t.Run("1/HELLO version 255 -> E(2)", func(t *testing.T) {
		r := dialConf(t, s.addr)
		r.send(x(t, "000000084800000003ff0000"))
		r.expectE(2, 3)
	})

	// The second session rule: pipelining, out-of-order replies, req_id in flight.
	t.Run("2/replies out of order: PING answered while ACQUIRE waits", func(t *testing.T) {
		h := openConf(t, s.addr)
		h.send(acqF(t, 2, 1, 0, 30, "r2-ooo"))
		tok, _ := h.expectG(2)
		w := openConf(t, s.addr)
		w.send(acqF(t, 10, 2, 10, 30, "r2-ooo"), pingF(t, 11))
		w.expect(simpleHex('P', 11)) // PONG first, while 10 waits
		h.send(relF(t, 3, tok, "r2-ooo"))
		h.expect(simpleHex('R', 3))
		if tok2, _ := w.expectG(10); tok2 <= tok {
			t.Fatalf("token %d after %d", tok2, tok)
		}
	})
	t.Run("2/req_id of a waiting ACQUIRE reused -> E(1) with it, wait dropped", func(t *testing.T) {
		h := openConf(t, s.addr)
		h.send(acqF(t, 2, 1, 0, 30, "r2-dup"))
		tok, _ := h.expectG(2)
		w := openConf(t, s.addr)
		w.send(acqF(t, 9, 2, 30, 30, "r2-dup"))
		w.sync(8)
		w.send(pingF(t, 9))
		w.expectE(1, 9)
		s.waitStatus(t, "waiters", 0)
		h.send(relF(t, 3, tok, "r2-dup"))
		h.expect(simpleHex('R', 3))
		// The key is free: the dropped wait was not granted.
		o := openConf(t, s.addr)
		o.send(acqF(t, 2, 3, 0, 30, "r2-dup"))
		o.expectG(2)
	})
	t.Run("2/req_id of a waiting ACQUIRE reused by an ACQUIRE -> E(1)", func(t *testing.T) {
		h := openConf(t, s.addr)
		h.send(acqF(t, 2, 1, 0, 30, "r2-dup2"))
		h.expectG(2)
		w := openConf(t, s.addr)
		w.send(acqF(t, 9, 2, 30, 30, "r2-dup2"), acqF(t, 9, 3, 30, 30, "elsewhere"))
		w.expectE(1, 9)
	})
	t.Run("2/req_id reused after its reply -> fine", func(t *testing.T) {
		r := openConf(t, s.addr)
		for range 3 {
			r.send(pingF(t, 7))
			r.expect(simpleHex('P', 7))
		}
		r.send(acqF(t, 7, 1, 0, 30, "r2-reuse"))
		tok, _ := r.expectG(7)
		r.send(relF(t, 7, tok, "r2-reuse"))
		r.expect(simpleHex('R', 7))
	})

	// The third session rule (for the server): every E is followed by the close; frames sent
	// after the offending one get no reply.
	t.Run("3/frames after an E get no reply", func(t *testing.T) {
		r := openConf(t, s.addr)
		r.send(x(t, "000000055a00000006"), pingF(t, 7), pingF(t, 8))
		r.expectE(1, 6)
	})

	// The fourth session rule: a closing session drops its waits, not its grants.
	t.Run("4/closing a session drops its waits and keeps its grants", func(t *testing.T) {
		a := openConf(t, s.addr)
		a.send(acqF(t, 2, 0xa, 0, 30, "r4"))
		tokA, _ := a.expectG(2)
		b := openConf(t, s.addr)
		b.send(acqF(t, 2, 0xb, 30, 30, "r4"))
		b.sync(3)
		c := openConf(t, s.addr)
		c.send(acqF(t, 2, 0xc, 30, 30, "r4"))
		c.sync(3)
		s.waitStatus(t, "waiters", 2)
		b.nc.Close() // B's wait goes
		s.waitStatus(t, "waiters", 1)
		a.nc.Close() // A's grant stays
		s.waitStatus(t, "sessions", 1)
		d := openConf(t, s.addr)
		d.send(acqF(t, 2, 0xd, 0, 30, "r4"))
		d.expect(simpleHex('T', 2)) // still held by A's owner
		d.send(relF(t, 3, tokA, "r4"))
		d.expect(simpleHex('R', 3)) // released by exact token from another session
		tokC, _ := c.expectG(2)     // C, not B, is next
		if tokC <= tokA {
			t.Fatalf("token %d after %d", tokC, tokA)
		}
	})
	t.Run("4/an E drops the session's waits", func(t *testing.T) {
		h := openConf(t, s.addr)
		h.send(acqF(t, 2, 1, 0, 30, "r4-e"))
		tok, _ := h.expectG(2)
		w := openConf(t, s.addr)
		w.send(acqF(t, 2, 2, 30, 30, "r4-e"))
		w.sync(3)
		w.send(x(t, "00000000"))
		w.expectE(1, 0)
		s.waitStatus(t, "waiters", 0)
		h.send(relF(t, 3, tok, "r4-e"))
		h.expect(simpleHex('R', 3))
	})
}

// ---------------------------------------------------------------- version 2

// TestConformanceVersion2: the "Versioning" and "Version 2 additions"
// rules, with raw frames.
func TestConformanceVersion2(t *testing.T) {
	t.Parallel()
	s := startConf(t, "--client-token", "s3cret", withAdmin)
	hello := func(t *testing.T, version byte) *raw {
		r := dialConf(t, s.addr)
		r.send(lenPrefix(t, fmt.Sprintf("4800000001%02x0673336372657400", version)))
		r.expect(fmt.Sprintf("0000000a4f00000001%02x01026e31", version))
		return r
	}

	t.Run("vectors: HELLO v2 -> HELLO_OK v2, CANCEL, RELEASE_OWNED", func(t *testing.T) {
		t.Parallel()
		s := startConf(t)
		r := dialConf(t, s.addr)
		r.send(x(t, "000000084800000001020000"))
		r.expect("0000000a4f000000010201026e31")
		// CANCEL req 2 of nothing: no reply; the session goes on.
		r.send(x(t, "000000054300000002"))
		r.sync(9)
		// RELEASE_OWNED req 3, token 42, owner 00..0f, key "order-42": N.
		r.send(x(t, "000000265600000003000000000000002a000102030405060708090a0b0c0d0e0f086f726465722d3432"))
		r.expect(simpleHex('N', 3))
		// The ACQUIRE vector (owner 00..0f), then the RELEASE_OWNED vector
		// with that token: R.
		r.send(x(t, "000000204100000002000102030405060708090a0b0c0d0e0f051e086f726465722d3432"))
		tok, _ := r.expectG(2)
		r.send(lenPrefix(t, fmt.Sprintf("5600000003%016x000102030405060708090a0b0c0d0e0f086f726465722d3432", tok)))
		r.expect(simpleHex('R', 3))
	})
	t.Run("HELLO_OK carries the version asked for", func(t *testing.T) {
		hello(t, 1).sync(2)
		hello(t, 2).sync(2)
	})
	t.Run("v1 session: CANCEL -> E(1) with its req_id", func(t *testing.T) {
		r := hello(t, 1)
		r.send(cancelF(t, 5))
		r.expectE(1, 5)
	})
	t.Run("v1 session: CANCEL of a waiting ACQUIRE -> E(1), its wait dropped", func(t *testing.T) {
		h := hello(t, 1)
		h.send(acqF(t, 2, 1, 0, 30, "v1-cancel"))
		tok, _ := h.expectG(2)
		w := hello(t, 1)
		w.send(acqF(t, 7, 2, 30, 30, "v1-cancel"))
		w.sync(8)
		w.send(cancelF(t, 7))
		w.expectE(1, 7)
		s.waitStatus(t, "waiters", 0)
		h.send(relF(t, 3, tok, "v1-cancel"))
		h.expect(simpleHex('R', 3))
	})
	t.Run("v1 session: RELEASE_OWNED -> E(1), lock still held", func(t *testing.T) {
		r := hello(t, 1)
		r.send(acqF(t, 2, 1, 0, 30, "v1-owned"))
		tok, _ := r.expectG(2)
		r.send(relOwnedF(t, 3, tok, 1, "v1-owned"))
		r.expectE(1, 3)
		o := hello(t, 1)
		o.send(acqF(t, 2, 9, 0, 30, "v1-owned"))
		o.expect(simpleHex('T', 2))
		o.send(relF(t, 3, tok, "v1-owned"))
		o.expect(simpleHex('R', 3))
	})
	t.Run("v2 session: CANCEL of a queued ACQUIRE -> T at once, the queue order intact", func(t *testing.T) {
		h := hello(t, 2)
		h.send(acqF(t, 2, 1, 0, 30, "v2-queue"))
		tok, _ := h.expectG(2)
		w := hello(t, 2)
		x2 := hello(t, 2)
		w.send(acqF(t, 10, 0xa, 30, 30, "v2-queue"))
		w.sync(99)
		x2.send(acqF(t, 20, 0xb, 30, 30, "v2-queue"))
		x2.sync(99)
		w.send(acqF(t, 11, 0xc, 30, 30, "v2-queue"))
		w.sync(98)
		s.waitStatus(t, "waiters", 3)
		before := s.status(t)
		w.send(cancelF(t, 10))
		w.expect(simpleHex('T', 10))
		s.waitStatus(t, "waiters", 2)
		after := s.status(t)
		if after["cancelled"] != before["cancelled"]+1 || after["timed_out"] != before["timed_out"]+1 {
			t.Fatalf("cancelled %v -> %v, timed_out %v -> %v", before["cancelled"], after["cancelled"], before["timed_out"], after["timed_out"])
		}
		if after["held_locks"] != before["held_locks"] || after["grants"] != before["grants"] {
			t.Fatalf("a CANCEL touched the lock table: %v -> %v", before, after)
		}
		// Still held by h; a second CANCEL of the answered req_id does nothing.
		w.send(cancelF(t, 10))
		w.sync(97)
		o := hello(t, 2)
		o.send(acqF(t, 2, 0xd, 0, 30, "v2-queue"))
		o.expect(simpleHex('T', 2))
		// The req_id answered T may be used again.
		w.send(pingF(t, 10))
		w.expect(simpleHex('P', 10))
		// Release: x2 (queued second) is next, then w's 11.
		h.send(relF(t, 3, tok, "v2-queue"))
		h.expect(simpleHex('R', 3))
		tokX, _ := x2.expectG(20)
		if tokX <= tok {
			t.Fatalf("token %d after %d", tokX, tok)
		}
		x2.send(relOwnedF(t, 21, tokX, 0xb, "v2-queue"))
		x2.expect(simpleHex('R', 21))
		tokW, _ := w.expectG(11)
		if tokW <= tokX {
			t.Fatalf("token %d after %d", tokW, tokX)
		}
		w.send(relOwnedF(t, 12, tokW, 0xc, "v2-queue"))
		w.expect(simpleHex('R', 12))
	})
	t.Run("v2 session: CANCEL of a granted ACQUIRE -> nothing, lock still held", func(t *testing.T) {
		r := hello(t, 2)
		r.send(acqF(t, 2, 1, 0, 30, "v2-granted"))
		tok, _ := r.expectG(2)
		r.send(cancelF(t, 2))
		r.sync(3) // PONG is the next frame: no reply to the CANCEL
		o := hello(t, 2)
		o.send(acqF(t, 2, 9, 0, 30, "v2-granted"))
		o.expect(simpleHex('T', 2))
		// The holder's retry still gets the same token.
		r.send(acqF(t, 4, 1, 0, 30, "v2-granted"))
		r.expectGExact(4, tok, 0)
		r.send(relOwnedF(t, 5, tok, 1, "v2-granted"))
		r.expect(simpleHex('R', 5))
	})
	t.Run("v2 session: CANCEL of a waiter granted before it -> G, lock held", func(t *testing.T) {
		h := hello(t, 2)
		h.send(acqF(t, 2, 1, 0, 30, "v2-late"))
		tok, _ := h.expectG(2)
		w := hello(t, 2)
		w.send(acqF(t, 7, 2, 30, 30, "v2-late"))
		w.sync(8)
		h.send(relF(t, 3, tok, "v2-late"))
		h.expect(simpleHex('R', 3))
		tokW, _ := w.expectG(7)
		w.send(cancelF(t, 7))
		w.sync(9)
		o := hello(t, 2)
		o.send(acqF(t, 2, 9, 0, 30, "v2-late"))
		o.expect(simpleHex('T', 2))
		w.send(relOwnedF(t, 10, tokW, 2, "v2-late"))
		w.expect(simpleHex('R', 10))
	})
	t.Run("v2 session: CANCEL of an unknown req_id -> nothing, session alive", func(t *testing.T) {
		r := hello(t, 2)
		r.send(cancelF(t, 12345), cancelF(t, 0), cancelF(t, 1))
		r.sync(2)
		r.send(acqF(t, 3, 1, 0, 30, "v2-unknown"))
		tok, _ := r.expectG(3)
		r.send(relOwnedF(t, 4, tok, 1, "v2-unknown"))
		r.expect(simpleHex('R', 4))
	})
	t.Run("v2 session: CANCEL of a PING's req_id -> nothing", func(t *testing.T) {
		r := hello(t, 2)
		r.send(pingF(t, 5), cancelF(t, 5))
		r.expect(simpleHex('P', 5))
		r.sync(6)
	})
	t.Run("v2 session: CANCEL frame with a trailing byte -> E(1)", func(t *testing.T) {
		r := hello(t, 2)
		r.send(x(t, "00000006430000000200"))
		r.expectE(1, 2)
	})
	t.Run("v2 session: a reused req_id that is not a CANCEL is still E(1)", func(t *testing.T) {
		h := hello(t, 2)
		h.send(acqF(t, 2, 1, 0, 30, "v2-dup"))
		h.expectG(2)
		w := hello(t, 2)
		w.send(acqF(t, 7, 2, 30, 30, "v2-dup"), pingF(t, 7))
		w.expectE(1, 7)
	})
	t.Run("v2 session: RELEASE_OWNED checks token and owner", func(t *testing.T) {
		r := hello(t, 2)
		r.send(acqF(t, 2, 1, 0, 30, "v2-owned"))
		tok, _ := r.expectG(2)
		o := hello(t, 2)
		o.send(relOwnedF(t, 3, tok, 9, "v2-owned")) // right token, wrong owner
		o.expect(simpleHex('N', 3))
		o.send(relOwnedF(t, 4, tok+1, 1, "v2-owned")) // right owner, wrong token
		o.expect(simpleHex('N', 4))
		o.send(relOwnedF(t, 5, tok, 1, "v2-other")) // another key
		o.expect(simpleHex('N', 5))
		o.send(acqF(t, 6, 9, 0, 30, "v2-owned"))
		o.expect(simpleHex('T', 6)) // still held
		// Right token and owner, from another session: R, then N.
		o.send(relOwnedF(t, 7, tok, 1, "v2-owned"))
		o.expect(simpleHex('R', 7))
		r.send(relOwnedF(t, 8, tok, 1, "v2-owned"))
		r.expect(simpleHex('N', 8))
	})
	t.Run("v2 session: RELEASE_OWNED key_len 0 -> E(4)", func(t *testing.T) {
		r := hello(t, 2)
		r.send(relOwnedF(t, 3, 1, 1, ""))
		r.expectE(4, 3)
	})
	t.Run("v2 session: RELEASE_OWNED key_len past the end -> E(1)", func(t *testing.T) {
		r := hello(t, 2)
		r.send(lenPrefix(t, "5600000003"+"0000000000000001"+ownerHex(1)+"05"+"61"))
		r.expectE(1, 3)
	})
	t.Run("v2 session: plain RELEASE still works by token alone", func(t *testing.T) {
		r := hello(t, 2)
		r.send(acqF(t, 2, 1, 0, 30, "v2-plain"))
		tok, _ := r.expectG(2)
		o := hello(t, 2)
		o.send(relF(t, 3, tok, "v2-plain"))
		o.expect(simpleHex('R', 3))
	})
}

// TestConformanceOwnedReleaseOnly: serve --owned-release-only (a project
// choice beyond the protocol, off by default). With it, a lock granted on a
// version-2 session survives plain RELEASEs guessing 1000 tokens around
// its own (from version-1 and version-2 sessions) and its holder's own U with the
// right token (N, still held); its holder's RELEASE_OWNED gives R. A lock
// granted on a version-1 session is freed by U as before. Without it, U
// frees a version-2 holder's lock, as the protocol says.
func TestConformanceOwnedReleaseOnly(t *testing.T) {
	// flood sends U for key with the n tokens around (from around-n/2 on:
	// the holder's token among them) in one write and returns how many
	// were answered R (every other reply must be N).
	flood := func(t *testing.T, r *raw, key string, around uint64, n int) int {
		var b [][]byte
		from := around - uint64(n/2)
		for i := 1; i <= n; i++ {
			b = append(b, relF(t, uint32(i), from+uint64(i-1), key))
		}
		r.send(b...)
		freed := 0
		for tok := 1; tok <= n; tok++ {
			switch f := hex.EncodeToString(r.next()); f {
			case simpleHex('R', uint32(tok)):
				freed++
			case simpleHex('N', uint32(tok)):
			default:
				t.Fatalf("guess %d: got frame %s, want R or N", tok, f)
			}
		}
		return freed
	}
	held := func(t *testing.T, r *raw, key string) {
		r.send(acqF(t, 900, 0x99, 0, 30, key))
		r.expect(simpleHex('T', 900))
	}

	t.Run("with --owned-release-only", func(t *testing.T) {
		c := startConf(t, "--owned-release-only")
		v2 := openConfV2(t, c.addr)
		v1 := openConf(t, c.addr)
		atk1, atk2, other := openConf(t, c.addr), openConfV2(t, c.addr), openConf(t, c.addr)

		v2.send(acqF(t, 2, 1, 0, 30, "owned"))
		tok, _ := v2.expectG(2)
		if n := flood(t, atk1, "owned", tok, 1000); n != 0 {
			t.Fatalf("U guesses from a v1 session freed the v2 holder's lock (%d R)", n)
		}
		if n := flood(t, atk2, "owned", tok, 1000); n != 0 {
			t.Fatalf("U guesses from a v2 session freed the v2 holder's lock (%d R)", n)
		}
		v2.send(relF(t, 3, tok, "owned"))
		v2.expect(simpleHex('N', 3))
		held(t, other, "owned")
		v2.send(relOwnedF(t, 4, tok, 2, "owned")) // wrong owner
		v2.expect(simpleHex('N', 4))
		held(t, other, "owned")

		// Handed to a v2 waiter by the holder's V: protected as well.
		w2 := openConfV2(t, c.addr)
		w2.send(acqF(t, 10, 0xa, 30, 30, "owned"))
		w2.sync(11)
		v2.send(relOwnedF(t, 5, tok, 1, "owned"))
		v2.expect(simpleHex('R', 5))
		tokW, _ := w2.expectG(10)
		if n := flood(t, atk1, "owned", tokW, 1000); n != 0 {
			t.Fatalf("U guesses freed the v2 waiter's lock (%d R)", n)
		}
		held(t, other, "owned")

		// Handed to a v1 waiter: released by U, as in version 1.
		v1.send(acqF(t, 20, 0xb, 30, 30, "owned"))
		v1.sync(21)
		w2.send(relOwnedF(t, 12, tokW, 0xa, "owned"))
		w2.expect(simpleHex('R', 12))
		tok1, _ := v1.expectG(20)
		v1.send(relF(t, 22, tok1, "owned"))
		v1.expect(simpleHex('R', 22))

		// A v1 holder: a guess frees it (the protocol's rule for v1).
		v1.send(acqF(t, 23, 0xb, 0, 30, "v1-held"))
		tokV1, _ := v1.expectG(23)
		if n := flood(t, atk2, "v1-held", tokV1, 1000); n != 1 {
			t.Fatalf("U guesses freed a v1 holder's lock %d times, want 1", n)
		}
	})

	t.Run("default: U frees a v2 holder's lock (the protocol)", func(t *testing.T) {
		c := startConf(t)
		v2 := openConfV2(t, c.addr)
		atk := openConf(t, c.addr)
		v2.send(acqF(t, 2, 1, 0, 30, "owned"))
		tok0, _ := v2.expectG(2)
		if n := flood(t, atk, "owned", tok0, 1000); n != 1 {
			t.Fatalf("U guesses freed the v2 holder's lock %d times, want 1", n)
		}
		v2.send(acqF(t, 3, 1, 0, 30, "owned"))
		tok, _ := v2.expectG(3)
		v2.send(relF(t, 4, tok, "owned"))
		v2.expect(simpleHex('R', 4))
	})
}

// TestConformanceHelloCheckOrder: version, then exact length, then token,
// then the session limit.
func TestConformanceHelloCheckOrder(t *testing.T) {
	t.Parallel()
	s := startConf(t, "--client-token", "s3cret", "--max-sessions", "1", withAdmin)
	hold := dialConf(t, s.addr)
	hold.send(x(t, "000000114800000001010673336372657403617070")) // s3cret
	hold.expect(helloOKHex(1))

	for _, tc := range []struct {
		name  string
		frame string
		code  uint16
	}{
		// version 4, token "nope", then 3 stray bytes: E(2) although the
		// length is wrong too.
		{"version 4 and wrong length -> E(2)", "0000000f" + "4800000007" + "04" + "046e6f7065" + "00" + "010203", 2},
		{"version 4 and nothing after it -> E(2)", "00000006" + "4800000007" + "04", 2},
		{"version 3, wrong length, bad token -> E(1)", "0000000f" + "4800000007" + "03" + "046e6f7065" + "00" + "010203", 1},
		{"version 2, wrong length, bad token -> E(1)", "0000000f" + "4800000007" + "02" + "046e6f7065" + "00" + "010203", 1},
		{"version 2 and nothing after it -> E(1)", "00000006" + "4800000007" + "02", 1},
		{"version 2, bad token at the session limit -> E(3)", "0000000c" + "4800000007" + "02" + "046e6f7065" + "00", 3},
		{"version 2, good token at the session limit -> E(7)", "0000000e" + "4800000007" + "02" + "06733363726574" + "00", 7},
		{"version 1, wrong length, bad token -> E(1)", "0000000f" + "4800000007" + "01" + "046e6f7065" + "00" + "010203", 1},
		{"version 1, token_len past the end -> E(1)", "00000008" + "4800000007" + "01" + "09" + "00", 1},
		{"bad token at the session limit -> E(3)", "0000000c" + "4800000007" + "01" + "046e6f7065" + "00", 3},
		{"no token at the session limit -> E(3)", "00000008" + "4800000007" + "01" + "00" + "00", 3},
		{"good token at the session limit -> E(7)", "0000000e" + "4800000007" + "01" + "06733363726574" + "00", 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := dialConf(t, s.addr)
			r.send(x(t, tc.frame))
			r.expectE(tc.code, 7)
		})
	}
	t.Run("a slot freed by a closed session is usable", func(t *testing.T) {
		hold.nc.Close()
		s.waitStatus(t, "sessions", 0)
		r := dialConf(t, s.addr)
		r.send(x(t, "000000114800000009010673336372657403617070"))
		r.expect(helloOKHex(9))
	})
}

// TestConformanceSessionLimit: E(7) with the HELLO's req_id at the limit.
func TestConformanceSessionLimit(t *testing.T) {
	t.Parallel()
	s := startConf(t, "--max-sessions", "3", withAdmin)
	var open []*raw
	for range 3 {
		open = append(open, openConf(t, s.addr))
	}
	r := dialConf(t, s.addr)
	r.send(x(t, "000000084800000063010000")) // HELLO req 99
	r.expectE(7, 99)
	// Connections before HELLO do not count; the sessions still work.
	for i, o := range open {
		o.sync(uint32(100 + i))
	}
	open[0].nc.Close()
	s.waitStatus(t, "sessions", 2)
	openConf(t, s.addr)
}

// TestConformanceDefaultSessionLimit: the default limit is 10,000 sessions;
// the server holds them all (2,500 from each of four addresses, the default
// per-address limit) and refuses the next with E(7).
func TestConformanceDefaultSessionLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("opens 10,001 connections")
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur < 10_100 {
		t.Skipf("RLIMIT_NOFILE %d is too low for 10,000 sessions", lim.Cur)
	}
	t.Parallel()
	s := startConf(t)
	hello := x(t, "000000084800000001010000")
	want := x(t, helloOKHex(1))
	conns := make([]net.Conn, 0, 10_000)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	for w := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < 10_000; i += 50 {
				// From four loopback addresses: one address may hold a
				// quarter of the sessions (--max-sessions-per-peer).
				d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(1+i%4))}}
				c, err := d.Dial("tcp", s.addr)
				if err != nil {
					select {
					case errs <- err:
					default:
					}
					return
				}
				mu.Lock()
				conns = append(conns, c)
				mu.Unlock()
				c.SetDeadline(time.Now().Add(20 * time.Second))
				got := make([]byte, len(want))
				if _, err := c.Write(hello); err == nil {
					_, err = io.ReadFull(c, got)
				}
				if err != nil || !bytes.Equal(got, want) {
					select {
					case errs <- fmt.Errorf("session %d: %x %v", i, got, err):
					default:
					}
					return
				}
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	r := dialConf(t, s.addr)
	r.send(x(t, "000000084800000002010000"))
	r.expectE(7, 2)
	// An established session among the 10,000 still answers.
	c := conns[len(conns)/2]
	c.Write(pingF(t, 5))
	got := make([]byte, 9)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, got); err != nil || hex.EncodeToString(got) != simpleHex('P', 5) {
		t.Fatalf("PING on the 5000th session: %x %v", got, err)
	}
}

// TestConformanceHelloTimeout: a connection that does not complete HELLO
// within 5 s is closed (after E(1) req 0); slow bytes do not extend it.
func TestConformanceHelloTimeout(t *testing.T) {
	t.Parallel()
	s := startConf(t)
	check := func(t *testing.T, r *raw, start time.Time) {
		t.Helper()
		f, err := r.frame(10 * time.Second)
		el := time.Since(start)
		if err != nil {
			t.Fatalf("after %v: %v, want E(1) req 0", el, err)
		}
		checkE(t, f, 1, 0)
		r.expectEOF()
		if el < 4500*time.Millisecond || el > 8*time.Second {
			t.Fatalf("closed after %v, want about 5 s", el)
		}
	}
	t.Run("silent", func(t *testing.T) {
		t.Parallel()
		r := dialConf(t, s.addr)
		check(t, r, time.Now())
	})
	t.Run("half a HELLO, then silence", func(t *testing.T) {
		t.Parallel()
		r := dialConf(t, s.addr)
		start := time.Now()
		r.send(x(t, "0000000848000000")) // 4 of 8 body bytes
		check(t, r, start)
	})
	t.Run("slowloris: one byte a second", func(t *testing.T) {
		t.Parallel()
		r := dialConf(t, s.addr)
		start := time.Now()
		frame := x(t, "000000084800000001010000")
		go func() {
			for _, b := range frame {
				if _, err := r.nc.Write([]byte{b}); err != nil {
					return
				}
				time.Sleep(time.Second)
			}
		}()
		check(t, r, start)
	})
	t.Run("HELLO at 4 s is in time", func(t *testing.T) {
		t.Parallel()
		r := dialConf(t, s.addr)
		time.Sleep(4 * time.Second)
		r.send(x(t, "000000084800000001010000"))
		r.expect(helloOKHex(1))
		// No timeout once the session is open: idle for 2 s more, then PING.
		time.Sleep(2 * time.Second)
		r.sync(2)
	})
}

// ---------------------------------------------------------------- framing

func TestConformanceFraming(t *testing.T) {
	t.Parallel()
	s := startConf(t)
	for _, tc := range []struct {
		name, frames string
		req          uint32
	}{
		{"length 0 before HELLO", "00000000", 0},
		{"length 1025 before HELLO", "00000401", 0},
		{"length 0xffffffff before HELLO", "ffffffff", 0},
		{"length 0 after HELLO", "00000000", 0},
		{"length 1025 after HELLO (body never sent)", "00000401", 0},
		{"length 1025 after HELLO, with a PING-like body", "00000401" + "5000000009" + strings.Repeat("00", 1020), 0},
		{"one-byte body", "0000000150", 0},
		{"four-byte body", "00000004" + "50000000", 0},
		{"unknown type", "00000005" + "7a0000000c", 12},
		{"lower-case a", "00000005" + "610000000c", 12},
		{"server type O from the client", "00000005" + "4f0000000c", 12},
		{"PING with a trailing byte", "00000006" + "500000000c" + "00", 12},
		{"PING of 1024 bytes", "00000400" + "500000000c" + strings.Repeat("00", 1019), 12},
		{"ACQUIRE key_len past the end", "0000001b" + "410000000c" + ownerHex(1) + "051e" + "05" + "6b6b6b", 12},
		{"ACQUIRE with a trailing byte", "0000001a" + "410000000c" + ownerHex(1) + "051e" + "01" + "6b" + "00", 12},
		{"ACQUIRE without key_len", "00000017" + "410000000c" + ownerHex(1) + "051e", 12},
		{"RELEASE too short", "0000000c" + "550000000c" + "00000000000000", 12},
		{"RELEASE key_len past the end", "0000000f" + "550000000c" + "0000000000000001" + "02" + "6b", 12},
		{"RELEASE with a trailing byte", "00000010" + "550000000c" + "0000000000000001" + "00" + "6b" + "6b", 12},
	} {
		t.Run(tc.name+" -> E(1) and close", func(t *testing.T) {
			t.Parallel()
			var r *raw
			if strings.Contains(tc.name, "before HELLO") {
				r = dialConf(t, s.addr)
			} else {
				r = openConf(t, s.addr)
			}
			r.send(x(t, tc.frames))
			r.expectE(1, tc.req)
		})
	}

	t.Run("a frame written byte by byte", func(t *testing.T) {
		t.Parallel()
		r := dialConf(t, s.addr)
		if tc, ok := r.nc.(*net.TCPConn); ok {
			tc.SetNoDelay(true)
		}
		trickle := func(b []byte) {
			for i := range b {
				r.send(b[i : i+1])
				time.Sleep(2 * time.Millisecond)
			}
		}
		trickle(x(t, "000000084800000001010000"))
		r.expect(helloOKHex(1))
		trickle(acqF(t, 2, 1, 0, 30, "bytewise"))
		tok, _ := r.expectG(2)
		trickle(pingF(t, 3))
		r.expect(simpleHex('P', 3))
		trickle(relF(t, 4, tok, "bytewise"))
		r.expect(simpleHex('R', 4))
	})

	t.Run("many frames in one write", func(t *testing.T) {
		t.Parallel()
		r := dialConf(t, s.addr)
		var b [][]byte
		b = append(b, x(t, "000000084800000001010000"), acqF(t, 2, 1, 0, 30, "batched"))
		for i := range 200 {
			b = append(b, pingF(t, uint32(100+i)))
		}
		b = append(b, relF(t, 3, 999, "batched"), acqF(t, 4, 1, 0, 30, "batched"))
		r.send(b...)
		r.expect(helloOKHex(1))
		tok, _ := r.expectG(2)
		for i := range 200 {
			r.expect(simpleHex('P', uint32(100+i)))
		}
		r.expect(simpleHex('N', 3))
		r.expectGExact(4, tok, 0) // the holder's retry
	})

	t.Run("HELLO and requests in one write", func(t *testing.T) {
		t.Parallel()
		r := dialConf(t, s.addr)
		r.send(x(t, "000000084800000001010000"), pingF(t, 2))
		r.expect(helloOKHex(1))
		r.expect(simpleHex('P', 2))
	})

	t.Run("half a frame after HELLO is waited for (no timeout after HELLO)", func(t *testing.T) {
		t.Parallel()
		r := openConf(t, s.addr)
		f := pingF(t, 2)
		r.send(f[:6])
		r.expectSilence(6 * time.Second) // past the 5 s HELLO timeout
		r.send(f[6:])
		r.expect(simpleHex('P', 2))
	})
}

// ---------------------------------------------------------------- E(4)

func TestConformanceInvalidArgument(t *testing.T) {
	t.Parallel()
	s := startConf(t)
	for _, tc := range []struct {
		name, body string
	}{
		{"ACQUIRE key_len 0", "4100000021" + ownerHex(1) + "051e" + "00"},
		{"ACQUIRE lease 0", "4100000021" + ownerHex(1) + "0500" + "01" + "6b"},
		{"ACQUIRE lease 251", "4100000021" + ownerHex(1) + "05fb" + "01" + "6b"},
		{"ACQUIRE lease 255", "4100000021" + ownerHex(1) + "05ff" + "01" + "6b"},
		{"ACQUIRE lease 0 and key_len 0", "4100000021" + ownerHex(1) + "0000" + "00"},
		{"RELEASE key_len 0", "5500000021" + "0000000000000001" + "00"},
	} {
		t.Run(tc.name+" -> E(4) with the req_id", func(t *testing.T) {
			t.Parallel()
			r := openConf(t, s.addr)
			r.send(lenPrefix(t, tc.body))
			r.expectE(4, 0x21)
		})
	}
	t.Run("boundaries are valid: lease 1 and 250, wait 255, key of 255 bytes", func(t *testing.T) {
		t.Parallel()
		r := openConf(t, s.addr)
		key := strings.Repeat("k", 255)
		r.send(acqF(t, 2, 1, 255, 250, key))
		tok, _ := r.expectG(2)
		r.send(relF(t, 3, tok, key))
		r.expect(simpleHex('R', 3))
		r.send(acqF(t, 4, 1, 0, 1, "lease-one"))
		r.expectG(4)
		r.send(relF(t, 5, 0, "never-held")) // token 0 is well formed
		r.expect(simpleHex('N', 5))
	})
}

// ---------------------------------------------------------------- locks

// TestConformanceLockSemantics: one subtest per rule of "Lock semantics".
func TestConformanceLockSemantics(t *testing.T) {
	t.Parallel()
	s := startConf(t, withAdmin)

	t.Run("tokens start at 1 and increase across all keys", func(t *testing.T) {
		// First: on a fresh server, no other subtest has run yet.
		r := openConf(t, s.addr)
		r.send(acqF(t, 2, 1, 0, 30, "tok-a"))
		r.expectGExact(2, 1, 0)
		r.send(acqF(t, 3, 1, 0, 30, "tok-b"))
		r.expectGExact(3, 2, 0)
		r.send(relF(t, 4, 1, "tok-a"))
		r.expect(simpleHex('R', 4))
		r.send(acqF(t, 5, 2, 0, 30, "tok-a"))
		r.expectGExact(5, 3, 0)
		o := openConf(t, s.addr)
		o.send(acqF(t, 2, 3, 0, 30, "tok-c"))
		o.expectGExact(2, 4, 0)
	})
	t.Run("keys are opaque bytes", func(t *testing.T) {
		r := openConf(t, s.addr)
		r.send(lenPrefix(t, "4100000002"+ownerHex(1)+"001e"+"03"+"00ff0a"))
		tok, _ := r.expectG(2)
		r.send(lenPrefix(t, fmt.Sprintf("5500000003%016x03%s", tok, "00ff0b"))) // a different key
		r.expect(simpleHex('N', 3))
		r.send(lenPrefix(t, fmt.Sprintf("5500000004%016x03%s", tok, "00ff0a")))
		r.expect(simpleHex('R', 4))
	})
	t.Run("free key: G at once", func(t *testing.T) {
		r := openConf(t, s.addr)
		r.send(acqF(t, 2, 1, 200, 30, "free"))
		if _, w := r.expectG(2); w > 50 {
			t.Fatalf("waited_ms %d on a free key", w)
		}
	})
	t.Run("holder's retry: same token, waited_ms 0, lease not extended", func(t *testing.T) {
		r := openConf(t, s.addr)
		t0 := time.Now()
		r.send(acqF(t, 2, 7, 0, 1, "idem"))
		tok, _ := r.expectG(2)
		time.Sleep(500 * time.Millisecond)
		r.send(acqF(t, 3, 7, 0, 250, "idem")) // other wait, other lease
		r.expectGExact(3, tok, 0)
		r.send(acqF(t, 4, 7, 9, 30, "idem"))
		r.expectGExact(4, tok, 0)
		// Had the lease been extended, this would time out after 5 s.
		o := openConf(t, s.addr)
		o.send(acqF(t, 2, 8, 5, 30, "idem"))
		tok2, _ := o.expectG(2)
		if el := time.Since(t0); el > 1500*time.Millisecond {
			t.Fatalf("granted to the next owner %v after the first grant, want about 1 s (lease 1 s, not extended)", el)
		}
		if tok2 <= tok {
			t.Fatalf("token %d after %d", tok2, tok)
		}
	})
	t.Run("held key, wait 0: T at once, never queued", func(t *testing.T) {
		h := openConf(t, s.addr)
		h.send(acqF(t, 2, 1, 0, 30, "w0"))
		tok, _ := h.expectG(2)
		r := openConf(t, s.addr)
		r.send(acqF(t, 2, 2, 0, 30, "w0"))
		r.expect(simpleHex('T', 2))
		s.waitStatus(t, "waiters", 0)
		h.send(relF(t, 3, tok, "w0"))
		h.expect(simpleHex('R', 3))
		r.expectSilence(200 * time.Millisecond) // not granted later
	})
	t.Run("held key, wait > 0: FIFO", func(t *testing.T) {
		h := openConf(t, s.addr)
		h.send(acqF(t, 2, 1, 0, 30, "fifo"))
		prev, _ := h.expectG(2)
		var ws []*raw
		for i := range 4 {
			w := openConf(t, s.addr)
			w.send(acqF(t, uint32(10+i), byte(10+i), 30, 30, "fifo"))
			w.sync(99)
			ws = append(ws, w)
		}
		holder, holderTok := h, prev
		for i, w := range ws {
			holder.send(relF(t, 50, holderTok, "fifo"))
			holder.expect(simpleHex('R', 50))
			tok, _ := w.expectG(uint32(10 + i))
			if tok <= prev {
				t.Fatalf("token %d after %d", tok, prev)
			}
			for _, later := range ws[i+1:] {
				later.expectSilence(20 * time.Millisecond)
			}
			holder, holderTok, prev = w, tok, tok
		}
	})
	t.Run("wait_s passes: T", func(t *testing.T) {
		h := openConf(t, s.addr)
		h.send(acqF(t, 2, 1, 0, 30, "wait1"))
		h.expectG(2)
		r := openConf(t, s.addr)
		start := time.Now()
		r.send(acqF(t, 2, 2, 1, 30, "wait1"))
		r.expect(simpleHex('T', 2))
		if el := time.Since(start); el < time.Second || el > 3*time.Second {
			t.Fatalf("T after %v, want 1 s", el)
		}
		s.waitStatus(t, "waiters", 0)
	})
	t.Run("lease expiry grants the next waiter (pushed)", func(t *testing.T) {
		h := openConf(t, s.addr)
		t0 := time.Now()
		h.send(acqF(t, 2, 1, 0, 1, "expire"))
		tok, _ := h.expectG(2)
		w := openConf(t, s.addr)
		start := time.Now()
		w.send(acqF(t, 2, 2, 10, 30, "expire"))
		f, err := w.frame(5 * time.Second) // no further request is sent
		el := time.Since(start)
		if err != nil {
			t.Fatal(err)
		}
		tok2, waited := parseG(t, f, 2)
		if tok2 <= tok {
			t.Fatalf("token %d after %d", tok2, tok)
		}
		if time.Since(t0) < time.Second {
			t.Fatalf("granted %v after the first grant, before its 1 s lease ended", time.Since(t0))
		}
		if float64(waited) > float64(el)/float64(time.Millisecond) || waited < 500 {
			t.Fatalf("waited_ms %d, client saw %v", waited, el)
		}
		// The old holder's token is dead.
		h.send(relF(t, 3, tok, "expire"))
		h.expect(simpleHex('N', 3))
	})
	t.Run("at or after the lease end: RELEASE N, ACQUIRE sees the key free", func(t *testing.T) {
		h := openConf(t, s.addr)
		h.send(acqF(t, 2, 1, 0, 1, "lapsed"))
		tok, _ := h.expectG(2)
		time.Sleep(1050 * time.Millisecond)
		h.send(relF(t, 3, tok, "lapsed"))
		h.expect(simpleHex('N', 3))
		h.send(acqF(t, 4, 1, 0, 1, "lapsed2"))
		tok2, _ := h.expectG(4)
		time.Sleep(1050 * time.Millisecond)
		o := openConf(t, s.addr)
		o.send(acqF(t, 2, 2, 0, 30, "lapsed2"))
		if tok3, w := o.expectG(2); tok3 <= tok2 || w != 0 {
			t.Fatalf("G token %d waited %d after lease end of token %d", tok3, w, tok2)
		}
	})
	t.Run("waited_ms is rounded down", func(t *testing.T) {
		// The server's waited_ms can never exceed the time the client saw
		// between starting to write the ACQUIRE and reading the G; rounding
		// up would exceed it whenever the two are within 1 ms.
		h := openConf(t, s.addr)
		w := openConf(t, s.addr)
		for i := range 20 {
			key := fmt.Sprintf("round-%d", i)
			h.send(acqF(t, 2, 1, 0, 30, key))
			tok, _ := h.expectG(2)
			start := time.Now()
			w.send(acqF(t, 3, 2, 5, 30, key))
			w.sync(4) // queued
			time.Sleep(time.Duration(i) * 300 * time.Microsecond)
			h.send(relF(t, 5, tok, key))
			h.expect(simpleHex('R', 5))
			_, waited := w.expectG(3)
			el := time.Since(start)
			if int64(waited) > el.Milliseconds() {
				t.Fatalf("waited_ms %d > %v seen by the client", waited, el)
			}
		}
	})
	t.Run("RELEASE: R for the exact current token, from any session; else N", func(t *testing.T) {
		h := openConf(t, s.addr)
		h.send(acqF(t, 2, 1, 0, 30, "rel"))
		tok, _ := h.expectG(2)
		o := openConf(t, s.addr)
		o.send(relF(t, 2, tok+1, "rel"))
		o.expect(simpleHex('N', 2))
		o.send(relF(t, 3, tok-1, "rel"))
		o.expect(simpleHex('N', 3))
		o.send(relF(t, 4, tok, "rel-other-key"))
		o.expect(simpleHex('N', 4))
		o.send(relF(t, 5, tok, "rel"))
		o.expect(simpleHex('R', 5))
		h.send(relF(t, 3, tok, "rel"))
		h.expect(simpleHex('N', 3)) // already released
	})
	t.Run("PING gets PONG at once while ACQUIREs wait", func(t *testing.T) {
		h := openConf(t, s.addr)
		h.send(acqF(t, 2, 1, 0, 30, "pingwait"))
		h.expectG(2)
		w := openConf(t, s.addr)
		w.send(acqF(t, 2, 2, 30, 30, "pingwait"), acqF(t, 3, 3, 30, 30, "pingwait"))
		for i := range 5 {
			start := time.Now()
			w.send(pingF(t, uint32(10+i)))
			w.expect(simpleHex('P', uint32(10+i)))
			if el := time.Since(start); el > 500*time.Millisecond {
				t.Fatalf("PONG after %v", el)
			}
		}
	})
}

// TestConformanceCapacity: B at a limit, at once; the holder's retry (G)
// and wait 0 on a held key (T) are exempt.
func TestConformanceCapacity(t *testing.T) {
	t.Parallel()
	t.Run("held locks", func(t *testing.T) {
		t.Parallel()
		s := startConf(t, "--max-locks", "1", "--max-key-waiters", "1")
		a := openConf(t, s.addr)
		a.send(acqF(t, 2, 1, 0, 30, "a"))
		tok, _ := a.expectG(2)
		start := time.Now()
		a.send(acqF(t, 3, 1, 30, 30, "b")) // would add a held lock
		a.expect(simpleHex('B', 3))
		if el := time.Since(start); el > time.Second {
			t.Fatalf("B after %v, want at once", el)
		}
		a.send(acqF(t, 4, 1, 30, 30, "a")) // holder's retry
		a.expectGExact(4, tok, 0)
		o := openConf(t, s.addr)
		o.send(acqF(t, 2, 2, 0, 30, "a")) // wait 0 on a held key
		o.expect(simpleHex('T', 2))
		o.send(acqF(t, 3, 2, 30, 30, "a")) // a waiter: allowed
		o.sync(4)
		p := openConf(t, s.addr)
		p.send(acqF(t, 2, 3, 30, 30, "a")) // a second waiter on "a"
		p.expect(simpleHex('B', 2))
		// Exemptions hold at every limit at once.
		a.send(acqF(t, 5, 1, 0, 30, "a"))
		a.expectGExact(5, tok, 0)
		p.send(acqF(t, 3, 3, 0, 30, "a"))
		p.expect(simpleHex('T', 3))
		// Releasing hands "a" to the waiter: still one held lock.
		a.send(relF(t, 6, tok, "a"))
		a.expect(simpleHex('R', 6))
		tok2, _ := o.expectG(3)
		a.send(acqF(t, 7, 1, 0, 30, "c"))
		a.expect(simpleHex('B', 7))
		o.send(relF(t, 5, tok2, "a"))
		o.expect(simpleHex('R', 5))
		a.send(acqF(t, 8, 1, 0, 30, "c"))
		a.expectG(8)
	})
	t.Run("expired locks do not count", func(t *testing.T) {
		t.Parallel()
		s := startConf(t, "--max-locks", "1")
		a := openConf(t, s.addr)
		a.send(acqF(t, 2, 1, 0, 1, "x"))
		a.expectG(2)
		time.Sleep(1050 * time.Millisecond)
		a.send(acqF(t, 3, 1, 0, 30, "y"))
		a.expectG(3)
	})
	t.Run("waiters in all queues", func(t *testing.T) {
		t.Parallel()
		s := startConf(t, "--max-waiters", "1")
		a := openConf(t, s.addr)
		a.send(acqF(t, 2, 1, 0, 30, "p"), acqF(t, 3, 1, 0, 30, "q"))
		a.expectG(2)
		tokQ, _ := a.expectG(3)
		o := openConf(t, s.addr)
		o.send(acqF(t, 2, 2, 30, 30, "p"))
		o.sync(9)
		o.send(acqF(t, 3, 2, 30, 30, "q"))
		o.expect(simpleHex('B', 3))
		o.send(acqF(t, 4, 2, 0, 30, "q"))
		o.expect(simpleHex('T', 4))
		a.send(acqF(t, 4, 1, 30, 30, "q"))
		a.expectGExact(4, tokQ, 0)
	})
}

// ---------------------------------------------------------------- robustness

// TestConformanceIsolation: what one connection does cannot break another.
func TestConformanceIsolation(t *testing.T) {
	t.Parallel()
	s := startConf(t)
	good := openConf(t, s.addr)
	good.send(acqF(t, 2, 1, 0, 30, "iso"))
	tok, _ := good.expectG(2)
	waiter := openConf(t, s.addr)
	waiter.send(acqF(t, 2, 2, 30, 30, "iso"))
	waiter.sync(3)

	t.Run("garbage from others", func(t *testing.T) {
		for i, g := range []string{"ffffffff", "00000000", "000000055a00000001", "0000000150", "00000005410000000c"} {
			r := dialConf(t, s.addr)
			r.send(x(t, g))
			f, err := r.frame(5 * time.Second)
			if err != nil || f[4] != 'E' {
				t.Fatalf("garbage %d: %x %v", i, f, err)
			}
			r = openConf(t, s.addr)
			r.send(x(t, g))
			if f, err := r.frame(5 * time.Second); err != nil || f[4] != 'E' {
				t.Fatalf("garbage %d after HELLO: %x %v", i, f, err)
			}
		}
		good.sync(10)
		waiter.sync(11)
	})

	t.Run("a peer that floods PINGs and never reads", func(t *testing.T) {
		flood := openConf(t, s.addr)
		var b []byte
		for i := range 1 << 14 {
			b = append(b, pingF(t, uint32(i))...)
		}
		floodErr := make(chan error, 1)
		go func() {
			deadline := time.Now().Add(40 * time.Second)
			for time.Now().Before(deadline) {
				flood.nc.SetWriteDeadline(deadline)
				if _, err := flood.nc.Write(b); err != nil {
					floodErr <- err
					return
				}
			}
			floodErr <- errors.New("the server kept reading a peer that never reads for 40 s")
		}()
		// Meanwhile the others are served promptly.
		for i := range 20 {
			start := time.Now()
			good.sync(uint32(100 + i))
			if el := time.Since(start); el > 500*time.Millisecond {
				t.Fatalf("PONG after %v during the flood", el)
			}
			time.Sleep(50 * time.Millisecond)
		}
		// The flooder is dropped (output bound or write timeout, 10 s).
		select {
		case err := <-floodErr:
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("flooder not dropped: %v", err)
			}
		case <-time.After(45 * time.Second):
			t.Fatal("flood writer stuck")
		}
		good.send(relF(t, 200, tok, "iso"))
		good.expect(simpleHex('R', 200))
		waiter.expectG(2)
	})
}

// TestConformanceShutdown: SIGTERM while an ACQUIRE waits: every connection
// gets E(5) req 0 and is closed; the process exits 0.
func TestConformanceShutdown(t *testing.T) {
	t.Parallel()
	s := startConf(t)
	h := openConf(t, s.addr)
	h.send(acqF(t, 2, 1, 0, 30, "sd"))
	h.expectG(2)
	w := openConf(t, s.addr)
	w.send(acqF(t, 2, 2, 30, 30, "sd"))
	w.sync(3)
	pre := dialConf(t, s.addr) // before HELLO
	half := openConf(t, s.addr)
	half.send(pingF(t, 5)[:6]) // in the middle of a frame
	time.Sleep(50 * time.Millisecond)
	if err := s.sp.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*raw{h, w, pre, half} {
		r.expectE(5, 0)
	}
	if code := s.sp.exitCode(); code != 0 {
		t.Fatalf("exit code %d; stderr:\n%s", code, s.sp.stderr.String())
	}
}

// TestServeWarnsLowFileLimit: a server whose open-file limit cannot hold
// max-sessions says so at startup (past the connection budget, the limit
// minus fd-reserve, clients are closed at accept instead of getting E(7));
// with enough, it is quiet.
func TestServeWarnsLowFileLimit(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	const msg = "open-file limit is too low for max-sessions: connections beyond the connection budget (the limit minus fd-reserve) are closed at accept, clients' too, instead of getting E(7); raise it (ulimit -n, systemd LimitNOFILE=) or lower max-sessions"
	run := func(t *testing.T, extra string) *subprocess {
		sp := startBinary(t, "/bin/sh", "-c", "ulimit -n 256 && exec "+bin+" serve --listen 127.0.0.1:0 --log-format json --data-dir "+
			filepath.Join(t.TempDir(), "data")+" "+extra)
		sp.addr(t)
		return sp
	}
	t.Run("default max-sessions", func(t *testing.T) {
		sp := run(t, "")
		rec := sp.stderr.waitJSON(t, msg, sp.done)
		if rec["nofile_limit"] != float64(256) || rec["max_sessions"] != float64(10000) {
			t.Fatalf("warning %v", rec)
		}
	})
	t.Run("max-sessions that fits", func(t *testing.T) {
		sp := run(t, "--max-sessions 50") // 50 + 64 before HELLO + 128 reserved
		if strings.Contains(sp.stderr.String(), "open-file limit") {
			t.Fatalf("warned:\n%s", sp.stderr.String())
		}
	})
	// The admin listener's connections count too: 100 sessions, 64
	// before HELLO, 128 reserved, 200 admin connections and 2x16 for
	// loopback need 524.
	t.Run("admin connections that do not fit", func(t *testing.T) {
		sp := run(t, "--max-sessions 100 --admin-listen 127.0.0.1:0 --admin-max-conns 200")
		rec := sp.stderr.waitJSON(t, msg, sp.done)
		if rec["needed"] != float64(524) {
			t.Fatalf("warning %v, want needed 524", rec)
		}
	})
}
