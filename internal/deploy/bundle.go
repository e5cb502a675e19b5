package deploy

import (
	"archive/tar"
	"archive/zip"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"time"
)

// WriteDir writes the bundle into dir (created if missing). Unless force,
// it refuses with an *ExistsError, before writing anything, if one of the
// bundle's files exists there. Every file gets exactly its mode (the
// umask does not change it); a file that exists (force) is replaced.
func (b *Bundle) WriteDir(dir string, force bool) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("deploy: %w", err)
	}
	if !force {
		for _, f := range b.Files {
			p := filepath.Join(dir, filepath.FromSlash(f.Path))
			if _, err := os.Lstat(p); err == nil && !f.Mode.IsDir() {
				return &ExistsError{Path: p, Dir: dir}
			}
		}
	}
	for _, f := range b.Files {
		p := filepath.Join(dir, filepath.FromSlash(f.Path))
		if f.Mode.IsDir() {
			if err := os.MkdirAll(p, f.Mode.Perm()); err != nil {
				return fmt.Errorf("deploy: %w", err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			return fmt.Errorf("deploy: %w", err)
		}
		if err := writeFile(p, f.Data, f.Mode.Perm()); err != nil {
			return err
		}
	}
	return nil
}

// writeFile creates path with perm (exactly: umask does not widen or
// narrow key files), replacing any existing file.
func writeFile(path string, data []byte, perm os.FileMode) error {
	_ = os.Remove(path) // force: a fresh file gets perm, an old one might keep wider bits
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return fmt.Errorf("deploy: write %w", err)
	}
	err = f.Chmod(perm)
	if err == nil {
		_, err = f.Write(data)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("deploy: write %s: %w", path, err)
	}
	return nil
}

// Root is the directory the archives put the bundle in: the base name of
// its Dir, so that unpacked beside Dir's parent it is where the guide
// says.
func (b *Bundle) Root() string {
	r := filepath.Base(filepath.Clean(b.Dir))
	if r == "." || r == ".." || r == "/" || r == string(filepath.Separator) || badPath(r) != "" {
		return "ticketing"
	}
	return r
}

// WriteTarGz writes the bundle as a gzip-compressed tar archive of one
// directory (the base name of Dir), every file and directory with its
// mode: secrets 0600.
func (b *Bundle) WriteTarGz(w io.Writer) error {
	gz := gzip.NewWriter(w)
	tw := tar.NewWriter(gz)
	now := time.Now()
	root := b.Root()
	err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: root + "/", Mode: 0o755, ModTime: now})
	for _, f := range b.Files {
		if err != nil {
			break
		}
		h := &tar.Header{Name: path.Join(root, f.Path), Mode: int64(f.Mode.Perm()), ModTime: now}
		if f.Mode.IsDir() {
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
			err = tw.WriteHeader(h)
			continue
		}
		h.Typeflag, h.Size = tar.TypeReg, int64(len(f.Data))
		if err = tw.WriteHeader(h); err == nil {
			_, err = tw.Write(f.Data)
		}
	}
	err = errors.Join(err, tw.Close(), gz.Close())
	if err != nil {
		return fmt.Errorf("deploy: tar.gz: %w", err)
	}
	return nil
}

// WriteZip writes the bundle as a zip archive of one directory (the base
// name of Dir), every file and directory with its mode (in the Unix
// attributes that unzip restores): secrets 0600.
func (b *Bundle) WriteZip(w io.Writer) error {
	zw := zip.NewWriter(w)
	now := time.Now()
	root := b.Root()
	entry := func(name string, mode fs.FileMode, data []byte) error {
		h := &zip.FileHeader{Name: name, Method: zip.Deflate, Modified: now}
		if mode.IsDir() {
			h.Method = zip.Store
		}
		h.SetMode(mode)
		fw, err := zw.CreateHeader(h)
		if err == nil && !mode.IsDir() {
			_, err = fw.Write(data)
		}
		return err
	}
	err := entry(root+"/", fs.ModeDir|0o755, nil)
	for _, f := range b.Files {
		if err != nil {
			break
		}
		name := path.Join(root, f.Path)
		if f.Mode.IsDir() {
			name += "/"
		}
		err = entry(name, f.Mode, f.Data)
	}
	if err = errors.Join(err, zw.Close()); err != nil {
		return fmt.Errorf("deploy: zip: %w", err)
	}
	return nil
}
