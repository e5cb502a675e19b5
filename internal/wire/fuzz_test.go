package wire_test

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/ticketing-dev/ticketing/internal/wire"
)

// FuzzDecodeRequest: the request decoder, by the rules of versions 1, 2
// and 3, never panics, classifies every rejection, and whatever it accepts
// re-encodes to exactly the same bytes. Each version accepts every frame
// the one before it does, with the same result; what only version v
// accepts is a version-v HELLO (E(2) for the one before) or one of the
// frame types version v adds (E(1), an unknown type, for the one before):
// CANCEL and RELEASE_OWNED for version 2, EXTEND for version 3.
func FuzzDecodeRequest(f *testing.F) {
	for _, v := range requestVectors {
		f.Add(mustHex(f, v.hex)[4:])
	}
	for _, v := range requestVectorsV2 {
		f.Add(mustHex(f, v.hex)[4:])
	}
	for _, v := range requestVectorsV3 {
		f.Add(mustHex(f, v.hex)[4:])
	}
	added := [wire.MaxVersion + 1][]byte{
		wire.Version2: {wire.TypeCancel, wire.TypeReleaseOwned},
		wire.Version3: {wire.TypeExtend},
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var rs [wire.MaxVersion + 1]wire.Request
		var errs [wire.MaxVersion + 1]error
		for v := wire.Version1; v <= wire.MaxVersion; v++ {
			errs[v] = wire.DecodeRequestVersion(body, &rs[v], uint8(v))
			if err := errs[v]; err != nil && !errors.Is(err, wire.ErrMalformed) && !errors.Is(err, wire.ErrUnsupportedVersion) {
				t.Fatalf("version %d: unclassified error %v", v, err)
			}
		}
		var r wire.Request
		if err := wire.DecodeRequest(body, &r); err != errs[wire.Version1] || err == nil && !reflect.DeepEqual(r, rs[wire.Version1]) {
			t.Fatalf("DecodeRequest differs from version 1: %+v, %v", r, err)
		}
		for v := wire.Version2; v <= wire.MaxVersion; v++ {
			lo, hi := errs[v-1], errs[v]
			switch {
			case lo == nil && hi != nil:
				t.Fatalf("version %d accepts what version %d refuses (%v): %x", v-1, v, hi, body)
			case lo == nil && !reflect.DeepEqual(rs[v-1], rs[v]):
				t.Fatalf("versions %d and %d decode %x differently: %+v, %+v", v-1, v, body, rs[v-1], rs[v])
			case lo != nil && hi == nil:
				switch typ := rs[v].Type; {
				case typ == wire.TypeHello:
					if rs[v].Version != uint8(v) || !errors.Is(lo, wire.ErrUnsupportedVersion) {
						t.Fatalf("only version %d accepts HELLO %+v; version %d said %v", v, rs[v], v-1, lo)
					}
				case bytes.IndexByte(added[v], typ) >= 0:
					if !errors.Is(lo, wire.ErrUnknownType) {
						t.Fatalf("version %d refuses %c with %v, want ErrUnknownType", v-1, typ, lo)
					}
				default:
					t.Fatalf("only version %d accepts %x (version %d: %v)", v, body, v-1, lo)
				}
			}
		}
		top := rs[wire.MaxVersion]
		if errs[wire.MaxVersion] != nil || len(body) > wire.MaxBody {
			return // the Reader refuses bodies above MaxBody before decoding
		}
		frame, err := wire.AppendRequest(nil, &top)
		if err != nil {
			t.Fatalf("decoded frame does not re-encode: %v", err)
		}
		if !bytes.Equal(frame[4:], body) {
			t.Fatalf("re-encoded %x, decoded from %x", frame[4:], body)
		}
	})
}

// FuzzDecodeResponse: the same for the response decoder, whose frames
// (the HELLO_OK of every version, KEPT included) need no version; and a
// HELLO_OK it accepts has a cluster identity only from version 3 on, of at
// most MaxClusterLen bytes.
func FuzzDecodeResponse(f *testing.F) {
	for _, v := range append(append(responseVectors, responseVectorsV2...), responseVectorsV3...) {
		f.Add(mustHex(f, v.hex)[4:])
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var r wire.Response
		err := wire.DecodeResponse(body, &r)
		if err != nil {
			if !errors.Is(err, wire.ErrMalformed) {
				t.Fatalf("unclassified error %v", err)
			}
			return
		}
		if r.Type == wire.TypeHelloOK && (r.Version < wire.Version3 && r.Cluster != nil || len(r.Cluster) > wire.MaxClusterLen) {
			t.Fatalf("HELLO_OK version %d with a cluster of %d bytes", r.Version, len(r.Cluster))
		}
		if len(body) > wire.MaxBody {
			return
		}
		frame, err := wire.AppendResponse(nil, &r)
		if err != nil {
			t.Fatalf("decoded frame does not re-encode: %v", err)
		}
		if !bytes.Equal(frame[4:], body) {
			t.Fatalf("re-encoded %x, decoded from %x", frame[4:], body)
		}
	})
}

// FuzzReader: arbitrary streams never panic the framer and never yield a
// body outside 1..MaxBody.
func FuzzReader(f *testing.F) {
	f.Add(mustHex(f, "000000055000000004000000055000000004"))
	f.Add(mustHex(f, "00000000"))
	f.Add(mustHex(f, "000000084800000001020000000000054300000002"))
	f.Add(mustHex(f, "000000084800000001030000"+"000000275800000004000000000000002a000102030405060708090a0b0c0d0e0f1e086f726465722d3432"))
	f.Fuzz(func(t *testing.T, stream []byte) {
		fr := wire.NewReader(bytes.NewReader(stream))
		for {
			b, err := fr.Next()
			if err != nil {
				return
			}
			if len(b) == 0 || len(b) > wire.MaxBody {
				t.Fatalf("body of %d bytes", len(b))
			}
		}
	})
}
