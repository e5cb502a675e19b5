package wire_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/ticketing-dev/ticketing/internal/wire"
)

// FuzzDecodeRequest: the request decoder never panics, classifies every
// rejection, and whatever it accepts re-encodes to exactly the same bytes.
func FuzzDecodeRequest(f *testing.F) {
	for _, v := range requestVectors {
		f.Add(mustHex(f, v.hex)[4:])
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var r wire.Request
		err := wire.DecodeRequest(body, &r)
		if err != nil {
			if !errors.Is(err, wire.ErrMalformed) && !errors.Is(err, wire.ErrUnsupportedVersion) {
				t.Fatalf("unclassified error %v", err)
			}
			return
		}
		if len(body) > wire.MaxBody {
			return // the Reader refuses these before decoding
		}
		frame, err := wire.AppendRequest(nil, &r)
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
	for _, v := range responseVectors {
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
