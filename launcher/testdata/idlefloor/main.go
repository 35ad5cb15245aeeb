// Command idlefloor is a Go process that does nothing until SIGTERM: BenchmarkLauncherIdle runs
// it beside the launchers, so that what the Go runtime alone costs a sleeping process on the
// machine (sysmon wakes about once a minute) is measured in the same window.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
	<-c
}
