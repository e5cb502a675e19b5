// Package wire is the frame codec of the Ticketing wire protocol, versions 1
// to 3 (docs/protocol.md). It knows nothing of sockets, sessions or locks:
// it turns frames into structs and back, and checks that every frame has
// exactly the length its type and its length fields say.
//
// # Frames
//
// Every frame is a u32 big-endian length followed by that many body bytes,
// 1 <= length <= MaxBody. The body starts with a one-letter type and a u32
// big-endian req_id. Decoding is allocation-free: the byte-slice fields of a
// decoded Request or Response alias the body they were decoded from and are
// valid only until that buffer is reused.
//
// # Versions
//
// Version 2 keeps every frame of version 1 and adds two client frames,
// CANCEL (TypeCancel) and RELEASE_OWNED (TypeReleaseOwned). Version 3 keeps
// every frame of version 2, adds the client frame EXTEND (TypeExtend) and
// its reply KEPT (TypeKept), and extends HELLO_OK with the identity of the
// node's replicated group (Response.Cluster). Which frames a peer may send
// depends on the version its session opened with, so the request decoder
// takes that version: DecodeRequestVersion(body, r, v)
// decodes by the rules of version v. For a HELLO, v is the highest version
// the server speaks: a HELLO asking for a version from 1 to v decodes (the
// layout is the same), any other version is ErrUnsupportedVersion. For
// every later frame, v is the session's version, the Version of the HELLO
// that opened it: on a version-1 session, C and V are unknown types, and so
// is X on a version-1 or version-2 session (ErrUnknownType, which matches
// ErrMalformed: the server answers E(1)), as docs/protocol.md requires. A
// server therefore needs no check of its own; it switches on Request.Type
// and finds TypeCancel, TypeReleaseOwned and TypeExtend only on sessions
// that may send them. A server that speaks only up to version 2 passes
// Version2, not MaxVersion, for a HELLO. DecodeRequest is
// DecodeRequestVersion with version 1: a server that calls it speaks
// exactly version 1 (a version-2 HELLO gets ErrUnsupportedVersion, which it
// answers E(2)).
//
// A CANCEL carries the req_id of the ACQUIRE it names, which is still
// awaiting its reply: a server must not treat it as a reused req_id.
//
// DecodeResponse takes no version: the server-to-client frames of versions
// 1 and 2 are the same, KEPT is a type of its own, and a HELLO_OK carries
// the version the server chose (which the client checks against the one it
// asked for) and has the version-3 layout, with the cluster field, exactly
// when that version byte is 3 or more. A server that pre-encodes HELLO_OK
// and patches the version byte in needs one frame per layout: a version-1
// or version-2 frame patched to 3 lacks the cluster field and is
// malformed.
//
// # Errors
//
// Every decoding error matches ErrMalformed with errors.Is, except a HELLO
// with a version the decoder does not accept, which matches
// ErrUnsupportedVersion (the server answers it with E(2) rather than E(1)).
// The request decoder does not check the ranges of well-formed fields
// (key_len 0, lease_s 0 or above MaxLeaseS): those are answered E(4), so
// the server checks them against the range constants below. The response
// decoder does refuse a HELLO_OK whose cluster_len is above MaxClusterLen
// (malformed: a server must never send one).
// The decoders never panic, whatever the input; they are fuzzed (see
// testdata/fuzz).
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"
)

// Protocol versions, carried in HELLO and HELLO_OK.
const (
	// Version1 is the first version of the protocol.
	Version1 = 1
	// Version2 adds CANCEL and RELEASE_OWNED to version 1.
	Version2 = 2
	// Version3 adds EXTEND and KEPT to version 2, and the cluster identity
	// to HELLO_OK.
	Version3 = 3
	// MaxVersion is the highest version this codec speaks. It is not the
	// version a server or client speaks: each names its own (the codec may
	// know a version before they do).
	MaxVersion = Version3
	// Version is version 1, the version DecodeRequest accepts and every
	// server and client speaks.
	Version = Version1
)

