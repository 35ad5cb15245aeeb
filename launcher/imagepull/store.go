package imagepull

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Store is a node's image cache kept by one trusted process (a virtual node's provider, which
// stands in for the kubelet's image volumes). Unlike Cache, which a user's launchers share, no
// tenant can write to it or hold its locks:
//
//	Dir/sha256-<hex>/rootfs         the image's filesystem; root's, read-only to everyone else
//	Dir/sha256-<hex>/manifest.json  every entry of rootfs with its stamp (and a file's sha256);
//	                                an entry without one is incomplete and removed
//	Dir/refs/<escaped ref>          the digest a tag resolved to
//	Dir/tmp-*                       unpacking in progress or being removed; cleaned by OpenStore
//
// Trust is checked at three points: layers are verified against their digests while they are
// unpacked (go-containerregistry checks each blob it reads), OpenStore re-hashes every file
// against its manifest, and each Acquire compares the stamps (inode, size, mode, mtime, ctime) of
// the entry's files with the manifest, which costs a stat per file, not a read. ctime cannot be
// set back by anyone, so a file changed after unpacking is found; that entry is thrown away and the
// image pulled again.
//
// Safe for concurrent use within the process; locks are the process's own. Another process must
// not use Dir.
type Store struct {
	opts StoreOptions

	mu      sync.Mutex
	locks   map[string]*sync.Mutex // by digest; held while an entry is checked, pulled or removed
	users   map[string]int         // leases not yet released, by digest
	sizes   map[string]int64       // unpacked bytes, by digest
	touched map[string]time.Time   // last Acquire, by digest (the entry directory's mtime on disk)
}

// StoreOptions configure a Store.
type StoreOptions struct {
	// Dir is the cache directory; OpenStore creates it (mode 0755, the caller's).
	Dir string
	// Insecure lists the registries (host:port) that may be reached over plain HTTP.
	Insecure []string
	// MaxBytes caps the unpacked size of the images no lease holds: past it, the least recently
	// used of them are removed. Zero means no cap.
	MaxBytes int64
	// Timeout bounds one pull; 10 minutes when zero.
	Timeout time.Duration
}

// Lease is an image held in the store until Release: it is not evicted meanwhile.
type Lease struct {
	// Dir is the image's unpacked filesystem.
	Dir string
	// ImageRef is the image by digest (repository@sha256:...), as a kubelet reports an image
	// volume's imageRef.
	ImageRef string
	// Discarded, when not nil, says why the cached copy of the image was thrown away and pulled
	// again (it had changed after unpacking).
	Discarded error

	release func()
}

// Release gives the image up; it may be evicted once no lease holds it. Safe to call twice.
func (l *Lease) Release() {
	if l.release != nil {
		l.release()
		l.release = nil
	}
}

// TamperedError is a cache entry whose files changed after they were unpacked.
type TamperedError struct {
	Digest string
	Path   string // inside the image
	Reason string
}

func (e *TamperedError) Error() string {
	return fmt.Sprintf("cached image %s changed after unpacking: %s %s", e.Digest, e.Path, e.Reason)
}

// OpenStore opens (creating) the cache at opts.Dir, removes what an earlier run left half done
// and verifies every cached image against its manifest, removing those that do not match.
func OpenStore(opts StoreOptions) (*Store, error) {
	s := &Store{opts: opts, locks: map[string]*sync.Mutex{}, users: map[string]int{},
		sizes: map[string]int64{}, touched: map[string]time.Time{}}
	if opts.Dir == "" || !filepath.IsAbs(opts.Dir) {
		return nil, fmt.Errorf("image store: directory %q is not an absolute path", opts.Dir)
	}
	for _, d := range []string{opts.Dir, filepath.Join(opts.Dir, "refs")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("image store: %w", err)
		}
		// Whatever made it before, only this process may write to it now.
		if err := os.Chown(d, os.Geteuid(), os.Getegid()); err != nil {
			return nil, fmt.Errorf("image store: %w", err)
		}
		if err := os.Chmod(d, 0o755); err != nil {
			return nil, fmt.Errorf("image store: %w", err)
		}
	}
	entries, err := os.ReadDir(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if err := s.openEntry(e); err != nil {
			errs = append(errs, err)
		}
	}
	return s, errors.Join(errs...)
}

// openEntry removes a leftover, or verifies an image entry in full and records its size and
// last use; an entry that fails verification is removed.
func (s *Store) openEntry(e os.DirEntry) error {
	path := filepath.Join(s.opts.Dir, e.Name())
	if strings.HasPrefix(e.Name(), "tmp-") {
		return os.RemoveAll(path)
	}
	digest, ok := entryDigest(e.Name())
	if !ok {
		return nil
	}
	m, err := readManifest(path)
	if err == nil {
		err = m.verify(filepath.Join(path, "rootfs"), true)
	}
	if err != nil {
		return s.discard(digest)
	}
	s.sizes[digest] = m.Size
	if fi, err := e.Info(); err == nil {
		s.touched[digest] = fi.ModTime()
	}
	return nil
}

