// Package atomicfile replaces files whole: a reader, or a node that crashed, sees the old content
// or the new, never a part of either.
package atomicfile

import (
	"os"
	"path/filepath"
)

// Write makes path, with mode perm, from what write puts in a temporary file of its own beside it
// (two writers of one path, processes or goroutines, never share one), then renames it over path.
// A crash may lose the new file, but never leaves a half-written one at path: for files remade
// when lost (an overlay made for one start of a VM, a cache entry).
func Write(path string, perm os.FileMode, write func(*os.File) error) error {
	return replace(path, perm, false, write)
}

// WriteDurably is Write that also syncs the file before the rename and the directory after it,
// so that once it returns the new file survives a crash of the node: for state that cannot be
// remade (a VM's EFI variables, which TPM state is current).
func WriteDurably(path string, perm os.FileMode, write func(*os.File) error) error {
	return replace(path, perm, true, write)
}

func replace(path string, perm os.FileMode, durable bool, write func(*os.File) error) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // fails harmlessly once renamed
	err = write(tmp)
	if err == nil {
		// CreateTemp makes 0600 whatever the umask; Chmod sets perm exactly, umask or not.
		err = tmp.Chmod(perm)
	}
	if err == nil && durable {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	if !durable {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
