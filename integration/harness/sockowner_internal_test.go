package harness

import (
	"net"
	"os"
	"runtime"
	"testing"
)

// TestSocketOwner: the owner of a connection's client socket is found
// among the given pids (this process), and not found when its pid is not
// listed or the pair of ports matches no socket.
func TestSocketOwner(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("socketOwner reads /proc (Linux only)")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	client := s.RemoteAddr().(*net.TCPAddr) // what a proxy sees
	server := ln.Addr().(*net.TCPAddr)
	if got, err := socketOwner(client, server, []int{1 << 30, os.Getpid()}); err != nil || got != 1 {
		t.Errorf("socketOwner with this process listed second = %d, %v; want 1", got, err)
	}
	if got, err := socketOwner(client, server, []int{1 << 30}); err != nil || got != -1 {
		t.Errorf("socketOwner without this process = %d, %v; want -1", got, err)
	}
	// A pair of ports no socket has.
	other := &net.TCPAddr{IP: client.IP, Port: server.Port}
	if got, err := socketOwner(other, other, []int{os.Getpid()}); err != nil || got != -1 {
		t.Errorf("socketOwner of a socket that does not exist = %d, %v; want -1", got, err)
	}
}
