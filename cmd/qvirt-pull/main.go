// Command qvirt-pull pulls a container image into a user's image cache and prints the directory
// holding its filesystem. `qvirt-launcher run` (outside Kubernetes) execs it for kernelBoot and
// containerDisk images that are not file:// references, so that the long-lived launcher does not
// link the registry client. In a cluster nothing runs it: launcher pods get their images as image
// volumes, pulled by the kubelet or a virtual node's provider (imagepull.Store).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/qvirt/qvirt/launcher/imagepull"
)

const usage = `usage: qvirt-pull --cache DIR [--insecure-registry HOST:PORT]... [--policy POLICY] IMAGE

Pulls IMAGE (unless the cache holds it and POLICY allows using it) and prints the directory of its
unpacked filesystem. Exit status 0 on success, 1 when the image cannot be had (the reason on
stderr), 2 for bad usage.
`

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	fs := flag.NewFlagSet("qvirt-pull", flag.ContinueOnError)
	var c imagepull.Cache
	var policy string
	fs.StringVar(&c.Dir, "cache", "", "image cache directory (required)")
	fs.Func("insecure-registry", "registry HOST:PORT that may be reached over plain HTTP (repeatable)", func(s string) error {
		c.Insecure = append(c.Insecure, s)
		return nil
	})
	fs.StringVar(&policy, "policy", "", "Always, IfNotPresent or Never (default: Always for :latest, else IfNotPresent)")
	fs.DurationVar(&c.Timeout, "timeout", 0, "give up after this long (default 10m)")
	fs.Usage = func() { fmt.Fprint(os.Stderr, usage); fs.PrintDefaults() }
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 1 || c.Dir == "" {
		fs.Usage()
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir, err := c.Rootfs(ctx, fs.Arg(0), imagepull.PullPolicy(policy))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(dir)
	return 0
}
