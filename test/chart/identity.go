package chart

import (
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// ServiceAccountUser is the user name the API server gives the tokens of
// ServiceAccount namespace/name, the name RBAC matches a ServiceAccount
// subject against.
func ServiceAccountUser(namespace, name string) string {
	return fmt.Sprintf("system:serviceaccount:%s:%s", namespace, name)
}

// ImpersonateServiceAccount returns a copy of cfg (an identity allowed to
// impersonate, such as envtest's admin) that acts as ServiceAccount
// namespace/name with the groups its token carries: requests made with it
// are authorized by exactly that ServiceAccount's RBAC.
func ImpersonateServiceAccount(cfg *rest.Config, namespace, name string) *rest.Config {
	out := rest.CopyConfig(cfg)
	out.Impersonate = rest.ImpersonationConfig{
		UserName: ServiceAccountUser(namespace, name),
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
	}
	return out
}

// ImpersonatingKubeconfig is a kubeconfig for cfg's API server and
// credentials that acts as ServiceAccount namespace/name, for running the
// druid-stretch binary (`controller --kubeconfig=...`) under exactly the
// chart's RBAC. cfg must carry its credentials inline (as envtest's admin
// config does: client certificate and key data, or a bearer token).
func ImpersonatingKubeconfig(cfg *rest.Config, namespace, name string) ([]byte, error) {
	imp := ImpersonateServiceAccount(cfg, namespace, name)
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{
		Server:                   imp.Host,
		CertificateAuthorityData: imp.CAData,
		InsecureSkipTLSVerify:    imp.Insecure,
	}
	kc.AuthInfos["service-account"] = &clientcmdapi.AuthInfo{
		ClientCertificateData: imp.CertData,
		ClientKeyData:         imp.KeyData,
		Token:                 imp.BearerToken,
		Impersonate:           imp.Impersonate.UserName,
		ImpersonateGroups:     imp.Impersonate.Groups,
	}
	kc.Contexts["service-account"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "service-account", Namespace: namespace}
	kc.CurrentContext = "service-account"
	data, err := clientcmd.Write(*kc)
	if err != nil {
		return nil, fmt.Errorf("writing the impersonating kubeconfig: %w", err)
	}
	return data, nil
}
