package wire_test

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/ticketing-dev/ticketing/internal/wire"
)

// FuzzDecodeRequest: the request decoder, by the rules of version 1 and of
// version 2, never panics, classifies every rejection, and whatever it
// accepts re-encodes to exactly the same bytes. Version 2 accepts every
// frame version 1 does, with the same result; what only version 2 accepts
// is a version-2 HELLO (E(2) for version 1) or a CANCEL or RELEASE_OWNED
// (E(1) for version 1).
func FuzzDecodeRequest(f *testing.F) {
	for _, v := range requestVectors {
		f.Add(mustHex(f, v.hex)[4:])
	}
	for _, v := range requestVectorsV2 {
		f.Add(mustHex(f, v.hex)[4:])
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var r1, r2 wire.Request
		err1 := wire.DecodeRequest(body, &r1)
		err2 := wire.DecodeRequestVersion(body, &r2, wire.Version2)
		for _, err := range []error{err1, err2} {
			if err != nil && !errors.Is(err, wire.ErrMalformed) && !errors.Is(err, wire.ErrUnsupportedVersion) {
				t.Fatalf("unclassified error %v", err)
			}
		}
		switch {
		case err1 == nil && err2 != nil:
			t.Fatalf("version 1 accepts what version 2 refuses (%v): %x", err2, body)
		case err1 == nil && !reflect.DeepEqual(r1, r2):
			t.Fatalf("versions 1 and 2 decode %x differently: %+v, %+v", body, r1, r2)
		case err1 != nil && err2 == nil:
			switch r2.Type {
			case wire.TypeHello:
				if r2.Version != wire.Version2 || !errors.Is(err1, wire.ErrUnsupportedVersion) {
					t.Fatalf("only version 2 accepts HELLO %+v; version 1 said %v", r2, err1)
				}
			case wire.TypeCancel, wire.TypeReleaseOwned:
				if !errors.Is(err1, wire.ErrUnknownType) {
					t.Fatalf("version 1 refuses %c with %v, want ErrUnknownType", r2.Type, err1)
				}
			default:
				t.Fatalf("only version 2 accepts %x (version 1: %v)", body, err1)
			}
		}
		if err2 != nil || len(body) > wire.MaxBody {
			return // the Reader refuses bodies above MaxBody before decoding
		}
		frame, err := wire.AppendRequest(nil, &r2)
		if err != nil {
			t.Fatalf("decoded frame does not re-encode: %v", err)
		}
		if !bytes.Equal(frame[4:], body) {
			t.Fatalf("re-encoded %x, decoded from %x", frame[4:], body)
		}
	})
}

// FuzzDecodeResponse: the same for the response decoder.
func FuzzDecodeResponse(f *testing.F) {
	for _, v := range append(responseVectors, responseVectorsV2...) {
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
