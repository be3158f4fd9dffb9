package podhost

import (
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
)

// TestSwapFilesAsKubeletsAtomicWriter: a volume's files are replaced in
// place as kubelet's atomic writer replaces them: names link through
// ..data, which one rename moves to the new set; names the new set lacks
// go, and so does the old set's folder. What a reader opened before keeps
// reading the old content.
func TestSwapFilesAsKubeletsAtomicWriter(t *testing.T) {
	g := NewWithT(t)
	dir := filepath.Join(t.TempDir(), "tls")
	pod := &corev1.Pod{}
	first := []file{{path: "tls.crt", data: []byte("cert 1"), mode: 0o640}, {path: "sub/ca.crt", data: []byte("ca 1"), mode: 0o640}}
	g.Expect(writeFiles(pod, dir, first)).To(Succeed())
	g.Expect(os.ReadFile(filepath.Join(dir, "tls.crt"))).To(Equal([]byte("cert 1")))
	g.Expect(os.ReadFile(filepath.Join(dir, "sub", "ca.crt"))).To(Equal([]byte("ca 1")))
	g.Expect(os.Readlink(filepath.Join(dir, "tls.crt"))).To(Equal(filepath.Join(dataLink, "tls.crt")))
	g.Expect(sameFiles(dir, first)).To(BeTrue())
	oldGen, err := os.Readlink(filepath.Join(dir, dataLink))
	g.Expect(err).NotTo(HaveOccurred())
	open, err := os.Open(filepath.Join(dir, "tls.crt"))
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = open.Close() }()

	second := []file{{path: "tls.crt", data: []byte("cert 2"), mode: 0o640}, {path: "tls.key", data: []byte("key 2"), mode: 0o600}}
	g.Expect(sameFiles(dir, second)).To(BeFalse())
	g.Expect(swapFiles(pod, dir, second)).To(Succeed())
	g.Expect(os.ReadFile(filepath.Join(dir, "tls.crt"))).To(Equal([]byte("cert 2")))
	g.Expect(os.ReadFile(filepath.Join(dir, "tls.key"))).To(Equal([]byte("key 2")))
	g.Expect(filepath.Join(dir, "sub")).NotTo(BeAnExistingFile(), "a name the new set lacks is gone")
	g.Expect(filepath.Join(dir, oldGen)).NotTo(BeAnExistingFile(), "the old set's folder is removed")
	g.Expect(sameFiles(dir, second)).To(BeTrue())
	g.Expect(sameFiles(dir, first)).To(BeFalse())
	buf := make([]byte, 16)
	n, err := open.Read(buf)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(buf[:n])).To(Equal("cert 1"), "a file opened before is read to its end")

	g.Expect(swapFiles(pod, dir, []file{{path: "../x", data: nil}})).To(MatchError(ContainSubstring("leaves the volume")))
}