// Protocol constants.
const (
	// HeaderLen is the size of the length prefix of every frame.
	HeaderLen = 4
	// MaxBody is the largest body a frame may carry.
	MaxBody = 1024
	// MaxFrame is the largest whole frame, length prefix included.
	MaxFrame = HeaderLen + MaxBody
	// OwnerLen is the size of the owner field of ACQUIRE, RELEASE_OWNED and
	// EXTEND.
	OwnerLen = 16
	// MaxClusterLen is the largest cluster identity a version-3 HELLO_OK
	// carries (cluster_len 0..64; 0 is a standalone node).
	MaxClusterLen = 64
	// DefaultPort is the TCP port a Ticketing server listens on by default.
	DefaultPort = 5225
)

// Ranges of the request fields (docs/protocol.md). The decoders do not check
// them: a well-formed request with a field out of range is answered E(4)
// (invalid argument), not E(1), so the check is the server's.
const (
	// MinKeyLen and MaxKeyLen bound key_len of ACQUIRE, RELEASE,
	// RELEASE_OWNED and EXTEND.
	MinKeyLen = 1
	MaxKeyLen = 255
	// MaxWaitS bounds wait_s of ACQUIRE (0 is one immediate try).
	MaxWaitS = 255
	// MinLeaseS and MaxLeaseS bound lease_s of ACQUIRE and EXTEND.
	MinLeaseS = 1
	MaxLeaseS = 250
	// MaxTokenLen and MaxNameLen bound the client token and the client name
	// of HELLO.
	MaxTokenLen = 255
	MaxNameLen  = 255
	// MaxWait, MinLease and MaxLease are the same bounds as durations.
	MaxWait  = MaxWaitS * time.Second
	MinLease = MinLeaseS * time.Second
	MaxLease = MaxLeaseS * time.Second
)

// Client-to-server frame types.
const (
	TypeHello   byte = 'H'
	TypeAcquire byte = 'A'
	TypeRelease byte = 'U'
	TypePing    byte = 'P'
	// Version 2 and later only.
	TypeCancel       byte = 'C'
	TypeReleaseOwned byte = 'V'
	// Version 3 and later only.
	TypeExtend byte = 'X'
)

// Server-to-client frame types. TypePong is the same letter as TypePing.
const (
	TypeHelloOK   byte = 'O'
	TypeGranted   byte = 'G'
	TypeTimedOut  byte = 'T'
	TypeBusy      byte = 'B'
	TypeReleased  byte = 'R'
	TypeNotHeld   byte = 'N'
	TypeNotActive byte = 'M'
	TypeError     byte = 'E'
	TypePong      byte = 'P'
	// Version 3 and later only: the reply to EXTEND.
	TypeKept byte = 'K'
)

// Roles carried in HELLO_OK.
const (
	RoleStandalone = 1
	RoleActive     = 2
	RoleLeader     = 3
)

// Error codes carried in an E frame.
const (
	CodeMalformed      uint16 = 1
	CodeVersion        uint16 = 2
	CodeUnauthorized   uint16 = 3
	CodeInvalidArg     uint16 = 4
	CodeShuttingDown   uint16 = 5
	CodeInternal       uint16 = 6
	CodeTooManySession uint16 = 7
)

// CodeName returns a short name for an E code, such as "unauthorized".
func CodeName(code uint16) string {
	switch code {
	case CodeMalformed:
		return "malformed frame or protocol violation"
	case CodeVersion:
		return "unsupported version"
	case CodeUnauthorized:
		return "unauthorized"
	case CodeInvalidArg:
		return "invalid argument"
	case CodeShuttingDown:
		return "shutting down"
	case CodeInternal:
		return "internal error"
	case CodeTooManySession:
		return "too many sessions"
	}
	return fmt.Sprintf("error code %d", code)
}

// Errors returned by the codec.
var (
	// ErrMalformed is matched by every structural decoding or framing error.
	ErrMalformed = errors.New("wire: malformed frame")
	// ErrFrameSize is returned for a length prefix of 0 or above MaxBody; it
	// also matches ErrMalformed.
	ErrFrameSize = &codecError{msg: "wire: frame length out of range (1..1024)", malformed: true}
	// ErrUnknownType is returned for a frame type this direction does not
	// have; it also matches ErrMalformed.
	ErrUnknownType = &codecError{msg: "wire: unknown frame type", malformed: true}
	// ErrUnsupportedVersion is returned for a HELLO whose version byte is
	// not one the decoder accepts (see DecodeRequestVersion). It does not
	// match ErrMalformed.
	ErrUnsupportedVersion = errors.New("wire: unsupported protocol version")
	// ErrFieldTooLong is returned by the encoders for a variable-length field
	// longer than its length prefix can express (or, for the cluster
	// identity of HELLO_OK, than MaxClusterLen), or a frame above MaxBody.
	ErrFieldTooLong = errors.New("wire: field too long to encode")
	// ErrFieldVersion is returned by the encoders for a field the frame's
	// protocol version does not have: a non-empty cluster identity in a
	// HELLO_OK of version 1 or 2.
	ErrFieldVersion = errors.New("wire: field not in this protocol version")
)

