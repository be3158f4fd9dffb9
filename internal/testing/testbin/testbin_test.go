package testbin

import (
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"
)

// TestFinders checks that each finder looks in its folder and that a missing
// or unusable binary gives an error naming it and the way to build it.
func TestFinders(t *testing.T) {
	envtestDir, binDir := t.TempDir(), t.TempDir()
	t.Setenv("KUBEBUILDER_ASSETS", envtestDir)
	t.Setenv("DRUID_STRETCH_BIN", binDir)
	t.Setenv("DRUID_STRETCH_ETCD", "")

	for _, tc := range []struct {
		name string
		find func() (string, error)
		dir  string
	}{
		{"etcd", Etcd, envtestDir},
		{"kube-apiserver", KubeAPIServer, envtestDir},
		{"kube-controller-manager", KubeControllerManager, envtestDir},
		{"kube-scheduler", KubeScheduler, envtestDir},
		{"etcd-druid", EtcdDruid, binDir},
		{"etcdbrctl", Etcdbrctl, binDir},
		{"etcd-wrapper", EtcdWrapper, binDir},
		{"pod-sandbox", PodSandbox, binDir},
		{"druid-stretch-static", DruidStretchStatic, binDir},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			path := filepath.Join(tc.dir, tc.name)

			_, err := tc.find()
			g.Expect(err).To(MatchError(And(
				ContainSubstring(tc.name+" binary not found at "+path),
				ContainSubstring("hack/test-binaries.sh"))))

			g.Expect(os.WriteFile(path, nil, 0o644)).To(Succeed())
			_, err = tc.find()
			g.Expect(err).To(MatchError(ContainSubstring(tc.name + " at " + path + " is not an executable file")))

			g.Expect(os.Chmod(path, 0o755)).To(Succeed())
			g.Expect(tc.find()).To(Equal(path))
		})
	}
}
