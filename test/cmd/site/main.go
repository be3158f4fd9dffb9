// Command site starts one real test site (package test/site) by hand and
// keeps it until Ctrl-C: kubectl works against it with the kubeconfig it
// prints, and pods' logs are files under its folder. It needs root and the
// binaries of hack/test-binaries.sh. It creates a shoot namespace with the
// shoot's etcd TLS Secrets, which test/site/manifests/etcd-main.yaml
// names.
//
//	go run ./test/cmd/site --dir /tmp/site [--druid-stretch] [--namespace shoot--dev]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlzap "sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/druid-stretch/druid-stretch/test/site"
)

func main() {
	dir := flag.String("dir", "", "folder for everything the site writes (required; must be empty or absent)")
	stretch := flag.Bool("druid-stretch", false, "install druid-stretch besides etcd-druid")
	namespace := flag.String("namespace", "shoot--dev", "namespace created with a shoot's etcd TLS Secrets (CA, server, peer, client certificates)")
	flag.Parse()
	if err := run(*dir, *stretch, *namespace); err != nil {
		fmt.Fprintln(os.Stderr, "site:", err)
		os.Exit(1)
	}
}

func run(dir string, stretch bool, namespace string) error {
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
	if err := shootNamespace(ctx, s, namespace); err != nil {
		return errors.Join(err, s.Stop())
	}
	fmt.Printf("site up; Ctrl-C stops it\n  export KUBECONFIG=%s\n  namespace %s holds a shoot's etcd TLS Secrets\n  process logs: %s/logs, pods: %s/node\n", s.AdminKubeconfig, namespace, dir, dir)
	<-ctx.Done()
	return s.Stop()
}

// shootNamespace creates namespace with the Secrets of a new shoot's TLS.
func shootNamespace(ctx context.Context, s *site.Site, namespace string) error {
	shoot, err := site.NewShootTLS([]string{namespace})
	if err != nil {
		return err
	}
	if err := s.CreateNamespace(ctx, namespace, nil); err != nil {
		return err
	}
	return s.InstallShootTLS(ctx, shoot, namespace)
}