type codecError struct {
	msg       string
	malformed bool
}

func (e *codecError) Error() string { return e.msg }

func (e *codecError) Is(target error) bool { return e.malformed && target == ErrMalformed }

// Preallocated errors for the decoders, so that rejecting hostile input does
// not allocate either.
var (
	errShort    = &codecError{msg: "wire: frame body shorter than its type requires", malformed: true}
	errLong     = &codecError{msg: "wire: frame body longer than its type allows", malformed: true}
	errPastEnd  = &codecError{msg: "wire: length field points past the end of the frame", malformed: true}
	errNoHeader = &codecError{msg: "wire: frame body shorter than type and req_id", malformed: true}
	errCluster  = &codecError{msg: "wire: cluster_len above 64", malformed: true}
)

// Request is a client-to-server frame. Only the fields of its Type are used.
type Request struct {
	Type  byte
	ReqID uint32

	// HELLO
	Version   uint8
	AuthToken []byte // client token
	Name      []byte // client name, informational

	// ACQUIRE, RELEASE_OWNED and EXTEND
	Owner [OwnerLen]byte

	// ACQUIRE
	WaitS uint8

	// ACQUIRE and EXTEND
	LeaseS uint8

	// ACQUIRE, RELEASE, RELEASE_OWNED and EXTEND
	Key []byte

	// RELEASE and RELEASE_OWNED: the fencing token to release; EXTEND: the
	// fencing token whose lease to extend.
	Token uint64
}

// Response is a server-to-client frame. Only the fields of its Type are used.
type Response struct {
	Type  byte
	ReqID uint32

	// HELLO_OK
	Version uint8
	Role    uint8
	Node    []byte
	// Cluster is the identity of the node's replicated group (0 to
	// MaxClusterLen bytes, empty for a standalone node). It is on the wire
	// only in a HELLO_OK of version 3 or later.
	Cluster []byte

	// GRANTED
	Token    uint64
	WaitedMS uint32

	// NOT_ACTIVE
	Hint []byte

	// ERROR
	Code uint16
	Msg  []byte
}

// ReqID returns the req_id of a frame body, and false when the body is
// shorter than type plus req_id. It is what a server echoes in an E frame
// that answers a broken request.
func ReqID(body []byte) (uint32, bool) {
	if len(body) < 5 {
		return 0, false
	}
	return binary.BigEndian.Uint32(body[1:5]), true
}

// PutReqID writes id into the req_id of frame, a whole frame (length
// prefix included) of at least HeaderLen+5 bytes: an encoded frame can be
// reused with another req_id without encoding it again.
func PutReqID(frame []byte, id uint32) {
	binary.BigEndian.PutUint32(frame[HeaderLen+1:HeaderLen+5], id)
}

// DecodeRequest decodes one client-to-server frame body (without its length
// prefix) into r by the rules of version 1: it is DecodeRequestVersion(body,
// r, Version1). Slices in r alias body.
func DecodeRequest(body []byte, r *Request) error {
	return DecodeRequestVersion(body, r, Version1)
}

