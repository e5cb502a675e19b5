package wire_test

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/ticketing-dev/ticketing/internal/wire"
)

func owner0f() (o [16]byte) {
	for i := range o {
		o[i] = byte(i)
	}
	return o
}

// The test vectors of the protocol (docs/protocol.md), byte for byte.
var requestVectors = []struct {
	name string
	hex  string
	req  wire.Request
}{
	{"hello token name", "000000114800000001010673336372657403617070",
		wire.Request{Type: 'H', ReqID: 1, Version: 1, AuthToken: []byte("s3cret"), Name: []byte("app")}},
	{"hello empty", "000000084800000001010000",
		wire.Request{Type: 'H', ReqID: 1, Version: 1, AuthToken: []byte{}, Name: []byte{}}},
	{"acquire", "000000204100000002000102030405060708090a0b0c0d0e0f051e086f726465722d3432",
		wire.Request{Type: 'A', ReqID: 2, Owner: owner0f(), WaitS: 5, LeaseS: 30, Key: []byte("order-42")}},
	{"release", "000000165500000003000000000000002a086f726465722d3432",
		wire.Request{Type: 'U', ReqID: 3, Token: 42, Key: []byte("order-42")}},
	{"ping", "000000055000000004", wire.Request{Type: 'P', ReqID: 4}},
}

// The version-2 test vectors of docs/protocol.md ("Version 2 additions"), byte
// for byte. They decode by the rules of version 2 only.
var requestVectorsV2 = []struct {
	name string
	hex  string
	req  wire.Request
}{
	{"hello v2 empty", "000000084800000001020000",
		wire.Request{Type: 'H', ReqID: 1, Version: 2, AuthToken: []byte{}, Name: []byte{}}},
	{"cancel", "000000054300000002", wire.Request{Type: 'C', ReqID: 2}},
	{"release_owned", "000000265600000003000000000000002a000102030405060708090a0b0c0d0e0f086f726465722d3432",
		wire.Request{Type: 'V', ReqID: 3, Token: 42, Owner: owner0f(), Key: []byte("order-42")}},
}

var responseVectorsV2 = []struct {
	name string
	hex  string
	resp wire.Response
}{
	{"hello_ok v2", "0000000a4f000000010201026e31", wire.Response{Type: 'O', ReqID: 1, Version: 2, Role: 1, Node: []byte("n1")}},
}

// The version-3 test vectors of docs/protocol.md ("Version 3 additions"),
// byte for byte. The requests decode by the rules of version 3 only.
var requestVectorsV3 = []struct {
	name string
	hex  string
	req  wire.Request
}{
	{"hello v3 empty", "000000084800000001030000",
		wire.Request{Type: 'H', ReqID: 1, Version: 3, AuthToken: []byte{}, Name: []byte{}}},
	{"extend", "000000275800000004000000000000002a000102030405060708090a0b0c0d0e0f1e086f726465722d3432",
		wire.Request{Type: 'X', ReqID: 4, Token: 42, Owner: owner0f(), LeaseS: 30, Key: []byte("order-42")}},
}

func cluster01ef() []byte { return mustHex(nil, "0123456789abcdef0123456789abcdef") }

var responseVectorsV3 = []struct {
	name string
	hex  string
	resp wire.Response
}{
	{"hello_ok v3 no cluster", "0000000b4f000000010301026e3100",
		wire.Response{Type: 'O', ReqID: 1, Version: 3, Role: 1, Node: []byte("n1"), Cluster: []byte{}}},
	{"hello_ok v3 cluster", "0000001b4f000000010303026e31100123456789abcdef0123456789abcdef",
		wire.Response{Type: 'O', ReqID: 1, Version: 3, Role: 3, Node: []byte("n1"), Cluster: cluster01ef()}},
	{"kept", "000000054b00000004", wire.Response{Type: 'K', ReqID: 4}},
}

var responseVectors = []struct {
	name string
	hex  string
	resp wire.Response
}{
	{"hello_ok", "0000000a4f000000010101026e31", wire.Response{Type: 'O', ReqID: 1, Version: 1, Role: 1, Node: []byte("n1")}},
	{"granted", "000000114700000002000000000000002a000005dc", wire.Response{Type: 'G', ReqID: 2, Token: 42, WaitedMS: 1500}},
	{"timed_out", "000000055400000002", wire.Response{Type: 'T', ReqID: 2}},
	{"busy", "000000054200000002", wire.Response{Type: 'B', ReqID: 2}},
	{"released", "000000055200000003", wire.Response{Type: 'R', ReqID: 3}},
	{"not_held", "000000054e00000003", wire.Response{Type: 'N', ReqID: 3}},
	{"not_active", "000000114d000000000b6e6f64652d623a35323235", wire.Response{Type: 'M', ReqID: 0, Hint: []byte("node-b:5225")}},
	{"error", "0000001545000000010003000c756e617574686f72697a6564", wire.Response{Type: 'E', ReqID: 1, Code: 3, Msg: []byte("unauthorized")}},
	{"pong", "000000055000000004", wire.Response{Type: 'P', ReqID: 4}},
}

// mustHex decodes s; t may be nil for a constant known to be valid.
func mustHex(t testing.TB, s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		if t == nil {
			panic(err)
		}
		t.Helper()
		t.Fatal(err)
	}
	return b
}