// entryDigest is the digest of an entry directory's name (sha256-<hex>).
func entryDigest(dir string) (string, bool) {
	alg, hex, ok := strings.Cut(dir, "-")
	if !ok || strings.Contains(hex, ".") {
		return "", false
	}
	h, err := v1.NewHash(alg + ":" + hex)
	if err != nil {
		return "", false
	}
	return h.String(), true
}

func (s *Store) entryDir(digest string) string {
	return filepath.Join(s.opts.Dir, strings.Replace(digest, ":", "-", 1))
}

// Acquire returns image unpacked, pulling it with auth's credentials when policy says so or the
// cached copy changed after unpacking. Errors name the image.
func (s *Store) Acquire(ctx context.Context, image string, policy PullPolicy, auth authn.Keychain) (*Lease, error) {
	l, err := s.acquire(ctx, image, policy, auth)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", image, err)
	}
	s.evict()
	return l, nil
}

func (s *Store) acquire(ctx context.Context, image string, policy PullPolicy, auth authn.Keychain) (*Lease, error) {
	ref, err := parseRef(image, s.opts.Insecure)
	if err != nil {
		return nil, err
	}
	if policy, err = effectivePolicy(ref, policy); err != nil {
		return nil, err
	}
	timeout := s.opts.Timeout
	if timeout == 0 {
		timeout = 10 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	p := puller{ref: ref, insecure: s.opts.Insecure, auth: auth}
	digest, known := s.knownDigest(ref)
	asked := policy == PullAlways || !known // the registry is asked with p's credentials
	if asked {
		if policy == PullNever {
			return nil, errors.New("not in this node's cache and imagePullPolicy is Never")
		}
		if digest, err = p.resolve(ctx); err != nil {
			return nil, err
		}
	}
	unlock := s.lock(digest)
	defer unlock()
	l, err := s.use(ctx, p, digest, policy, asked)
	if err != nil {
		return nil, err
	}
	if _, ok := ref.(name.Tag); ok {
		if err := writeAtomic(s.refFile(ref), []byte(digest+"\n")); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// use checks digest's entry (under its lock) and leases it, pulling it first when it is missing,
// was changed after unpacking, or has no pull record. An entry pulled with credentials goes to a
// requester the registry was not asked for (asked false: a cache hit) only once the registry the
// entry came from accepts the requester's own credentials for its digest, as a kubelet with
// KubeletEnsureSecretPulledImages does: one tenant's private image must not reach another
// tenant's pod through a node's cache, whatever repository that pod names.
func (s *Store) use(ctx context.Context, p puller, digest string, policy PullPolicy, asked bool) (*Lease, error) {
	dir := s.entryDir(digest)
	var discarded error
	m, err := readManifest(dir)
	var rec pullRecord
	if err == nil {
		err = m.verify(filepath.Join(dir, "rootfs"), false)
		if err == nil {
			rec, err = readPullRecord(dir)
		}
		if err != nil {
			discarded = err
			if derr := s.discard(digest); derr != nil {
				return nil, errors.Join(err, derr)
			}
		}
	}
	if err == nil && !asked && rec.repository != "" {
		if herr := s.checkAccess(ctx, p, rec.repository, digest); herr != nil {
			return nil, fmt.Errorf("this node's copy was pulled with credentials, and %s does not accept this pull's for it: %w", rec.repository, herr)
		}
	}
	if err != nil {
		if policy == PullNever {
			return nil, fmt.Errorf("imagePullPolicy is Never and the cached copy is unusable: %w", err)
		}
		if m, err = s.pull(ctx, p, digest); err != nil {
			return nil, err
		}
	}
	now := time.Now()
	_ = os.Chtimes(dir, now, now)
	s.mu.Lock()
	s.users[digest]++
	s.sizes[digest] = m.Size
	s.touched[digest] = now
	s.mu.Unlock()
	var once sync.Once
	return &Lease{Dir: filepath.Join(dir, "rootfs"), ImageRef: p.ref.Context().Name() + "@" + digest, Discarded: discarded,
		release: func() {
			once.Do(func() {
				s.mu.Lock()
				s.users[digest]--
				s.mu.Unlock()
			})
		}}, nil
}

// pull fetches digest's image and unpacks it into its entry with a manifest.
func (s *Store) pull(ctx context.Context, p puller, digest string) (*manifest, error) {
	img, err := p.image(ctx, digest)
	if err != nil {
		return nil, err
	}
	dir := s.entryDir(digest)
	if err := unpackImage(img, s.opts.Dir, dir); err != nil {
		return nil, err
	}
	m, err := newManifest(digest, filepath.Join(dir, "rootfs"))
	if err != nil {
		return nil, errors.Join(err, s.discard(digest))
	}
	// Recorded before the manifest makes the entry usable; an entry without a record is pulled
	// again (use), so none is ever handed out as anonymous by mistake.
	rec := pullRecord{}
	if p.credentialed() {
		rec.repository = p.ref.Context().Name()
	}
	if err := writeAtomic(filepath.Join(dir, pullRecordFile), rec.encode()); err != nil {
		return nil, errors.Join(err, s.discard(digest))
	}
	if err := m.write(dir); err != nil {
		return nil, errors.Join(err, s.discard(digest))
	}
	return m, nil
}

// pullRecordFile says how an entry was pulled: "anonymous", or "credentials REPOSITORY", the
// repository whose registry took the credentials.
const pullRecordFile = "pull-record"

// checkTimeout bounds the access check of a cache hit, which holds the entry's lock.
const checkTimeout = 30 * time.Second

type pullRecord struct {
	repository string // "" for an anonymous pull
}

func (r pullRecord) encode() []byte {
	if r.repository == "" {
		return []byte("anonymous\n")
	}
	return []byte("credentials " + r.repository + "\n")
}

func readPullRecord(dir string) (pullRecord, error) {
	b, err := os.ReadFile(filepath.Join(dir, pullRecordFile))
	if err != nil {
		return pullRecord{}, fmt.Errorf("read the pull record: %w", err)
	}
	line := strings.TrimSpace(string(b))
	if line == "anonymous" {
		return pullRecord{}, nil
	}
	if repo, ok := strings.CutPrefix(line, "credentials "); ok && repo != "" {
		return pullRecord{repository: repo}, nil
	}
	return pullRecord{}, fmt.Errorf("pull record %q is neither anonymous nor credentials REPOSITORY", line)
}

// checkAccess asks the registry of repository, where the entry came from, whether p's credentials
// give access to digest there.
func (s *Store) checkAccess(ctx context.Context, p puller, repository, digest string) error {
	origin, err := parseRef(repository+"@"+digest, s.opts.Insecure)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	return puller{ref: origin, insecure: s.opts.Insecure, auth: p.auth}.check(ctx, digest)
}

// discard removes digest's entry: renamed out of the way at once (so no one finds it half gone),
// then deleted. A pod still using the old files keeps them until it ends.
func (s *Store) discard(digest string) error {
	dir := s.entryDir(digest)
	tmp, err := os.MkdirTemp(s.opts.Dir, "tmp-discard-")
	if err != nil {
		return err
	}
	if err := os.Rename(dir, filepath.Join(tmp, "entry")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return errors.Join(err, os.RemoveAll(tmp))
	}
	s.mu.Lock()
	delete(s.sizes, digest)
	delete(s.touched, digest)
	s.mu.Unlock()
	return os.RemoveAll(tmp)
}

func (s *Store) lock(digest string) func() {
	s.mu.Lock()
	l, ok := s.locks[digest]
	if !ok {
		l = &sync.Mutex{}
		s.locks[digest] = l
	}
	s.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// knownDigest is what ref names without asking the registry: its own digest, or the digest its
// tag resolved to last time.
func (s *Store) knownDigest(ref name.Reference) (string, bool) {
	if d, ok := ref.(name.Digest); ok {
		return d.DigestStr(), true
	}
	b, err := os.ReadFile(s.refFile(ref))
	if err != nil {
		return "", false
	}
	h, err := v1.NewHash(strings.TrimSpace(string(b)))
	if err != nil {
		return "", false
	}
	return h.String(), true
}

func (s *Store) refFile(ref name.Reference) string {
	return Cache{Dir: s.opts.Dir}.refFile(ref)
}

// evict removes the least recently used images no lease holds until the cache fits MaxBytes.
func (s *Store) evict() {
	if s.opts.MaxBytes <= 0 {
		return
	}
	for _, digest := range s.evictable() {
		unlock := s.lock(digest)
		s.mu.Lock()
		idle := s.users[digest] == 0
		s.mu.Unlock()
		if idle {
			_ = s.discard(digest)
		}
		unlock()
		if s.total() <= s.opts.MaxBytes {
			return
		}
	}
}

// evictable are the idle images, least recently used first, while the cache is over its cap.
func (s *Store) evictable() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var total int64
	var idle []string
	for d, n := range s.sizes {
		total += n
		if s.users[d] == 0 {
			idle = append(idle, d)
		}
	}
	if total <= s.opts.MaxBytes {
		return nil
	}
	sort.Slice(idle, func(i, j int) bool { return s.touched[idle[i]].Before(s.touched[idle[j]]) })
	return idle
}

func (s *Store) total() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var total int64
	for _, n := range s.sizes {
		total += n
	}
	return total
}