// DecodeRequestVersion decodes one client-to-server frame body (without its
// length prefix) into r by the rules of protocol version v (below 1 counts
// as 1, above MaxVersion as MaxVersion). Slices in r alias body.
//
// For a HELLO, v is the highest version the caller speaks: a HELLO whose
// version byte is 1..v decodes, with r.Version set to it (the version of
// the session it opens); any other returns ErrUnsupportedVersion, with
// r.ReqID and r.Version set. For any other frame, v is the version of the
// session it arrived on: CANCEL and RELEASE_OWNED decode only for v >= 2,
// EXTEND only for v >= 3; below that they are ErrUnknownType (matching
// ErrMalformed).
func DecodeRequestVersion(body []byte, r *Request, v uint8) error {
	v = max(Version1, min(v, MaxVersion))
	if len(body) < 5 {
		return errNoHeader
	}
	r.Type = body[0]
	r.ReqID = binary.BigEndian.Uint32(body[1:5])
	p := body[5:]
	switch r.Type {
	case TypeHello:
		// Version first: a later version may change the layout.
		if len(p) < 1 {
			return errShort
		}
		r.Version = p[0]
		if r.Version < Version1 || r.Version > v {
			return ErrUnsupportedVersion
		}
		p = p[1:]
		var err error
		if r.AuthToken, p, err = lenPrefixed(p); err != nil {
			return err
		}
		if r.Name, p, err = lenPrefixed(p); err != nil {
			return err
		}
		return exhausted(p)
	case TypeAcquire:
		if len(p) < OwnerLen+3 {
			return errShort
		}
		copy(r.Owner[:], p[:OwnerLen])
		r.WaitS = p[OwnerLen]
		r.LeaseS = p[OwnerLen+1]
		var err error
		if r.Key, p, err = lenPrefixed(p[OwnerLen+2:]); err != nil {
			return err
		}
		return exhausted(p)
	case TypeRelease:
		if len(p) < 9 {
			return errShort
		}
		r.Token = binary.BigEndian.Uint64(p[:8])
		var err error
		if r.Key, p, err = lenPrefixed(p[8:]); err != nil {
			return err
		}
		return exhausted(p)
	case TypePing:
		return exhausted(p)
	case TypeCancel:
		if v < Version2 {
			return ErrUnknownType
		}
		return exhausted(p)
	case TypeReleaseOwned:
		if v < Version2 {
			return ErrUnknownType
		}
		if len(p) < 8+OwnerLen+1 {
			return errShort
		}
		r.Token = binary.BigEndian.Uint64(p[:8])
		copy(r.Owner[:], p[8:8+OwnerLen])
		var err error
		if r.Key, p, err = lenPrefixed(p[8+OwnerLen:]); err != nil {
			return err
		}
		return exhausted(p)
	case TypeExtend:
		if v < Version3 {
			return ErrUnknownType
		}
		if len(p) < 8+OwnerLen+2 {
			return errShort
		}
		r.Token = binary.BigEndian.Uint64(p[:8])
		copy(r.Owner[:], p[8:8+OwnerLen])
		r.LeaseS = p[8+OwnerLen]
		var err error
		if r.Key, p, err = lenPrefixed(p[8+OwnerLen+1:]); err != nil {
			return err
		}
		return exhausted(p)
	}
	return ErrUnknownType
}

// DecodeResponse decodes one server-to-client frame body (without its length
// prefix) into r. Slices in r alias body. A HELLO_OK whose version byte is
// 3 or more has the version-3 layout (cluster_len and cluster after node,
// cluster_len at most MaxClusterLen); one of version 1 or 2 ends after node
// and decodes with r.Cluster nil.
func DecodeResponse(body []byte, r *Response) error {
	if len(body) < 5 {
		return errNoHeader
	}
	r.Type = body[0]
	r.ReqID = binary.BigEndian.Uint32(body[1:5])
	p := body[5:]
	switch r.Type {
	case TypeHelloOK:
		if len(p) < 2 {
			return errShort
		}
		r.Version = p[0]
		r.Role = p[1]
		var err error
		if r.Node, p, err = lenPrefixed(p[2:]); err != nil {
			return err
		}
		r.Cluster = nil
		if r.Version >= Version3 {
			if r.Cluster, p, err = lenPrefixed(p); err != nil {
				return err
			}
			if len(r.Cluster) > MaxClusterLen {
				return errCluster
			}
		}
		return exhausted(p)
	case TypeGranted:
		if len(p) < 12 {
			return errShort
		}
		r.Token = binary.BigEndian.Uint64(p[:8])
		r.WaitedMS = binary.BigEndian.Uint32(p[8:12])
		return exhausted(p[12:])
	case TypeTimedOut, TypeBusy, TypeReleased, TypeNotHeld, TypePong, TypeKept:
		return exhausted(p)
	case TypeNotActive:
		var err error
		if r.Hint, p, err = lenPrefixed(p); err != nil {
			return err
		}
		return exhausted(p)
	case TypeError:
		if len(p) < 4 {
			return errShort
		}
		r.Code = binary.BigEndian.Uint16(p[:2])
		n := int(binary.BigEndian.Uint16(p[2:4]))
		p = p[4:]
		if n > len(p) {
			return errPastEnd
		}
		r.Msg = p[:n]
		return exhausted(p[n:])
	}
	return ErrUnknownType
}