// checkRequestVector: req encodes to exactly the frame hexFrame, and that
// frame decodes back to req by the rules of protocol version v; it returns
// the frame.
func checkRequestVector(t *testing.T, hexFrame string, req *wire.Request, v uint8) []byte {
	t.Helper()
	want := mustHex(t, hexFrame)
	got, err := wire.AppendRequest(nil, req)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("encode = %x, want %x", got, want)
	}
	var r wire.Request
	if err := wire.DecodeRequestVersion(want[4:], &r, v); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(r, *req) {
		t.Fatalf("decode = %+v, want %+v", r, *req)
	}
	return want
}

func TestRequestVectors(t *testing.T) {
	for _, tc := range requestVectors {
		t.Run(tc.name, func(t *testing.T) {
			want := checkRequestVector(t, tc.hex, &tc.req, wire.Version1)
			// DecodeRequest is version 1.
			var r wire.Request
			if err := wire.DecodeRequest(want[4:], &r); err != nil || !reflect.DeepEqual(r, tc.req) {
				t.Fatalf("DecodeRequest = %+v, %v; want %+v", r, err, tc.req)
			}
		})
	}
}

func TestRequestVectorsV2(t *testing.T) {
	for _, tc := range requestVectorsV2 {
		t.Run(tc.name, func(t *testing.T) {
			want := checkRequestVector(t, tc.hex, &tc.req, wire.Version2)
			var r wire.Request
			// Version 1 knows none of them: a version-2 HELLO is E(2), C and
			// V on a version-1 session are E(1).
			var want1 error = wire.ErrUnknownType
			if tc.req.Type == wire.TypeHello {
				want1 = wire.ErrUnsupportedVersion
			}
			for _, dec := range []func([]byte, *wire.Request) error{
				wire.DecodeRequest,
				func(b []byte, r *wire.Request) error { return wire.DecodeRequestVersion(b, r, wire.Version1) },
			} {
				if err := dec(want[4:], &r); !errors.Is(err, want1) {
					t.Fatalf("version 1 decode: err = %v, want %v", err, want1)
				}
			}
		})
	}
	if got := wire.AppendCancel(nil, 2); hex.EncodeToString(got) != "000000054300000002" {
		t.Fatalf("AppendCancel = %x", got)
	}
}

// Every version-1 frame decodes the same by the rules of version 2, and
// an encoded frame takes another req_id with PutReqID.
func TestVersion2KeepsVersion1(t *testing.T) {
	for _, tc := range requestVectors {
		var r wire.Request
		if err := wire.DecodeRequestVersion(mustHex(t, tc.hex)[4:], &r, wire.Version2); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !reflect.DeepEqual(r, tc.req) {
			t.Fatalf("%s: decode = %+v, want %+v", tc.name, r, tc.req)
		}
	}
	// Versions outside 1..MaxVersion count as the nearest one.
	var r wire.Request
	hello2 := mustHex(t, requestVectorsV2[0].hex)[4:]
	if err := wire.DecodeRequestVersion(hello2, &r, 0); !errors.Is(err, wire.ErrUnsupportedVersion) {
		t.Fatalf("decoder version 0: %v", err)
	}
	if err := wire.DecodeRequestVersion(hello2, &r, 200); err != nil || r.Version != 2 {
		t.Fatalf("decoder version 200: %v, version %d", err, r.Version)
	}
	hello4 := mustHex(t, "4800000001040000")
	if err := wire.DecodeRequestVersion(hello4, &r, 200); !errors.Is(err, wire.ErrUnsupportedVersion) || r.Version != 4 || r.ReqID != 1 {
		t.Fatalf("HELLO version 4: %v, version %d req_id %d", err, r.Version, r.ReqID)
	}
	frame := mustHex(t, requestVectorsV2[2].hex)
	wire.PutReqID(frame, 0x01020304)
	if err := wire.DecodeRequestVersion(frame[4:], &r, 2); err != nil || r.ReqID != 0x01020304 || r.Token != 42 {
		t.Fatalf("PutReqID: %v, %+v", err, r)
	}
}

func TestRequestVectorsV3(t *testing.T) {
	for _, tc := range requestVectorsV3 {
		t.Run(tc.name, func(t *testing.T) {
			want := checkRequestVector(t, tc.hex, &tc.req, wire.Version3)
			// Versions 1 and 2 know none of them: a version-3 HELLO is
			// E(2), X on a version-1 or version-2 session is E(1) (an
			// unknown type), never E(2) or E(4).
			for _, v := range []uint8{wire.Version1, wire.Version2} {
				var r wire.Request
				err := wire.DecodeRequestVersion(want[4:], &r, v)
				switch tc.req.Type {
				case wire.TypeHello:
					if !errors.Is(err, wire.ErrUnsupportedVersion) || errors.Is(err, wire.ErrMalformed) || r.ReqID != 1 {
						t.Fatalf("version %d decode: err = %v, req_id %d; want ErrUnsupportedVersion", v, err, r.ReqID)
					}
				default:
					if !errors.Is(err, wire.ErrUnknownType) || !errors.Is(err, wire.ErrMalformed) || errors.Is(err, wire.ErrUnsupportedVersion) {
						t.Fatalf("version %d decode: err = %v, want ErrUnknownType", v, err)
					}
				}
			}
		})
	}
	if got := wire.AppendSimple(nil, wire.TypeKept, 4); hex.EncodeToString(got) != "000000054b00000004" {
		t.Fatalf("AppendSimple(K) = %x", got)
	}
}

