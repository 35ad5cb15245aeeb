// Command qvirt-api is the aggregated API server of subresources.qvirt.io: console, VNC and QMP
// streams and the VM and VMI actions, behind kube-apiserver (APIService
// v1alpha1.subresources.qvirt.io). See package apiserver.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/qvirt/qvirt/apiserver"
)

func main() {
	opts := apiserver.NewOptions()
	fs := pflag.NewFlagSet("qvirt-api", pflag.ExitOnError)
	opts.AddFlags(fs)
	version := fs.Bool("version", false, "print the version as JSON and exit")
	zapOpts := zap.Options{}
	goFlags := flag.NewFlagSet("qvirt-api", flag.ExitOnError)
	zapOpts.BindFlags(goFlags)
	fs.AddGoFlagSet(goFlags)
	_ = fs.Parse(os.Args[1:])
	if *version {
		out, _ := json.Marshal(apiserver.BuildVersion())
		fmt.Println(string(out))
		return
	}
	log := zap.New(zap.UseFlagOptions(&zapOpts))
	ctrl.SetLogger(log)
	klog.SetLogger(log.WithName("apiserver"))
	opts.Log = log.WithName("qvirt-api")
	api, err := apiserver.New(opts)
	if err != nil {
		log.Error(err, "qvirt-api: configuration")
		os.Exit(1)
	}
	if err := api.Run(ctrl.SetupSignalHandler()); err != nil {
		log.Error(err, "qvirt-api failed")
		os.Exit(1)
	}
}
