// Package deploytest reads back the archives that internal/deploy writes
// (Bundle.WriteTarGz, Bundle.WriteZip), for the tests of the generator
// and of the pages that serve its archives.
package deploytest

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"io/fs"
)

// Entry is one member of an archive: a file or a directory.
type Entry struct {
	Name string
	Mode fs.FileMode // with fs.ModeDir for a directory
	Data []byte
}

// ReadTarGz returns the members of a gzip-compressed tar archive, in
// their order.
func ReadTarGz(r io.Reader) ([]Entry, error) {
	gz, err := gzip.NewReader(r)
	if err != nil {
		return nil, err
	}
	tr := tar.NewReader(gz)
	var out []Entry
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return nil, err
		}
		out = append(out, Entry{Name: h.Name, Mode: h.FileInfo().Mode(), Data: data})
	}
}

// ReadZip returns the members of a zip archive, in their order.
func ReadZip(b []byte) ([]Entry, error) {
	zr, err := zip.NewReader(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		return nil, err
	}
	out := make([]Entry, 0, len(zr.File))
	for _, f := range zr.File {
		rc, err := f.Open()
		if err != nil {
			return nil, err
		}
		data, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return nil, err
		}
		out = append(out, Entry{Name: f.Name, Mode: f.Mode(), Data: data})
	}
	return out, nil
}