// Every version-1 and version-2 frame decodes the same by the rules of
// version 3, and a HELLO asking for version 4 or more is still refused.
func TestVersion3KeepsVersion2(t *testing.T) {
	var vectors []struct {
		name string
		hex  string
		req  wire.Request
	}
	vectors = append(append(vectors, requestVectors...), requestVectorsV2...)
	for _, tc := range vectors {
		var r wire.Request
		if err := wire.DecodeRequestVersion(mustHex(t, tc.hex)[4:], &r, wire.Version3); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !reflect.DeepEqual(r, tc.req) {
			t.Fatalf("%s: decode = %+v, want %+v", tc.name, r, tc.req)
		}
	}
	if wire.MaxVersion != wire.Version3 {
		t.Fatalf("MaxVersion = %d, want %d", wire.MaxVersion, wire.Version3)
	}
	for _, v := range []string{"04", "05", "ff"} {
		var r wire.Request
		err := wire.DecodeRequestVersion(mustHex(t, "4800000009"+v+"0000"), &r, wire.MaxVersion)
		if !errors.Is(err, wire.ErrUnsupportedVersion) || errors.Is(err, wire.ErrMalformed) || r.ReqID != 9 {
			t.Fatalf("HELLO version %s on version 3: err = %v, req_id %d", v, err, r.ReqID)
		}
	}
}

func TestResponseVectors(t *testing.T) {
	for _, tc := range append(append(responseVectors, responseVectorsV2...), responseVectorsV3...) {
		t.Run(tc.name, func(t *testing.T) {
			want := mustHex(t, tc.hex)
			got, err := wire.AppendResponse(nil, &tc.resp)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("encode = %x, want %x", got, want)
			}
			var r wire.Response
			if err := wire.DecodeResponse(want[4:], &r); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(r, tc.resp) {
				t.Fatalf("decode = %+v, want %+v", r, tc.resp)
			}
			// The server patches the version asked for into a pre-encoded
			// HELLO_OK at this offset, in every layout.
			if tc.resp.Type == wire.TypeHelloOK && got[wire.HeaderLen+5] != tc.resp.Version {
				t.Fatalf("version byte at %d is %d, want %d", wire.HeaderLen+5, got[wire.HeaderLen+5], tc.resp.Version)
			}
		})
	}
}

// A version-3 HELLO_OK carries the cluster identity (up to MaxClusterLen
// bytes); HELLO_OKs of versions 1 and 2 are unchanged and cannot carry one.
func TestHelloOKCluster(t *testing.T) {
	if wire.MaxClusterLen != 64 {
		t.Fatalf("MaxClusterLen = %d", wire.MaxClusterLen)
	}
	// Versions 1 and 2: an empty Cluster (nil or not) changes nothing.
	for _, v := range []uint8{wire.Version1, wire.Version2} {
		want := responseVectors[0].hex
		if v == wire.Version2 {
			want = responseVectorsV2[0].hex
		}
		for _, c := range [][]byte{nil, {}} {
			got, err := wire.AppendResponse(nil, &wire.Response{Type: 'O', ReqID: 1, Version: v, Role: 1, Node: []byte("n1"), Cluster: c})
			if err != nil || hex.EncodeToString(got) != want {
				t.Fatalf("version %d HELLO_OK, cluster %#v: %x, %v; want %s", v, c, got, err, want)
			}
			var r wire.Response
			r.Cluster = []byte("stale")
			if err := wire.DecodeResponse(got[4:], &r); err != nil || r.Cluster != nil {
				t.Fatalf("version %d HELLO_OK decodes to cluster %q, %v", v, r.Cluster, err)
			}
		}
		dst := []byte("keep")
		out, err := wire.AppendResponse(dst, &wire.Response{Type: 'O', Version: v, Role: 1, Cluster: []byte("c")})
		if !errors.Is(err, wire.ErrFieldVersion) || string(out) != "keep" {
			t.Fatalf("version %d HELLO_OK with a cluster: err %v, out %q", v, err, out)
		}
	}
	// Version 3 (and later version bytes, which keep its layout): 0, 1,
	// 63 and 64 bytes encode and decode; 65 does not.
	for _, v := range []uint8{wire.Version3, 4, 255} {
		for _, n := range []int{0, 1, 63, wire.MaxClusterLen} {
			c := bytes.Repeat([]byte("c"), n)
			resp := wire.Response{Type: 'O', ReqID: 7, Version: v, Role: wire.RoleLeader, Node: []byte("node-a"), Cluster: c}
			got, err := wire.AppendResponse(nil, &resp)
			if err != nil {
				t.Fatalf("version %d, cluster of %d: %v", v, n, err)
			}
			want := append(mustHex(t, "4f00000007"), v, 3, 6)
			want = append(append(want, "node-a"...), byte(n))
			want = append(want, c...)
			if !bytes.Equal(got[4:], want) || int(uint32(got[3])|uint32(got[2])<<8) != len(want) {
				t.Fatalf("version %d, cluster of %d: %x, want body %x", v, n, got, want)
			}
			var r wire.Response
			if err := wire.DecodeResponse(got[4:], &r); err != nil || !reflect.DeepEqual(r, resp) {
				t.Fatalf("version %d, cluster of %d: decode = %+v, %v", v, n, r, err)
			}
		}
		dst := []byte("keep")
		out, err := wire.AppendResponse(dst, &wire.Response{Type: 'O', Version: v, Role: 3, Cluster: make([]byte, wire.MaxClusterLen+1)})
		if !errors.Is(err, wire.ErrFieldTooLong) || string(out) != "keep" {
			t.Fatalf("version %d, cluster of 65: err %v, out %q", v, err, out)
		}
	}
	// A cluster_len of 65 on the wire is malformed, even with its 65 bytes.
	body := append(mustHex(t, "4f00000001030300"), 65)
	body = append(body, make([]byte, 65)...)
	var r wire.Response
	if err := wire.DecodeResponse(body, &r); !errors.Is(err, wire.ErrMalformed) {
		t.Fatalf("cluster_len 65: %v", err)
	}
	// ... and 64 is not.
	body = append(mustHex(t, "4f00000001030300"), 64)
	body = append(body, make([]byte, 64)...)
	if err := wire.DecodeResponse(body, &r); err != nil || len(r.Cluster) != 64 {
		t.Fatalf("cluster_len 64: %v, %d bytes", err, len(r.Cluster))
	}
}

