package images

import (
	"context"
	"fmt"
	"slices"
)

// UpdateLock resolves a new lock from apt's current package index: the candidate version of each
// root package, plus, for every shared library the QEMU layer's files need and no locked package
// has, the package that provides it, searched in the needing package's dependencies (Depends,
// Pre-Depends), breadth first. Only packages that provide a file the images carry are locked.
func UpdateLock(ctx context.Context, f *Fetcher) (*Lock, error) {
	l := &Lock{}
	t := tree{}
	controls := map[string]Control{}
	lockPkg := func(pkg string) error {
		e, err := f.Candidate(ctx, pkg)
		if err != nil {
			return err
		}
		c, err := unpackEntry(ctx, f, e, t)
		if err != nil {
			return err
		}
		controls[pkg] = c
		l.Entries = append(l.Entries, e)
		l.sort()
		return nil
	}
	for _, p := range RootPackages {
		if err := lockPkg(p); err != nil {
			return nil, err
		}
	}
	// Packages looked into and found not to provide what was missing, with their trees, so
	// each is fetched and unpacked once.
	probed := map[string]tree{}
	probedControls := map[string]Control{}
	for {
		sel := newSelection(t)
		for _, file := range qemuFiles() {
			if err := sel.add(file); err != nil {
				return nil, fmt.Errorf("QEMU layer: %w", err)
			}
		}
		if len(sel.missing) == 0 {
			return l, nil
		}
		m := sel.missing[0]
		provider, err := findProvider(ctx, f, m, controls, probed, probedControls)
		if err != nil {
			return nil, err
		}
		if err := lockPkg(provider); err != nil {
			return nil, err
		}
	}
}

// findProvider searches the dependencies of the package needing m, breadth first, for one that
// has the library in a library directory.
func findProvider(ctx context.Context, f *Fetcher, m *MissingLibraryError, locked map[string]Control, probed map[string]tree, probedControls map[string]Control) (string, error) {
	queue := slices.Clone(locked[m.Package].Depends)
	seen := map[string]bool{}
	for len(queue) > 0 {
		pkg := queue[0]
		queue = queue[1:]
		if seen[pkg] {
			continue
		}
		seen[pkg] = true
		if _, ok := locked[pkg]; ok {
			queue = append(queue, locked[pkg].Depends...)
			continue
		}
		pt, ok := probed[pkg]
		if !ok {
			e, err := f.Candidate(ctx, pkg)
			if err != nil {
				// A virtual package or one of another architecture: it provides no library here.
				probed[pkg] = tree{}
				continue
			}
			pt = tree{}
			c, err := unpackEntry(ctx, f, e, pt)
			if err != nil {
				return "", err
			}
			probed[pkg], probedControls[pkg] = pt, c
		}
		s := newSelection(pt)
		if _, ok := s.findLib(m.Soname, m.RunPath); ok {
			return pkg, nil
		}
		queue = append(queue, probedControls[pkg].Depends...)
	}
	return "", fmt.Errorf("%w, nor in any package its package depends on", m)
}

// CheckLock tells whether apt can still fetch every locked package as locked, from its package
// index alone (nothing is downloaded). The error names the first package that it cannot.
func CheckLock(ctx context.Context, f *Fetcher, l *Lock) error {
	index, err := f.Indexed(ctx, l)
	if err != nil {
		return err
	}
	for _, e := range l.Entries {
		got := index[e.Package]
		if got.SHA256 != e.SHA256 || got.Arch != e.Arch {
			return &NotFetchableError{Package: e.Package, Version: e.Version,
				Reason: fmt.Sprintf("apt's index gives it sha256 %s (%s), the lock names %s (%s)", got.SHA256, got.Arch, e.SHA256, e.Arch)}
		}
	}
	return nil
}
