package podhost

import (
	"net"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func TestExpandFollowsKubernetesRules(t *testing.T) {
	g := NewWithT(t)
	env := []string{"POD_NAME=etcd-main-0", "NS=shoot", "POD_NAME=etcd-main-1"}
	for in, want := range map[string]string{
		"--name=$(POD_NAME)": "--name=etcd-main-1", // the later definition wins
		"$(NS)/$(POD_NAME)":  "shoot/etcd-main-1",
		"$$(POD_NAME)":       "$(POD_NAME)", // $$ escapes
		"$(UNKNOWN)":         "$(UNKNOWN)",  // unknown stays as written
		"cost: $5":           "cost: $5",
		"$(unterminated":     "$(unterminated",
		"plain":              "plain",
		"trailing $":         "trailing $",
	} {
		g.Expect(expand(in, env)).To(Equal(want), in)
	}
}

func TestCommandLineUsesTheImageEntrypointUnlessACommandIsGiven(t *testing.T) {
	g := NewWithT(t)
	img := Image{Binary: "/bin/etcdbrctl", Entrypoint: "/etcdbrctl"}
	env := []string{"PORT=8080"}

	argv, err := commandLine(corev1.Container{Name: "br", Args: []string{"server", "--server-port=$(PORT)"}}, img, env)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(argv).To(Equal([]string{"/etcdbrctl", "server", "--server-port=8080"}))

	argv, err = commandLine(corev1.Container{Name: "init", Command: []string{"chown", "-R", "1:1", "/x"}}, Image{}, env)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(argv).To(Equal([]string{"chown", "-R", "1:1", "/x"}))

	_, err = commandLine(corev1.Container{Name: "c", Image: "alpine:3"}, Image{}, env)
	g.Expect(err).To(MatchError(ContainSubstring("container c has no command and its image alpine:3 no entrypoint")))
}

func TestImagesLookupByRepositoryOrLastElement(t *testing.T) {
	g := NewWithT(t)
	im := Images{
		"etcdbrctl":                            {Binary: "/b/etcdbrctl", Entrypoint: "/etcdbrctl"},
		"registry.example:5000/team/etcdbrctl": {Binary: "/b/other", Entrypoint: "/etcdbrctl"},
	}
	img, err := im.Lookup("europe-docker.pkg.dev/gardener-project/public/gardener/etcdbrctl:v0.44.1")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(img.Binary).To(Equal("/b/etcdbrctl"))

	img, err = im.Lookup("registry.example:5000/team/etcdbrctl@sha256:abc")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(img.Binary).To(Equal("/b/other"), "the full repository wins, a registry port is no tag")

	_, err = im.Lookup("docker.io/library/nginx:1")
	g.Expect(err).To(MatchError(ContainSubstring(`image "docker.io/library/nginx:1" has no local stand-in`)))
}

func TestCredentialsPreferTheContainerOverThePod(t *testing.T) {
	g := NewWithT(t)
	pod := &corev1.Pod{Spec: corev1.PodSpec{SecurityContext: &corev1.PodSecurityContext{
		RunAsUser: ptr.To[int64](65532), RunAsGroup: ptr.To[int64](65532), FSGroup: ptr.To[int64](65532), SupplementalGroups: []int64{7},
	}}}
	nonroot := Image{User: &ImageUser{UID: 65532, GID: 65532}}
	uid, gid, groups := credentials(pod, corev1.Container{}, Image{})
	g.Expect([]uint32{uid, gid}).To(Equal([]uint32{65532, 65532}))
	g.Expect(groups).To(Equal([]uint32{7, 65532}))

	uid, gid, _ = credentials(pod, corev1.Container{SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To[int64](0), RunAsGroup: ptr.To[int64](0)}}, nonroot)
	g.Expect([]uint32{uid, gid}).To(Equal([]uint32{0, 0}), "a security context's user wins over the image's")
	g.Expect(home(65532)).To(Equal("/home/nonroot"))
}