func TestFastBuilders(t *testing.T) {
	if got := wire.AppendGranted(nil, 2, 42, 1500); hex.EncodeToString(got) != "000000114700000002000000000000002a000005dc" {
		t.Fatalf("AppendGranted = %x", got)
	}
	if got := wire.AppendSimple(nil, 'T', 2); hex.EncodeToString(got) != "000000055400000002" {
		t.Fatalf("AppendSimple = %x", got)
	}
	if got := wire.AppendError(nil, 1, 3, "unauthorized"); hex.EncodeToString(got) != "0000001545000000010003000c756e617574686f72697a6564" {
		t.Fatalf("AppendError = %x", got)
	}
	long := wire.AppendError(nil, 1, 1, strings.Repeat("x", 5000))
	if len(long) != wire.MaxFrame {
		t.Fatalf("AppendError long frame = %d bytes, want %d", len(long), wire.MaxFrame)
	}
	var r wire.Response
	if err := wire.DecodeResponse(long[4:], &r); err != nil {
		t.Fatal(err)
	}
}

// Every malformed shape of every type, in both directions.
func TestDecodeRequestMalformed(t *testing.T) {
	cases := []struct {
		name string
		hex  string // body, without length prefix
		want error
	}{
		{"empty", "", wire.ErrMalformed},
		{"type only", "48", wire.ErrMalformed},
		{"no full req_id", "50000000", wire.ErrMalformed},
		{"unknown type", "5a00000001", wire.ErrUnknownType},
		{"server type from client", "4700000001000000000000002a000005dc", wire.ErrUnknownType},
		{"lowercase type", "7000000004", wire.ErrUnknownType},
		{"ping with payload", "500000000400", wire.ErrMalformed},
		{"hello no version", "4800000001", wire.ErrMalformed},
		{"hello version 2 short", "480000000102", wire.ErrUnsupportedVersion},
		{"hello version 0", "4800000001000000", wire.ErrUnsupportedVersion},
		{"hello no token len", "480000000101", wire.ErrMalformed},
		{"hello token past end", "48000000010105616263", wire.ErrMalformed},
		{"hello no name len", "4800000001010161", wire.ErrMalformed},
		{"hello name past end", "480000000101016102", wire.ErrMalformed},
		{"hello trailing", "48000000010100000000", wire.ErrMalformed},
		{"acquire short owner", "4100000002000102", wire.ErrMalformed},
		{"acquire no key len", "4100000002000102030405060708090a0b0c0d0e0f051e", wire.ErrMalformed},
		{"acquire key past end", "4100000002000102030405060708090a0b0c0d0e0f051e096f726465722d3432", wire.ErrMalformed},
		{"acquire trailing", "4100000002000102030405060708090a0b0c0d0e0f051e076f726465722d3432", wire.ErrMalformed},
		{"release short token", "55000000030000002a", wire.ErrMalformed},
		{"release no key len", "5500000003000000000000002a", wire.ErrMalformed},
		{"release key past end", "5500000003000000000000002a096f726465722d3432", wire.ErrMalformed},
		{"release trailing", "5500000003000000000000002a016f726465722d3432", wire.ErrMalformed},
		{"cancel on version 1", "4300000002", wire.ErrUnknownType},
		{"release_owned on version 1", "5600000003000000000000002a000102030405060708090a0b0c0d0e0f086f726465722d3432", wire.ErrUnknownType},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var r wire.Request
			err := wire.DecodeRequest(mustHex(t, tc.hex), &r)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if tc.want == wire.ErrUnsupportedVersion && errors.Is(err, wire.ErrMalformed) {
				t.Fatal("a version error must not match ErrMalformed (it is E(2), not E(1))")
			}
		})
	}
}

