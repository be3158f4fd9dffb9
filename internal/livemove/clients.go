package livemove

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
)

// NewClient is an uncached client of the extended Etcd (and Kubernetes'
// built-in kinds) for a REST config: every read goes to the API server, so
// each wait sees the status the controller just wrote.
func NewClient(cfg *rest.Config) (client.Client, error) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := stretchv1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("creating a client for %s: %w", cfg.Host, err)
	}
	return c, nil
}

// NewClientFromKubeconfig is NewClient for a kubeconfig file (its current
// context); an empty path follows kubectl's rules ($KUBECONFIG, then
// ~/.kube/config).
func NewClientFromKubeconfig(path string) (client.Client, error) {
	return NewClientFromKubeconfigContext(path, "")
}

// NewClientFromKubeconfigContext is NewClientFromKubeconfig for a named
// context of the kubeconfig (kubectl's --context); "" is its current one.
// Two contexts of one kubeconfig reach the two clusters of a move.
func NewClientFromKubeconfigContext(path, context string) (client.Client, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = path
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: context}).ClientConfig()
	if err != nil {
		if context != "" {
			return nil, fmt.Errorf("loading context %q of kubeconfig %q: %w", context, path, err)
		}
		return nil, fmt.Errorf("loading kubeconfig %q: %w", path, err)
	}
	return NewClient(cfg)
}
