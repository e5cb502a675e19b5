package lockcore

import (
	"testing"
	"unsafe"
)

// TestEntrySize keeps an entry in the 96-byte size class: a standalone
// server holds millions, and the lock browser's session identity
// (entry.client) had to fit in it.
func TestEntrySize(t *testing.T) {
	if n := unsafe.Sizeof(entry{}); n > 96 {
		t.Fatalf("entry is %d bytes, more than its 96-byte size class", n)
	}
}

// TestAddPage: a page stays sorted and cut to its limit whatever order the
// keys come in, and says when something was left out.
func TestAddPage(t *testing.T) {
	var page []LockInfo
	var more bool
	for _, k := range []string{"e", "b", "f", "a", "d", "c"} {
		var cut bool
		page, cut = addPage(page, LockInfo{Key: k}, 3)
		more = more || cut
	}
	if len(page) != 3 || page[0].Key != "a" || page[1].Key != "b" || page[2].Key != "c" || !more {
		t.Fatalf("page %v more %v, want a b c and more", page, more)
	}
	if p, cut := addPage(nil, LockInfo{Key: "a"}, 0); len(p) != 0 || !cut {
		t.Fatalf("limit 0: %v %v", p, cut)
	}
}