// Every malformed shape of the version-2 frames, decoded by version 2.
func TestDecodeRequestMalformedV2(t *testing.T) {
	cases := []struct {
		name string
		hex  string // body, without length prefix
		want error
	}{
		{"hello version 3", "4800000001030000", wire.ErrUnsupportedVersion},
		{"hello version 255", "4800000001ff0000", wire.ErrUnsupportedVersion},
		{"hello version 0", "4800000001000000", wire.ErrUnsupportedVersion},
		{"hello v2 trailing", "48000000010200000000", wire.ErrMalformed},
		{"hello v2 no name len", "48000000010200", wire.ErrMalformed},
		{"cancel no full req_id", "43000000", wire.ErrMalformed},
		{"cancel with payload", "430000000200", wire.ErrMalformed},
		{"cancel with owner", "4300000002000102030405060708090a0b0c0d0e0f", wire.ErrMalformed},
		{"release_owned token only", "5600000003000000000000002a", wire.ErrMalformed},
		{"release_owned short owner", "5600000003000000000000002a000102030405060708090a0b0c0d0e", wire.ErrMalformed},
		{"release_owned no key len", "5600000003000000000000002a000102030405060708090a0b0c0d0e0f", wire.ErrMalformed},
		{"release_owned key past end", "5600000003000000000000002a000102030405060708090a0b0c0d0e0f096f726465722d3432", wire.ErrMalformed},
		{"release_owned trailing", "5600000003000000000000002a000102030405060708090a0b0c0d0e0f076f726465722d3432", wire.ErrMalformed},
		{"release_owned as release (no owner)", "5600000003000000000000002a086f726465722d3432", wire.ErrMalformed},
		{"lowercase cancel", "6300000002", wire.ErrUnknownType},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var r wire.Request
			err := wire.DecodeRequestVersion(mustHex(t, tc.hex), &r, wire.Version2)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if tc.want == wire.ErrUnsupportedVersion && errors.Is(err, wire.ErrMalformed) {
				t.Fatal("a version error must not match ErrMalformed (it is E(2), not E(1))")
			}
		})
	}
	// key_len 0 is well formed: out of range, answered E(4) by the server.
	var r wire.Request
	if err := wire.DecodeRequestVersion(mustHex(t, "5600000003000000000000002a000102030405060708090a0b0c0d0e0f00"), &r, 2); err != nil || len(r.Key) != 0 {
		t.Fatalf("release_owned key_len 0: %v", err)
	}
}

// Every malformed shape of the version-3 frames, decoded by version 3, and
// the well-formed EXTENDs with a field out of range, which decode (the
// server answers them E(4) with their req_id, not E(1)).
func TestDecodeRequestMalformedV3(t *testing.T) {
	const (
		x     = "5800000004"                       // type and req_id
		tok   = "000000000000002a"                 // token 42
		owner = "000102030405060708090a0b0c0d0e0f" // owner 00..0f
	)
	cases := []struct {
		name string
		hex  string // body, without length prefix
		want error
	}{
		{"hello version 4", "4800000001040000", wire.ErrUnsupportedVersion},
		{"hello version 4 short", "480000000104", wire.ErrUnsupportedVersion},
		{"hello version 255", "4800000001ff0000", wire.ErrUnsupportedVersion},
		{"hello v3 no token len", "480000000103", wire.ErrMalformed},
		{"hello v3 no name len", "48000000010300", wire.ErrMalformed},
		{"hello v3 trailing", "48000000010300000000", wire.ErrMalformed},
		{"extend no full req_id", "58000000", wire.ErrMalformed},
		{"extend no body", x, wire.ErrMalformed},
		{"extend short token", x + "0000002a", wire.ErrMalformed},
		{"extend token only", x + tok, wire.ErrMalformed},
		{"extend short owner", x + tok + "000102030405060708090a0b0c0d0e", wire.ErrMalformed},
		{"extend no lease", x + tok + owner, wire.ErrMalformed},
		{"extend no key len", x + tok + owner + "1e", wire.ErrMalformed},
		{"extend key past end", x + tok + owner + "1e096f726465722d3432", wire.ErrMalformed},
		{"extend key_len 255, 8 bytes", x + tok + owner + "1eff6f726465722d3432", wire.ErrMalformed},
		{"extend trailing", x + tok + owner + "1e076f726465722d3432", wire.ErrMalformed},
		{"extend trailing byte after key", x + tok + owner + "1e086f726465722d343200", wire.ErrMalformed},
		{"extend as release_owned (no lease)", x + tok + owner + "086f726465722d3432", wire.ErrMalformed},
		{"extend as acquire (no token)", x + owner + "051e086f726465722d3432", wire.ErrMalformed},
		{"lowercase extend", "7800000004", wire.ErrUnknownType},
		{"kept from client", "4b00000004", wire.ErrUnknownType},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var r wire.Request
			err := wire.DecodeRequestVersion(mustHex(t, tc.hex), &r, wire.Version3)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if tc.want == wire.ErrUnsupportedVersion && errors.Is(err, wire.ErrMalformed) {
				t.Fatal("a version error must not match ErrMalformed (it is E(2), not E(1))")
			}
		})
	}
	// Well formed but out of range: they decode, with the req_id and the
	// offending field, for the server to answer E(4).
	inRange := func(r *wire.Request) bool {
		return len(r.Key) >= wire.MinKeyLen && len(r.Key) <= wire.MaxKeyLen &&
			r.LeaseS >= wire.MinLeaseS && r.LeaseS <= wire.MaxLeaseS
	}
	for _, tc := range []struct {
		name  string
		hex   string
		lease uint8
		key   string
	}{
		{"key_len 0", x + tok + owner + "1e00", 30, ""},
		{"lease 0", x + tok + owner + "00086f726465722d3432", 0, "order-42"},
		{"lease 251", x + tok + owner + "fb086f726465722d3432", 251, "order-42"},
		{"lease 255", x + tok + owner + "ff086f726465722d3432", 255, "order-42"},
	} {
		var r wire.Request
		if err := wire.DecodeRequestVersion(mustHex(t, tc.hex), &r, wire.Version3); err != nil {
			t.Fatalf("%s: %v, want a well-formed EXTEND (E(4), not E(1))", tc.name, err)
		}
		want := wire.Request{Type: wire.TypeExtend, ReqID: 4, Token: 42, Owner: owner0f(), LeaseS: tc.lease, Key: []byte(tc.key)}
		if !reflect.DeepEqual(r, want) || inRange(&r) {
			t.Fatalf("%s: decode = %+v, want %+v, out of range", tc.name, r, want)
		}
		// The encoder sends them as they are (a test may send them broken),
		// as it does ACQUIRE's.
		got, err := wire.AppendRequest(nil, &want)
		if err != nil || hex.EncodeToString(got[4:]) != tc.hex {
			t.Fatalf("%s: encode = %x, %v", tc.name, got, err)
		}
	}
	// The edges of the range are in range.
	for _, h := range []string{x + tok + owner + "0101" + "6b", x + tok + owner + "fa01" + "6b"} {
		var r wire.Request
		if err := wire.DecodeRequestVersion(mustHex(t, h), &r, wire.Version3); err != nil || !inRange(&r) {
			t.Fatalf("%s: %v, %+v", h, err, r)
		}
	}
}

