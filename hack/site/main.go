// Command site starts one real test site (package internal/site) by hand and
// keeps it until Ctrl-C: kubectl works against it with the kubeconfig it
// prints, and pods' logs are files under its folder. It needs root and the
// binaries of hack/test-binaries.sh.
//
//	go run ./hack/site --dir /tmp/site [--druid-stretch]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlzap "sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/druid-stretch/druid-stretch/internal/site"
)

func main() {
	dir := flag.String("dir", "", "folder for everything the site writes (required; must be empty or absent)")
	stretch := flag.Bool("druid-stretch", false, "install druid-stretch besides etcd-druid")
	flag.Parse()
	if err := run(*dir, *stretch); err != nil {
		fmt.Fprintln(os.Stderr, "site:", err)
		os.Exit(1)
	}
}

func run(dir string, stretch bool) error {
	if dir == "" {
		return fmt.Errorf("--dir is required")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := ctrlzap.New(ctrlzap.WriteTo(os.Stderr))
	ctrl.SetLogger(log)
	klog.SetLogger(log)
	s, err := site.Start(ctx, site.Options{Dir: dir, DruidStretch: stretch, Logger: log})
	if err != nil {
		return err
	}
	fmt.Printf("site up; Ctrl-C stops it\n  export KUBECONFIG=%s\n  process logs: %s/logs, pods: %s/node\n", s.AdminKubeconfig, dir, dir)
	<-ctx.Done()
	return s.Stop()
}