func lenPrefixed(p []byte) (field, rest []byte, err error) {
	if len(p) < 1 {
		return nil, nil, errShort
	}
	n := int(p[0])
	if n > len(p)-1 {
		return nil, nil, errPastEnd
	}
	return p[1 : 1+n], p[1+n:], nil
}

func exhausted(p []byte) error {
	if len(p) != 0 {
		return errLong
	}
	return nil
}

// AppendRequest appends r as a whole frame, length prefix included, to dst.
// It checks only what the encoding itself needs (field lengths that fit their
// prefixes, a known type, a body of at most MaxBody); range rules such as
// "lease 1..250" belong to the caller, so that tests can send them broken.
// It encodes the frames of every version (CANCEL, RELEASE_OWNED and EXTEND
// included): which ones a session may carry is the caller's concern.
func AppendRequest(dst []byte, r *Request) ([]byte, error) {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0, r.Type)
	dst = binary.BigEndian.AppendUint32(dst, r.ReqID)
	switch r.Type {
	case TypeHello:
		if len(r.AuthToken) > 255 || len(r.Name) > 255 {
			return dst[:start], ErrFieldTooLong
		}
		dst = append(dst, r.Version, byte(len(r.AuthToken)))
		dst = append(dst, r.AuthToken...)
		dst = append(dst, byte(len(r.Name)))
		dst = append(dst, r.Name...)
	case TypeAcquire:
		if len(r.Key) > 255 {
			return dst[:start], ErrFieldTooLong
		}
		dst = append(dst, r.Owner[:]...)
		dst = append(dst, r.WaitS, r.LeaseS, byte(len(r.Key)))
		dst = append(dst, r.Key...)
	case TypeRelease:
		if len(r.Key) > 255 {
			return dst[:start], ErrFieldTooLong
		}
		dst = binary.BigEndian.AppendUint64(dst, r.Token)
		dst = append(dst, byte(len(r.Key)))
		dst = append(dst, r.Key...)
	case TypeReleaseOwned:
		if len(r.Key) > 255 {
			return dst[:start], ErrFieldTooLong
		}
		dst = binary.BigEndian.AppendUint64(dst, r.Token)
		dst = append(dst, r.Owner[:]...)
		dst = append(dst, byte(len(r.Key)))
		dst = append(dst, r.Key...)
	case TypeExtend:
		if len(r.Key) > 255 {
			return dst[:start], ErrFieldTooLong
		}
		dst = binary.BigEndian.AppendUint64(dst, r.Token)
		dst = append(dst, r.Owner[:]...)
		dst = append(dst, r.LeaseS, byte(len(r.Key)))
		dst = append(dst, r.Key...)
	case TypePing, TypeCancel:
	default:
		return dst[:start], ErrUnknownType
	}
	return finish(dst, start)
}