// A container whose pod and container name no user runs as its image's
// USER, as a container runtime runs it: druid's compaction Job names none,
// and its etcdbrctl image is distroless's nonroot.
func TestCredentialsFallBackToTheImageUser(t *testing.T) {
	g := NewWithT(t)
	nonroot := Image{User: &ImageUser{UID: 65532, GID: 65532}}
	uid, gid, groups := credentials(&corev1.Pod{}, corev1.Container{}, nonroot)
	g.Expect([]uint32{uid, gid}).To(Equal([]uint32{65532, 65532}))
	g.Expect(groups).To(BeEmpty())

	uid, gid, _ = credentials(&corev1.Pod{}, corev1.Container{SecurityContext: &corev1.SecurityContext{RunAsGroup: ptr.To[int64](5)}}, nonroot)
	g.Expect([]uint32{uid, gid}).To(Equal([]uint32{65532, 5}), "a named group wins over the image user's")

	uid, gid, _ = credentials(&corev1.Pod{}, corev1.Container{}, Image{})
	g.Expect([]uint32{uid, gid}).To(Equal([]uint32{0, 0}), "an image without USER runs as root")
}

// A pod whose containers all ended by themselves is Succeeded when every
// one exited 0 and Failed otherwise, as kubelet reports it (a Job counts
// its pods by it); init containers do not count.
func TestEndedPodPhaseFollowsTheExitCodes(t *testing.T) {
	g := NewWithT(t)
	ended := func(code int32) *container {
		return &container{state: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code}}}
	}
	initFailed := ended(1)
	initFailed.init = true
	g.Expect((&podRun{containers: []*container{initFailed, ended(0), ended(0)}}).endedPhaseLocked()).To(Equal(corev1.PodSucceeded))
	g.Expect((&podRun{containers: []*container{ended(0), ended(2)}}).endedPhaseLocked()).To(Equal(corev1.PodFailed))
	g.Expect((&podRun{containers: []*container{{state: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}}).endedPhaseLocked()).To(Equal(corev1.PodFailed))
}

// The site's DNS answers what CoreDNS answers from EndpointSlices: a
// Service's name with its ready endpoints, and on a headless Service the
// hostname of an endpoint no pod here backs (a member in another cluster).
func TestServiceRecordsFollowCoreDNS(t *testing.T) {
	g := NewWithT(t)
	svc := func(name, clusterIP string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shoot", Name: name}, Spec: corev1.ServiceSpec{ClusterIP: clusterIP}}
	}
	slice := func(svc string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Namespace: "shoot", Name: svc + "-x", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
			Endpoints:  eps,
		}
	}
	pod := &corev1.ObjectReference{Kind: "Pod", Name: "etcd-main-3"}
	got := serviceRecords(
		[]*corev1.Service{svc("etcd-main-peer", corev1.ClusterIPNone), svc("etcd-main-client", "10.0.0.1")},
		[]*discoveryv1.EndpointSlice{
			slice("etcd-main-peer",
				discoveryv1.Endpoint{Addresses: []string{"10.1.0.3"}, Hostname: ptr.To("etcd-main-3"), TargetRef: pod},
				discoveryv1.Endpoint{Addresses: []string{"10.2.0.7"}, Hostname: ptr.To("etcd-main-0"), Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}},
				discoveryv1.Endpoint{Addresses: []string{"10.2.0.8"}, Hostname: ptr.To("etcd-main-1"), Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false)}},
			),
			slice("etcd-main-client", discoveryv1.Endpoint{Addresses: []string{"10.1.0.3"}, Hostname: ptr.To("not-headless")}),
			slice("no-such-service", discoveryv1.Endpoint{Addresses: []string{"10.9.9.9"}, Hostname: ptr.To("orphan")}),
		}, "cluster.local")
	ips := func(s ...string) []net.IP {
		var out []net.IP
		for _, a := range s {
			out = append(out, net.ParseIP(a))
		}
		return out
	}
	g.Expect(got).To(Equal(map[string][]net.IP{
		"etcd-main-peer.shoot.svc.cluster.local":             ips("10.1.0.3", "10.2.0.7"),
		"etcd-main-0.etcd-main-peer.shoot.svc.cluster.local": ips("10.2.0.7"),
		"etcd-main-client.shoot.svc.cluster.local":           ips("10.1.0.3"),
	}))
}

func TestProbeURLKeepsThePathsQuery(t *testing.T) {
	g := NewWithT(t)
	for path, want := range map[string]string{
		"/readyz": "https://10.244.0.5:443/readyz",
		"/readyz?exclude=poststarthook%2Frbac%2Fbootstrap-roles": "https://10.244.0.5:443/readyz?exclude=poststarthook%2Frbac%2Fbootstrap-roles",
		"/livez?verbose&exclude=etcd":                            "https://10.244.0.5:443/livez?verbose&exclude=etcd",
		"%zz":                                                    "https://10.244.0.5:443/%25zz", // does not parse: the path as it is
	} {
		g.Expect(probeURL("https", "10.244.0.5", 443, path).String()).To(Equal(want), path)
	}
}
