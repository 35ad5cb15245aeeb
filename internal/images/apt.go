package images

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// Fetcher gets the .deb files of lock entries with apt (`apt-get download PKG=VERSION`, which
// checks them against the archive's signed index) into a cache outside the repository, where a
// file is named by package, version and architecture and used again only if its SHA-256 is the
// lock's.
type Fetcher struct {
	// CacheDir holds the .deb files.
	CacheDir string
	// NoUpdate keeps apt's package lists as they are when a command fails (see apt).
	NoUpdate bool

	updateOnce sync.Once
	updateErr  error
}

// NotFetchableError is a lock entry that apt cannot fetch as locked: the version is gone from the
// archive (Debian keeps only the current one of a stable release), or the file apt fetched is not
// the one the lock names.
type NotFetchableError struct {
	Package, Version string
	Reason           string
}

func (e *NotFetchableError) Error() string {
	return fmt.Sprintf("package %s %s: %s; the lock is out of date: run 'make images-lock' and commit hack/images/debs.lock",
		e.Package, e.Version, e.Reason)
}

// debName is the file name apt-get download gives a package (the epoch colon escaped).
func debName(e LockEntry) string {
	return fmt.Sprintf("%s_%s_%s.deb", e.Package, strings.ReplaceAll(e.Version, ":", "%3a"), e.Arch)
}

// Fetch returns the cached .deb of e, fetching it first if the cache has no file with e's hash.
func (f *Fetcher) Fetch(ctx context.Context, e LockEntry) (string, error) {
	files, err := f.FetchAll(ctx, []LockEntry{e})
	if err != nil {
		return "", err
	}
	return files[0], nil
}

// FetchAll returns the cached .deb files of entries, in their order, fetching those the cache
// lacks with one apt-get run (each apt run reads all of apt's package lists: seconds). When it
// fails, each is fetched alone, so that the error names the package apt cannot fetch.
func (f *Fetcher) FetchAll(ctx context.Context, entries []LockEntry) ([]string, error) {
	files := make([]string, len(entries))
	var missing []LockEntry
	for i, e := range entries {
		if err := e.validate(); err != nil {
			return nil, err
		}
		files[i] = filepath.Join(f.CacheDir, debName(e))
		if sum, err := fileSHA256(files[i]); err != nil || sum != e.SHA256 {
			missing = append(missing, e)
		}
	}
	if len(missing) == 0 {
		return files, nil
	}
	if err := f.download(ctx, missing); err != nil && len(missing) > 1 {
		for _, e := range missing {
			if err := f.download(ctx, []LockEntry{e}); err != nil {
				return nil, err
			}
		}
	} else if err != nil {
		return nil, err
	}
	return files, nil
}

// download fetches entries into the cache, checking each file's hash against the lock.
func (f *Fetcher) download(ctx context.Context, entries []LockEntry) error {
	if err := os.MkdirAll(f.CacheDir, 0o755); err != nil {
		return fmt.Errorf("deb cache: %w", err)
	}
	tmp, err := os.MkdirTemp(f.CacheDir, ".download-")
	if err != nil {
		return fmt.Errorf("deb cache: %w", err)
	}
	defer os.RemoveAll(tmp)
	args := []string{"download", "-q"}
	for _, e := range entries {
		arg := e.Package + ":" + e.Arch + "=" + e.Version
		if e.Arch == "all" {
			arg = e.Package + "=" + e.Version
		}
		args = append(args, arg)
	}
	if out, err := f.apt(ctx, tmp, "apt-get", args...); err != nil {
		e := entries[0]
		return &NotFetchableError{Package: e.Package, Version: e.Version, Reason: "apt cannot fetch it: " + aptMessage(out, err)}
	}
	for _, e := range entries {
		got := filepath.Join(tmp, debName(e))
		sum, err := fileSHA256(got)
		if err != nil {
			return &NotFetchableError{Package: e.Package, Version: e.Version, Reason: fmt.Sprintf("apt-get download left no %s: %v", debName(e), err)}
		}
		if sum != e.SHA256 {
			return &NotFetchableError{Package: e.Package, Version: e.Version,
				Reason: fmt.Sprintf("apt fetched a file with sha256 %s, the lock names %s", sum, e.SHA256)}
		}
		if err := os.Rename(got, filepath.Join(f.CacheDir, debName(e))); err != nil {
			return fmt.Errorf("deb cache: %w", err)
		}
	}
	return nil
}