// AppendResponse appends r as a whole frame, length prefix included, to dst.
// A HELLO_OK has the layout of its Version: from version 3 on it carries
// r.Cluster (at most MaxClusterLen bytes, else ErrFieldTooLong); below
// version 3 a non-empty r.Cluster is ErrFieldVersion, since that layout has
// no room for it.
func AppendResponse(dst []byte, r *Response) ([]byte, error) {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0, r.Type)
	dst = binary.BigEndian.AppendUint32(dst, r.ReqID)
	switch r.Type {
	case TypeHelloOK:
		if len(r.Node) > 255 {
			return dst[:start], ErrFieldTooLong
		}
		if r.Version < Version3 && len(r.Cluster) != 0 {
			return dst[:start], ErrFieldVersion
		}
		if len(r.Cluster) > MaxClusterLen {
			return dst[:start], ErrFieldTooLong
		}
		dst = append(dst, r.Version, r.Role, byte(len(r.Node)))
		dst = append(dst, r.Node...)
		if r.Version >= Version3 {
			dst = append(dst, byte(len(r.Cluster)))
			dst = append(dst, r.Cluster...)
		}
	case TypeGranted:
		dst = binary.BigEndian.AppendUint64(dst, r.Token)
		dst = binary.BigEndian.AppendUint32(dst, r.WaitedMS)
	case TypeTimedOut, TypeBusy, TypeReleased, TypeNotHeld, TypePong, TypeKept:
	case TypeNotActive:
		if len(r.Hint) > 255 {
			return dst[:start], ErrFieldTooLong
		}
		dst = append(dst, byte(len(r.Hint)))
		dst = append(dst, r.Hint...)
	case TypeError:
		if len(r.Msg) > MaxBody-9 {
			return dst[:start], ErrFieldTooLong
		}
		dst = binary.BigEndian.AppendUint16(dst, r.Code)
		dst = binary.BigEndian.AppendUint16(dst, uint16(len(r.Msg)))
		dst = append(dst, r.Msg...)
	default:
		return dst[:start], ErrUnknownType
	}
	return finish(dst, start)
}

func finish(dst []byte, start int) ([]byte, error) {
	n := len(dst) - start - HeaderLen
	if n > MaxBody {
		return dst[:start], ErrFieldTooLong
	}
	binary.BigEndian.PutUint32(dst[start:], uint32(n))
	return dst, nil
}

// Simple frame builders for the fixed-size replies, used on hot paths.

// AppendSimple appends a reply frame with no fields after req_id (T, B, R, N,
// P, and K of version 3). It does not check typ.
func AppendSimple(dst []byte, typ byte, reqID uint32) []byte {
	dst = append(dst, 0, 0, 0, 5, typ)
	return binary.BigEndian.AppendUint32(dst, reqID)
}

// AppendCancel appends a CANCEL frame (version 2) naming the ACQUIRE with
// req_id reqID.
func AppendCancel(dst []byte, reqID uint32) []byte {
	dst = append(dst, 0, 0, 0, 5, TypeCancel)
	return binary.BigEndian.AppendUint32(dst, reqID)
}

// AppendGranted appends a GRANTED frame.
func AppendGranted(dst []byte, reqID uint32, token uint64, waitedMS uint32) []byte {
	dst = append(dst, 0, 0, 0, 17, TypeGranted)
	dst = binary.BigEndian.AppendUint32(dst, reqID)
	dst = binary.BigEndian.AppendUint64(dst, token)
	return binary.BigEndian.AppendUint32(dst, waitedMS)
}

// AppendError appends an ERROR frame; a message that would not fit is cut.
func AppendError(dst []byte, reqID uint32, code uint16, msg string) []byte {
	if len(msg) > MaxBody-9 {
		msg = msg[:MaxBody-9]
	}
	dst = binary.BigEndian.AppendUint32(dst, uint32(9+len(msg)))
	dst = append(dst, TypeError)
	dst = binary.BigEndian.AppendUint32(dst, reqID)
	dst = binary.BigEndian.AppendUint16(dst, code)
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(msg)))
	return append(dst, msg...)
}

// Reader reads frames from a byte stream. It owns one MaxBody buffer and
// allocates nothing per frame. It is not safe for concurrent use.
type Reader struct {
	r   io.Reader
	buf [MaxBody]byte
}

// NewReader returns a Reader over r. Wrap r in a bufio.Reader to read many
// small frames with few system calls.
func NewReader(r io.Reader) *Reader { return &Reader{r: r} }

// Next reads one frame and returns its body, valid until the next call. A
// length prefix of 0 or above MaxBody returns ErrFrameSize without reading
// the body. A stream that ends between frames returns io.EOF; one that ends
// inside a frame returns io.ErrUnexpectedEOF.
func (fr *Reader) Next() ([]byte, error) {
	hdr := fr.buf[:HeaderLen]
	if _, err := io.ReadFull(fr.r, hdr); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr)
	if n == 0 || n > MaxBody {
		return nil, ErrFrameSize
	}
	body := fr.buf[:n]
	if _, err := io.ReadFull(fr.r, body); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return body, nil
}