func TestDecodeResponseMalformed(t *testing.T) {
	cases := []struct {
		name string
		hex  string
		want error
	}{
		{"empty", "", wire.ErrMalformed},
		{"no full req_id", "4f000000", wire.ErrMalformed},
		{"unknown type", "5800000001", wire.ErrUnknownType},
		{"client type from server", "4100000002", wire.ErrUnknownType},
		{"hello_ok short", "4f0000000101", wire.ErrMalformed},
		{"hello_ok no node len", "4f000000010101", wire.ErrMalformed},
		{"hello_ok node past end", "4f000000010101036e31", wire.ErrMalformed},
		{"hello_ok trailing", "4f000000010101016e31", wire.ErrMalformed},
		{"granted short", "4700000002000000000000002a0000", wire.ErrMalformed},
		{"granted long", "4700000002000000000000002a000005dc00", wire.ErrMalformed},
		{"timed_out payload", "540000000200", wire.ErrMalformed},
		{"busy payload", "420000000200", wire.ErrMalformed},
		{"released payload", "520000000300", wire.ErrMalformed},
		{"not_held payload", "4e0000000300", wire.ErrMalformed},
		{"pong payload", "500000000400", wire.ErrMalformed},
		{"not_active no hint len", "4d00000000", wire.ErrMalformed},
		{"not_active hint past end", "4d00000000026e", wire.ErrMalformed},
		{"not_active trailing", "4d00000000016e6e", wire.ErrMalformed},
		{"error short", "4500000001000300", wire.ErrMalformed},
		{"error msg past end", "450000000100030002ff", wire.ErrMalformed},
		{"error trailing", "450000000100030001ffff", wire.ErrMalformed},
		// Version 2's HELLO_OK is unchanged: nothing after node.
		{"hello_ok v2 with cluster", "4f000000010201026e3100", wire.ErrMalformed},
		{"hello_ok v1 with cluster", "4f000000010101026e3100", wire.ErrMalformed},
		// Version 3's has cluster_len and cluster after node.
		{"hello_ok v3 no cluster len", "4f000000010301026e31", wire.ErrMalformed},
		{"hello_ok v3 node past end", "4f000000010301036e3100", wire.ErrMalformed},
		{"hello_ok v3 cluster past end", "4f000000010303026e31110123456789abcdef0123456789abcdef", wire.ErrMalformed},
		{"hello_ok v3 trailing", "4f000000010301026e310000", wire.ErrMalformed},
		{"hello_ok v3 cluster trailing", "4f000000010303026e310f0123456789abcdef0123456789abcdef", wire.ErrMalformed},
		{"hello_ok v4 no cluster len", "4f000000010401026e31", wire.ErrMalformed},
		{"kept payload", "4b0000000400", wire.ErrMalformed},
		{"kept no full req_id", "4b000000", wire.ErrMalformed},
		{"extend from server", "5800000004", wire.ErrUnknownType},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var r wire.Response
			if err := wire.DecodeResponse(mustHex(t, tc.hex), &r); !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestReaderFraming(t *testing.T) {
	cases := []struct {
		name string
		hex  string
		want error
	}{
		{"zero length", "00000000", wire.ErrFrameSize},
		{"1025", "00000401", wire.ErrFrameSize},
		{"huge", "ffffffff", wire.ErrFrameSize},
		{"eof between frames", "", io.EOF},
		{"cut header", "0000", io.ErrUnexpectedEOF},
		{"cut body", "0000000550000000", io.ErrUnexpectedEOF},
		{"header only", "00000005", io.ErrUnexpectedEOF},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fr := wire.NewReader(bytes.NewReader(mustHex(t, tc.hex)))
			if _, err := fr.Next(); !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
	if !errors.Is(wire.ErrFrameSize, wire.ErrMalformed) {
		t.Fatal("ErrFrameSize must match ErrMalformed")
	}
	// 1024 is the largest legal body; several frames back to back.
	var stream []byte
	big := wire.AppendError(nil, 9, 1, strings.Repeat("m", 2000))
	stream = append(stream, big...)
	stream = append(stream, mustHex(t, "000000055000000004")...)
	fr := wire.NewReader(bufio.NewReader(bytes.NewReader(stream)))
	b, err := fr.Next()
	if err != nil || len(b) != wire.MaxBody {
		t.Fatalf("first frame: len %d err %v", len(b), err)
	}
	b, err = fr.Next()
	if err != nil || hex.EncodeToString(b) != "5000000004" {
		t.Fatalf("second frame: %x err %v", b, err)
	}
	if _, err := fr.Next(); err != io.EOF {
		t.Fatalf("end: %v", err)
	}
}

func TestEncodeRefusesWhatCannotBeEncoded(t *testing.T) {
	long := bytes.Repeat([]byte("k"), 256)
	for _, r := range []wire.Request{
		{Type: 'A', Key: long},
		{Type: 'U', Key: long},
		{Type: 'V', Key: long},
		{Type: 'X', Key: long},
		{Type: 'H', Version: 1, AuthToken: long},
		{Type: 'H', Version: 1, Name: long},
	} {
		dst := []byte("keep")
		out, err := wire.AppendRequest(dst, &r)
		if !errors.Is(err, wire.ErrFieldTooLong) || string(out) != "keep" {
			t.Errorf("%c: err %v out %q", r.Type, err, out)
		}
	}
	if _, err := wire.AppendRequest(nil, &wire.Request{Type: 'Q'}); !errors.Is(err, wire.ErrUnknownType) {
		t.Errorf("unknown request type: %v", err)
	}
	if _, err := wire.AppendResponse(nil, &wire.Response{Type: 'Q'}); !errors.Is(err, wire.ErrUnknownType) {
		t.Errorf("unknown response type: %v", err)
	}
	if _, err := wire.AppendResponse(nil, &wire.Response{Type: 'M', Hint: long}); !errors.Is(err, wire.ErrFieldTooLong) {
		t.Errorf("long hint: %v", err)
	}
	if _, err := wire.AppendResponse(nil, &wire.Response{Type: 'E', Msg: make([]byte, 1016)}); !errors.Is(err, wire.ErrFieldTooLong) {
		t.Errorf("long msg: %v", err)
	}
}

func randBytes(rng *rand.Rand, max int) []byte {
	b := make([]byte, rng.IntN(max+1))
	for i := range b {
		b[i] = byte(rng.UintN(256))
	}
	return b
}

// Property: any encodable request or response decodes to itself, and the
// decoded frame re-encodes to the same bytes.
func TestRoundTripProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	reqTypes := []byte{'H', 'A', 'U', 'P', 'C', 'V', 'X'}
	respTypes := []byte{'O', 'G', 'T', 'B', 'R', 'N', 'M', 'E', 'P', 'K'}
	seen := map[string]bool{}
	for i := 0; i < 20000; i++ {
		q := wire.Request{Type: reqTypes[rng.IntN(len(reqTypes))], ReqID: rng.Uint32()}
		switch q.Type {
		case 'H':
			q.Version, q.AuthToken, q.Name = byte(1+rng.IntN(3)), randBytes(rng, 255), randBytes(rng, 255)
		case 'A':
			for j := range q.Owner {
				q.Owner[j] = byte(rng.UintN(256))
			}
			q.WaitS, q.LeaseS, q.Key = byte(rng.UintN(256)), byte(rng.UintN(256)), randBytes(rng, 255)
		case 'U':
			q.Token, q.Key = rng.Uint64(), randBytes(rng, 255)
		case 'V':
			for j := range q.Owner {
				q.Owner[j] = byte(rng.UintN(256))
			}
			q.Token, q.Key = rng.Uint64(), randBytes(rng, 255)
		case 'X':
			for j := range q.Owner {
				q.Owner[j] = byte(rng.UintN(256))
			}
			q.Token, q.LeaseS, q.Key = rng.Uint64(), byte(rng.UintN(256)), randBytes(rng, 255)
		}
		frame, err := wire.AppendRequest(nil, &q)
		if err != nil {
			t.Fatal(err)
		}
		var got wire.Request
		if err := wire.DecodeRequestVersion(frame[4:], &got, wire.Version3); err != nil {
			t.Fatalf("%+v: %v", q, err)
		}
		if !reflect.DeepEqual(got, q) {
			t.Fatalf("request decodes to %+v, want %+v", got, q)
		}
		again, _ := wire.AppendRequest(nil, &got)
		if !bytes.Equal(frame, again) {
			t.Fatalf("request round trip differs: %x vs %x", frame, again)
		}

		p := wire.Response{Type: respTypes[rng.IntN(len(respTypes))], ReqID: rng.Uint32()}
		switch p.Type {
		case 'O':
			p.Version, p.Role, p.Node = byte(rng.UintN(256)), byte(rng.UintN(256)), randBytes(rng, 255)
			if p.Version >= wire.Version3 {
				p.Cluster = randBytes(rng, wire.MaxClusterLen)
				seen[fmt.Sprintf("cluster %d", len(p.Cluster))] = true
			}
		case 'G':
			p.Token, p.WaitedMS = rng.Uint64(), rng.Uint32()
		case 'M':
			p.Hint = randBytes(rng, 255)
		case 'E':
			p.Code, p.Msg = uint16(rng.UintN(65536)), randBytes(rng, wire.MaxBody-9)
		}
		frame, err = wire.AppendResponse(nil, &p)
		if err != nil {
			t.Fatal(err)
		}
		var gotp wire.Response
		if err := wire.DecodeResponse(frame[4:], &gotp); err != nil {
			t.Fatalf("%+v: %v", p, err)
		}
		again, _ = wire.AppendResponse(nil, &gotp)
		if !bytes.Equal(frame, again) {
			t.Fatalf("response round trip differs: %x vs %x", frame, again)
		}
		if p.Type == 'O' && !bytes.Equal(gotp.Cluster, p.Cluster) {
			t.Fatalf("HELLO_OK version %d: cluster %x, want %x", p.Version, gotp.Cluster, p.Cluster)
		}
		seen[string(q.Type)+" "+string(p.Type)] = true
	}
	// Every type and both ends of the cluster's range were tried.
	for _, k := range []string{"cluster 0", "cluster 64", "X K", "H O"} {
		if !seen[k] {
			t.Errorf("the property never tried %q", k)
		}
	}
}

func TestNoAllocations(t *testing.T) {
	acq := mustHex(t, requestVectors[2].hex)
	stream := bytes.Repeat(acq, 1000)
	fr := wire.NewReader(bytes.NewReader(stream))
	var r wire.Request
	buf := make([]byte, 0, wire.MaxFrame)
	allocs := testing.AllocsPerRun(500, func() {
		body, err := fr.Next()
		if err != nil {
			t.Fatal(err)
		}
		if err := wire.DecodeRequest(body, &r); err != nil {
			t.Fatal(err)
		}
		buf = wire.AppendGranted(buf[:0], r.ReqID, 1, 0)
		buf, _ = wire.AppendRequest(buf[:0], &r)
	})
	if allocs != 0 {
		t.Fatalf("read+decode+encode allocates %.1f times per frame, want 0", allocs)
	}
	var resp wire.Response
	g := mustHex(t, responseVectors[1].hex)[4:]
	if a := testing.AllocsPerRun(500, func() { _ = wire.DecodeResponse(g, &resp) }); a != 0 {
		t.Fatalf("DecodeResponse allocates %.1f", a)
	}
	bad := mustHex(t, "4100000002000102")
	if a := testing.AllocsPerRun(500, func() { _ = wire.DecodeRequest(bad, &r) }); a != 0 {
		t.Fatalf("rejecting a malformed frame allocates %.1f", a)
	}
	v := mustHex(t, requestVectorsV2[2].hex)
	if a := testing.AllocsPerRun(500, func() {
		_ = wire.DecodeRequestVersion(v[4:], &r, 2)
		_ = wire.DecodeRequest(v[4:], &r) // rejected on version 1
		buf, _ = wire.AppendRequest(buf[:0], &r)
		buf = wire.AppendCancel(buf[:0], 2)
	}); a != 0 {
		t.Fatalf("RELEASE_OWNED and CANCEL allocate %.1f", a)
	}
	x := mustHex(t, requestVectorsV3[1].hex)
	o := mustHex(t, responseVectorsV3[1].hex)
	if a := testing.AllocsPerRun(500, func() {
		if err := wire.DecodeRequestVersion(x[4:], &r, 3); err != nil {
			t.Fatal(err)
		}
		buf, _ = wire.AppendRequest(buf[:0], &r)
		if err := wire.DecodeResponse(o[4:], &resp); err != nil {
			t.Fatal(err)
		}
		buf, _ = wire.AppendResponse(buf[:0], &resp)
		buf = wire.AppendSimple(buf[:0], wire.TypeKept, r.ReqID)
	}); a != 0 {
		t.Fatalf("EXTEND, KEPT and a version-3 HELLO_OK allocate %.1f", a)
	}
}

func BenchmarkDecodeAcquire(b *testing.B) {
	body := mustHex(b, requestVectors[2].hex)[4:]
	var r wire.Request
	b.ReportAllocs()
	for b.Loop() {
		if err := wire.DecodeRequest(body, &r); err != nil {
			b.Fatal(err)
		}
	}
}
