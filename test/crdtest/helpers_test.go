package crdtest

import (
	"context"
	"os"
	"testing"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
)

func ctx(t *testing.T) context.Context { return t.Context() }

// loadUnstructured reads one object from a YAML file, with numbers as the
// apiserver returns them (int64).
func loadUnstructured(t *testing.T, path string) *unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return unstructuredFromYAML(t, data)
}

func unstructuredFromYAML(t *testing.T, data []byte) *unstructured.Unstructured {
	t.Helper()
	j, err := yaml.YAMLToJSON(data)
	if err != nil {
		t.Fatalf("YAML to JSON: %v", err)
	}
	obj := map[string]any{}
	if err := utiljson.Unmarshal(j, &obj); err != nil {
		t.Fatalf("decoding JSON: %v", err)
	}
	return &unstructured.Unstructured{Object: obj}
}

// stretchedEtcd is a valid destination-side Etcd of a live move: three local
// members seed-b-etcd-main-3..5 and the source's three members as external.
func stretchedEtcd(namespace string) *v1alpha1.Etcd {
	e := &v1alpha1.Etcd{
		ObjectMeta: metav1.ObjectMeta{Name: "etcd-main", Namespace: namespace},
		Spec: v1alpha1.EtcdSpec{
			EtcdSpec: druidv1alpha1.EtcdSpec{
				MemberNamePrefix: ptr.To("seed-b"),
				Labels:           map[string]string{"app": "etcd-statefulset", "role": "main"},
				Replicas:         3,
				Etcd: druidv1alpha1.EtcdConfig{
					PeerUrlTLS: &druidv1alpha1.PeerTLSConfig{TLSConfig: druidv1alpha1.TLSConfig{
						TLSCASecretRef:     druidv1alpha1.SecretReference{SecretReference: corev1.SecretReference{Name: "ca-etcd-peer"}},
						ServerTLSSecretRef: corev1.SecretReference{Name: "etcd-peer-server"},
					}},
				},
			},
			MembershipSpec: v1alpha1.MembershipSpec{
				OrdinalStart:          ptr.To[int32](3),
				ExternalMembersPolicy: ptr.To(v1alpha1.ExternalMembersPolicyKeep),
			},
		},
	}
	for _, host := range []string{"etcd-main-0", "etcd-main-1", "etcd-main-2"} {
		e.Spec.ExternalMembers = append(e.Spec.ExternalMembers, v1alpha1.ExternalMember{
			Name:       "seed-a-" + host,
			PeerURLs:   []string{"https://" + host + ".seed-a.example:2380"},
			ClientURLs: []string{"https://" + host + ".seed-a.example:2379"},
			SidecarURL: "https://" + host + ".seed-a.example:8080",
		})
	}
	return e
}
