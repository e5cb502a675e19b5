package harness

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// errNoProcNet is returned where /proc/net/tcp cannot be read (not Linux).
var errNoProcNet = errors.New("harness: /proc/net/tcp unreadable: telling which process owns a socket needs Linux")

// socketOwner returns the index in pids of the process holding the TCP
// socket of this host whose local address is local and whose peer is
// remote: for a connection accepted by a proxy, local is the client's
// address (Conn.ClientAddr) and remote the proxy's listening address. It
// returns -1 if none of pids holds it (the socket is gone, or another
// process owns it). It reads /proc/net/tcp, tcp6 and /proc/PID/fd, so it
// works on Linux only (errNoProcNet elsewhere).
func socketOwner(local, remote *net.TCPAddr, pids []int) (int, error) {
	inode, err := socketInode(local.Port, remote.Port)
	if err != nil {
		return -1, err
	}
	if inode == "" {
		return -1, nil
	}
	link := "socket:[" + inode + "]"
	for i, pid := range pids {
		if pid <= 0 {
			continue
		}
		dir := fmt.Sprintf("/proc/%d/fd", pid)
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue // exited
		}
		for _, e := range ents {
			if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && l == link {
				return i, nil
			}
		}
	}
	return -1, nil
}

// socketInode finds the inode of the TCP socket with the given local and
// remote ports in /proc/net/tcp and tcp6 ("" if there is none).
func socketInode(localPort, remotePort int) (string, error) {
	readable := false
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		fh, err := os.Open(f)
		if err != nil {
			continue
		}
		readable = true
		sc := bufio.NewScanner(fh)
		sc.Scan() // header
		for sc.Scan() {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...
			fs := strings.Fields(sc.Text())
			if len(fs) < 10 {
				continue
			}
			if hexPort(fs[1]) == localPort && hexPort(fs[2]) == remotePort {
				fh.Close()
				return fs[9], nil
			}
		}
		fh.Close()
	}
	if !readable {
		return "", errNoProcNet
	}
	return "", nil
}

// hexPort parses the port of a /proc/net/tcp address ("0100007F:1F90").
func hexPort(a string) int {
	_, p, ok := strings.Cut(a, ":")
	if !ok {
		return -1
	}
	v, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return -1
	}
	return int(v)
}
