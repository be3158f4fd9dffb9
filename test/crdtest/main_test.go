package crdtest

import (
	"context"
	"fmt"
	"os"
	"testing"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
)

// One kube-apiserver for the package: starting one takes seconds.
var (
	cfg *rest.Config
	// stretch knows the extended Etcd.
	stretch client.Client
	// druid knows only druid's Etcd, as etcd-druid does.
	druid client.Client
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if testbin.Short() {
		fmt.Println("every test of this package runs real binaries: none runs under -short")
		return 0
	}
	// The extended Etcd CRD of earlier releases, which these tests judge;
	// the chart ships only the EtcdMembership's.
	env, err := testbin.Environment(testbin.WithExtendedEtcdCRD())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cfg, err = env.Start()
	if err != nil {
		fmt.Fprintf(os.Stderr, "starting envtest (kube-apiserver from %s): %v\n", env.BinaryAssetsDirectory, err)
		return 1
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stopping envtest: %v\n", err)
		}
	}()

	stretch, err = newClient(v1alpha1.AddToScheme)
	if err == nil {
		druid, err = newClient(druidv1alpha1.AddToScheme)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

func newClient(addToScheme func(*runtime.Scheme) error) (client.Client, error) {
	scheme := runtime.NewScheme()
	if err := addToScheme(scheme); err != nil {
		return nil, fmt.Errorf("building scheme: %w", err)
	}
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("building scheme: %w", err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("creating client: %w", err)
	}
	return c, nil
}

// newNamespace gives each test its own namespace, so tests never see each
// other's objects.
func newNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "crdtest-"}}
	if err := stretch.Create(context.Background(), ns); err != nil {
		t.Fatalf("creating namespace: %v", err)
	}
	return ns.Name
}
