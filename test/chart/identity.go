package chart

import (
	"fmt"

	"k8s.io/client-go/rest"
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
