package proctest

import (
	"net"
	"strconv"
	"testing"
)

// TestFreePortRun: every port of a run can be listened on, is below the
// ephemeral range (so no port-0 listener or outgoing connection can be
// given it meanwhile), and no port is handed out twice.
func TestFreePortRun(t *testing.T) {
	seen := map[int]bool{}
	for range 20 {
		base, err := FreePortRun("127.0.0.1", 3)
		if err != nil {
			t.Fatal(err)
		}
		for p := base; p < base+3; p++ {
			if p < portMin || p >= ephemeralLow() {
				t.Fatalf("port %d outside %d..%d", p, portMin, ephemeralLow()-1)
			}
			if seen[p] {
				t.Fatalf("port %d handed out twice", p)
			}
			seen[p] = true
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
			if err != nil {
				t.Fatalf("port %d of a fresh run: %v", p, err)
			}
			l.Close()
		}
	}
}
