// Command qvirt-images builds qvirt's container images without a container engine (package
// internal/images), pushes them, and keeps the lock file of the Debian packages they are made of.
//
//	qvirt-images build [--out bin/images]          build every image into an OCI layout
//	qvirt-images push --registry HOST:PORT         push the layout's images
//	qvirt-images lock                              re-resolve the lock from apt's current index
//	qvirt-images check                             fail, naming the package, if apt cannot fetch the lock
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/qvirt/qvirt/internal/images"
)

const usage = "usage: qvirt-images build|push|lock|check [flags]  (-h after a command lists its flags)\n"

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fs := flag.NewFlagSet(os.Args[1], flag.ContinueOnError)
	lockFile := fs.String("lock", "hack/images/debs.lock", "lock file of the Debian packages")
	out := fs.String("out", "bin/images", "OCI image layout directory")
	registry := fs.String("registry", "", "push: registry HOST:PORT")
	insecure := fs.Bool("insecure", false, "push: plain HTTP even to a registry that is not on loopback")
	if err := fs.Parse(os.Args[2:]); err != nil {
		os.Exit(2)
	}
	if err := run(ctx, os.Args[1], *lockFile, *out, *registry, *insecure); err != nil {
		fmt.Fprintf(os.Stderr, "qvirt-images %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cmd, lockFile, out, registry string, insecure bool) error {
	cache, err := images.DefaultCacheDir()
	if err != nil {
		return err
	}
	f := &images.Fetcher{CacheDir: cache}
	switch cmd {
	case "build":
		return build(ctx, f, lockFile, out)
	case "push":
		if registry == "" {
			return fmt.Errorf("flag --registry HOST:PORT is required")
		}
		pushed, err := images.Push(ctx, out, registry, insecure)
		for _, p := range pushed {
			fmt.Printf("%s@%s\n", p.Ref, p.Digest)
		}
		return err
	case "lock":
		l, err := images.UpdateLock(ctx, f)
		if err != nil {
			return err
		}
		w, err := os.Create(lockFile)
		if err != nil {
			return err
		}
		if _, err := l.WriteTo(w); err != nil {
			w.Close()
			return err
		}
		fmt.Fprintf(os.Stderr, "%s: %d packages\n", lockFile, len(l.Entries))
		return w.Close()
	case "check":
		l, err := images.ReadLock(lockFile)
		if err != nil {
			return err
		}
		return images.CheckLock(ctx, f, l)
	}
	return fmt.Errorf("unknown command %q\n%s", cmd, usage)
}

func build(ctx context.Context, f *images.Fetcher, lockFile, out string) error {
	l, err := images.ReadLock(lockFile)
	if err != nil {
		return err
	}
	epoch, err := images.EpochFromEnv()
	if err != nil {
		return err
	}
	start := time.Now()
	built, err := images.Build(ctx, images.Options{ModuleDir: ".", Lock: l, Fetcher: f, OutDir: out, Epoch: epoch})
	if err != nil {
		return err
	}
	fmt.Printf("%-18s %-73s %16s %16s\n", "IMAGE", "DIGEST", "COMPRESSED", "UNCOMPRESSED")
	for _, b := range built {
		fmt.Printf("%-18s %-73s %16s %16s\n", images.RefName(b.Image), b.Digest, images.HumanSize(b.Compressed), images.HumanSize(b.Uncompressed))
	}
	fmt.Fprintf(os.Stderr, "images written to %s in %s\n", out, time.Since(start).Round(100*time.Millisecond))
	return nil
}