// Candidate is the version of pkg that apt would install now, with the hash of its file, read
// from apt's package index (`apt-cache show --no-all-versions`).
func (f *Fetcher) Candidate(ctx context.Context, pkg string) (LockEntry, error) {
	out, err := f.apt(ctx, "", "apt-cache", "show", "--no-all-versions", pkg)
	if err != nil {
		return LockEntry{}, fmt.Errorf("package %s: apt knows no candidate: %s", pkg, aptMessage(out, err))
	}
	return indexEntry(pkg, out)
}

// Indexed are the entries of apt's package index for the lock's packages at the locked
// versions, by package name, read with one apt-cache run. A version apt no longer has is an error
// naming the package.
func (f *Fetcher) Indexed(ctx context.Context, l *Lock) (map[string]LockEntry, error) {
	args := []string{"show", "--no-all-versions"}
	for _, e := range l.Entries {
		args = append(args, e.Package+"="+e.Version)
	}
	out, err := f.apt(ctx, "", "apt-cache", args...)
	got := map[string]LockEntry{}
	for _, para := range strings.Split(string(out), "\n\n") {
		if e, perr := indexEntry("", []byte(para)); perr == nil {
			got[e.Package] = e
		}
	}
	for _, e := range l.Entries {
		if g, ok := got[e.Package]; !ok || g.Version != e.Version {
			reason := "apt has no such version"
			if err != nil {
				reason += ": " + aptMessage(out, err)
			}
			return nil, &NotFetchableError{Package: e.Package, Version: e.Version, Reason: reason}
		}
	}
	return got, nil
}

// indexEntry reads the first paragraph of apt-cache show's output.
func indexEntry(pkg string, out []byte) (LockEntry, error) {
	para, _, _ := bytes.Cut(out, []byte("\n\n"))
	fields := map[string]string{}
	for _, line := range strings.Split(string(para), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && !strings.HasPrefix(line, " ") {
			fields[k] = strings.TrimSpace(v)
		}
	}
	e := LockEntry{Package: fields["Package"], Version: fields["Version"], Arch: fields["Architecture"], SHA256: fields["SHA256"]}
	if pkg != "" && e.Package != pkg {
		return LockEntry{}, fmt.Errorf("package %s: apt-cache show answered for %q", pkg, e.Package)
	}
	if err := e.validate(); err != nil {
		return LockEntry{}, fmt.Errorf("apt-cache show: %w", err)
	}
	return e, nil
}

// apt runs an apt command in dir. When it fails the first time, apt's package lists are updated
// (once per Fetcher, as root only) and it is run again: a machine whose lists predate the lock
// knows neither the locked versions nor their files.
func (f *Fetcher) apt(ctx context.Context, dir, name string, args ...string) ([]byte, error) {
	run := func() ([]byte, error) {
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = dir
		return cmd.CombinedOutput()
	}
	out, err := run()
	if err == nil || f.NoUpdate || os.Geteuid() != 0 || ctx.Err() != nil {
		return out, err
	}
	f.updateOnce.Do(func() {
		if uout, uerr := exec.CommandContext(ctx, "apt-get", "update", "-qq").CombinedOutput(); uerr != nil {
			f.updateErr = fmt.Errorf("apt-get update: %s", aptMessage(uout, uerr))
		}
	})
	if f.updateErr != nil {
		return out, err
	}
	return run()
}

// aptMessage is apt's error lines, or the exit error when it printed none.
func aptMessage(out []byte, err error) string {
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "E: ") || strings.HasPrefix(l, "N: ") {
			lines = append(lines, strings.TrimSpace(l))
		}
	}
	if len(lines) == 0 {
		var ee *exec.ExitError
		if errors.As(err, &ee) && len(bytes.TrimSpace(out)) > 0 {
			return strings.TrimSpace(string(out))
		}
		return err.Error()
	}
	return strings.Join(lines, " ")
}

func fileSHA256(p string) (string, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}
