package webhook

import (
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/members"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/peerurls"
	"github.com/druid-stretch/druid-stretch/internal/clientgate"
	"github.com/druid-stretch/druid-stretch/internal/etcdconfig"
)

// druid's container names and mount paths in an etcd pod (etcd-druid
// internal/common).
const (
	containerEtcd          = "etcd"
	containerBackupRestore = "backup-restore"
	mountEtcdData          = "/var/etcd/data"
	mountEtcdConfig        = "/var/etcd/config"

	// backupRestoreHostPortFlag is etcd-wrapper's flag naming the server it
	// asks for initialisation and configuration.
	backupRestoreHostPortFlag = "--backup-restore-host-port="
)

// What the webhook adds so that a managed member starts only once the
// controller admitted it, and so that backup-restore takes no membership
// action of its own.
const (
	// BackupRestoreConfigInitContainerName writes backup-restore's etcd
	// configuration before the pod's containers start.
	BackupRestoreConfigInitContainerName = "druid-stretch-backup-restore-config"
	volumeBackupRestoreConfig            = "druid-stretch-backup-restore-config"
	mountBackupRestoreConfig             = "/var/druid-stretch/backup-restore"
	backupRestoreConfigFile              = mountBackupRestoreConfig + "/" + "etcd.conf.yaml"
	// envBackupRestoreConfig is the variable backup-restore reads its etcd
	// configuration's path from (default /var/etcd/config/etcd.conf.yaml).
	envBackupRestoreConfig = "ETCD_CONF"
	envPodName             = "POD_NAME"
)

// StartsThroughSidecar tells whether sts's pods start their members only
// once the controller admitted them: the webhook interposed the sidecar in
// its pod template (interposeSidecar). Their sidecars run before their
// members, so a sidecar that does not answer is a pod that has not started.
func StartsThroughSidecar(sts *appsv1.StatefulSet) bool {
	return sts != nil && slices.ContainsFunc(sts.Spec.Template.Spec.InitContainers, func(c corev1.Container) bool {
		return c.Name == BackupRestoreConfigInitContainerName
	})
}

// interposeSidecar makes the pod's member start through the sidecar (see
// the sidecar's join.go):
//   - etcd-wrapper asks the sidecar, not backup-restore, for initialisation
//     and configuration: its --backup-restore-host-port names the sidecar's
//     port on the same host (the sidecar serves with backup-restore's TLS
//     when spec.backup.tls is set, so the wrapper's trust stays right);
//   - the sidecar reads druid's etcd configuration and keeps the
//     controller's admission on the data volume;
//   - an init container writes the etcd configuration backup-restore reads
//     (ETCD_CONF): druid's with the member's own entries and an initial
//     cluster of the member alone, which turns off backup-restore's
//     learner add, promotion and remove-and-re-add.
//
// Call it after injectSidecar: it completes the sidecar container that
// injectSidecar just rendered. Every change replaces what a previous
// admission wrote, so admitting the result again changes nothing.
func interposeSidecar(pod *corev1.PodSpec, e *v1alpha1.Etcd, o Options) error {
	etcd, br, sc := container(pod, containerEtcd), container(pod, containerBackupRestore), container(pod, SidecarContainerName)
	if etcd == nil || br == nil || sc == nil {
		return fmt.Errorf("the pod template of Etcd %s lacks druid's %q or %q container (or the sidecar); druid-stretch cannot make its members start through the sidecar", e.Name, containerEtcd, containerBackupRestore)
	}
	// druid mounts the data volume in both containers, the configuration
	// only in backup-restore's (etcd gets its configuration from it).
	dataVolume, configVolume := mountedVolume(etcd, mountEtcdData), mountedVolume(br, mountEtcdConfig)
	if dataVolume == "" || configVolume == "" {
		return fmt.Errorf("druid's pod template of Etcd %s mounts no volume at %s in the etcd container or at %s in the backup-restore container", e.Name, mountEtcdData, mountEtcdConfig)
	}
	if !replaceFlag(etcd, backupRestoreHostPortFlag, fmt.Sprintf("%s-local:%d", e.Name, o.SidecarPort)) {
		return fmt.Errorf("druid's etcd container of Etcd %s has no %s flag; it is not etcd-wrapper as druid runs it", e.Name, strings.TrimSuffix(backupRestoreHostPortFlag, "="))
	}

	druidConfig := etcdconfig.DefaultPath // druid's file in the config volume
	member, err := memberFlags(e)
	if err != nil {
		return err
	}
	podName := corev1.EnvVar{Name: envPodName, ValueFrom: &corev1.EnvVarSource{
		FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"},
	}}
	configMount := corev1.VolumeMount{Name: configVolume, MountPath: mountEtcdConfig, ReadOnly: true}

	sc.Env = setEnv(sc.Env, podName)
	sc.Args = append(sc.Args, "--etcd-config="+druidConfig)
	sc.Args = append(sc.Args, member...)
	if o.EtcdMaxLearners > 1 {
		sc.Args = append(sc.Args, "--etcd-max-learners="+strconv.Itoa(o.EtcdMaxLearners))
	}
	if err := gateClients(sc, etcd, e, o); err != nil {
		return err
	}
	sc.VolumeMounts = append(sc.VolumeMounts, configMount, corev1.VolumeMount{Name: dataVolume, MountPath: mountEtcdData})

	init := corev1.Container{
		Name:            BackupRestoreConfigInitContainerName,
		Image:           o.SidecarImage,
		ImagePullPolicy: o.SidecarImagePullPolicy,
		Args:            append([]string{"backup-restore-config", "--etcd-config=" + druidConfig, "--output=" + backupRestoreConfigFile}, member...),
		Env:             []corev1.EnvVar{podName},
		VolumeMounts: []corev1.VolumeMount{configMount,
			{Name: volumeBackupRestoreConfig, MountPath: mountBackupRestoreConfig}},
		SecurityContext:          sc.SecurityContext.DeepCopy(),
		TerminationMessagePath:   corev1.TerminationMessagePathDefault,
		TerminationMessagePolicy: corev1.TerminationMessageReadFile,
	}
	pod.InitContainers = setContainer(pod.InitContainers, init)

	delayEtcdStop(etcd)
	ownServiceEndpoint(br)
	br.Env = setEnv(br.Env, corev1.EnvVar{Name: envBackupRestoreConfig, Value: backupRestoreConfigFile})
	br.VolumeMounts = setMount(br.VolumeMounts, corev1.VolumeMount{Name: volumeBackupRestoreConfig, MountPath: mountBackupRestoreConfig, ReadOnly: true})
	if !hasVolume(pod, volumeBackupRestoreConfig) {
		pod.Volumes = append(pod.Volumes, corev1.Volume{Name: volumeBackupRestoreConfig,
			VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	}
	return nil
}

// EtcdStopDelay is how long etcd's container waits, once its pod is
// deleted, before kubelet sends it SIGTERM: the sidecar, stopped at once,
// drains its client gate within clientgate.StopDrainTimeout, and one more
// second lets the calls that drain waits for end on a running etcd. Without
// it etcd stops beside a gate still carrying calls, and each of them fails
// with a broken connection that kube-apiserver's etcd client does not
// retry (a roll of druid's pods failed a shoot's request that way).
const EtcdStopDelay = clientgate.StopDrainTimeout + time.Second

// delayEtcdStop gives druid's etcd container a preStop sleep of at least
// EtcdStopDelay. A container has one preStop hook: a longer sleep is kept,
// and so is a hook of another kind, which delays etcd's stop its own way.
func delayEtcdStop(etcd *corev1.Container) {
	seconds := int64(EtcdStopDelay / time.Second)
	if etcd.Lifecycle == nil {
		etcd.Lifecycle = &corev1.Lifecycle{}
	}
	switch hook := etcd.Lifecycle.PreStop; {
	case hook == nil:
		etcd.Lifecycle.PreStop = &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: seconds}}
	case hook.Sleep != nil:
		hook.Sleep.Seconds = max(hook.Sleep.Seconds, seconds)
	}
}

// serviceEndpointsFlag is backup-restore's list of the endpoints it reaches
// the cluster through.
const serviceEndpointsFlag = "--service-endpoints="

// ownServiceEndpoint keeps backup-restore's --service-endpoints to the
// first entry, the Etcd's own client Service. druid v0.38.1 appends the
// source's client endpoints of spec.etcd.bootstrapWithExistingCluster,
// which backup-restore uses only in the membership paths the one-member
// configuration turns off; kept, they would reach the source's cluster
// from a process that must not act on it, and gardenlet unsetting the
// field (GEP-39's EtcdMigrationComplete) would change the pod template
// and restart every destination pod while the source's members are being
// removed.
func ownServiceEndpoint(br *corev1.Container) {
	for _, list := range [][]string{br.Command, br.Args} {
		for i, a := range list {
			if v, ok := strings.CutPrefix(a, serviceEndpointsFlag); ok {
				first, _, _ := strings.Cut(v, ",")
				list[i] = serviceEndpointsFlag + first
			}
		}
	}
}

// memberFlags name the pod's member for the sidecar and the init
// container: its name and druid's in-cluster URLs, with the pod's name
// filled in by Kubernetes ($(POD_NAME) in args). They are used where
// druid's configuration has no entry for the member (a pod outside
// ordinals 0..replicas-1); where it has one, its URLs win (they carry
// the additional peer URLs where druid finds them). Additional peer URLs
// that package peerurls refuses are an error, naming the field.
func memberFlags(e *v1alpha1.Etcd) ([]string, error) {
	pod := "$(" + envPodName + ")"
	clientScheme := "http"
	if e.Spec.Etcd.ClientUrlTLS != nil {
		clientScheme = "https"
	}
	clientPort := ptr.Deref(e.Spec.Etcd.ClientPort, members.DefaultClientPort)
	flags := []string{
		"--member-name=" + druidv1alpha1.GetMemberName(e.Spec.MemberNamePrefix, pod),
		"--member-peer-urls=" + members.InClusterPeerURL(e, pod),
		"--member-client-urls=" + clientScheme + "://" + pod + "." + members.PeerServiceDomain(e) + ":" + strconv.Itoa(int(clientPort)),
	}
	// The entries of the members this StatefulSet may run: the pod picks
	// its own. druid v0.38.1's file lacks them when spec.memberNamePrefix
	// is set (druid looks them up by pod name).
	advertised, errs := peerurls.Read(e)
	if len(errs) > 0 {
		return nil, fmt.Errorf("the additional peer URLs of Etcd %s: %w", e.Name, errs.ToAggregate())
	}
	if additional := additionalPeerURLs(e, advertised, pod); len(additional) > 0 {
		flags = append(flags, "--additional-peer-urls="+strings.Join(additional, ","))
	}
	return flags, nil
}

// additionalPeerURLs are the member=url entries of the members in e's pod
// window. When every member of the window has entries and they differ only
// by the pod's name, they collapse into one entry per URL with pod (the
// $(POD_NAME) reference) in place of the name: the template then stays the
// same as the window grows, and a move that scales the destination from 1
// to 3 members, adding their entries, does not restart the running pod.
func additionalPeerURLs(e *v1alpha1.Etcd, advertised peerurls.Advertised, pod string) []string {
	window := members.PodWindow(e)
	var listed []string
	templated := map[int64][]string{}
	for _, m := range advertised.Members() {
		o, ok := members.Ordinal(e, m.Name)
		if !ok || !window.Contains(o) {
			continue
		}
		name := members.PodName(e, o)
		for _, u := range m.URLs {
			listed = append(listed, m.Name+"="+u)
			templated[o] = append(templated[o], strings.ReplaceAll(u, name, pod))
		}
	}
	if len(listed) == 0 || int64(len(templated)) != window.End-window.Start {
		return listed
	}
	first := templated[window.Start]
	for _, urls := range templated {
		if !slices.Equal(urls, first) || slices.ContainsFunc(urls, func(u string) bool { return !strings.Contains(u, pod) }) {
			return listed
		}
	}
	member := druidv1alpha1.GetMemberName(e.Spec.MemberNamePrefix, pod)
	out := make([]string, 0, len(first))
	for _, u := range first {
		out = append(out, member+"="+u)
	}
	return out
}

func container(pod *corev1.PodSpec, name string) *corev1.Container {
	for i := range pod.Containers {
		if pod.Containers[i].Name == name {
			return &pod.Containers[i]
		}
	}
	return nil
}

// mountedVolume is the volume c mounts at mountPath ("" if none).
func mountedVolume(c *corev1.Container, mountPath string) string {
	for _, m := range c.VolumeMounts {
		if path.Clean(m.MountPath) == mountPath {
			return m.Name
		}
	}
	return ""
}

// replaceFlag sets the value of the --name=value flag in c's command or
// args; false when c has no such flag.
func replaceFlag(c *corev1.Container, prefix, value string) bool {
	found := false
	for _, list := range [][]string{c.Command, c.Args} {
		for i, a := range list {
			if strings.HasPrefix(a, prefix) {
				list[i] = prefix + value
				found = true
			}
		}
	}
	return found
}

func setEnv(env []corev1.EnvVar, v corev1.EnvVar) []corev1.EnvVar {
	for i := range env {
		if env[i].Name == v.Name {
			env[i] = v
			return env
		}
	}
	return append(env, v)
}

func setMount(mounts []corev1.VolumeMount, m corev1.VolumeMount) []corev1.VolumeMount {
	for i := range mounts {
		if mounts[i].MountPath == m.MountPath {
			mounts[i] = m
			return mounts
		}
	}
	return append(mounts, m)
}

func setContainer(cs []corev1.Container, c corev1.Container) []corev1.Container {
	for i := range cs {
		if cs[i].Name == c.Name {
			cs[i] = c
			return cs
		}
	}
	return append(cs, c)
}

// gateClients puts the sidecar's client gate in front of etcd's client
// port (Options.ClientGateBackendPort): the sidecar serves etcd's
// configuration with etcd listening on 127.0.0.1 at the backend port, and
// the gate on the client port forwards there. The sidecar itself talks to
// its member past the gate: a drain or hold of the gate must not cut off
// the sidecar that carries out the step.
//
// With client TLS (spec.etcd.clientUrlTls) the gate serves etcd's clients
// as etcd would: with etcd's own server certificate (the volume druid
// mounts at /var/etcd/ssl/server in the etcd container, mounted into the
// sidecar too), requiring client certificates of etcd's CA (the sidecar's
// --cacert, as etcd's trusted-ca-file with client-cert-auth). It reaches
// etcd with the sidecar's etcd client certificate, at druid's <etcd>-local
// host alias of 127.0.0.1, the name etcd's certificate carries for its
// own pod.
func gateClients(sc, etcd *corev1.Container, e *v1alpha1.Etcd, o Options) error {
	if o.ClientGateBackendPort == 0 {
		return nil
	}
	clientPort := ptr.Deref(e.Spec.Etcd.ClientPort, members.DefaultClientPort)
	backend := fmt.Sprintf("http://127.0.0.1:%d", o.ClientGateBackendPort)
	var gateTLS []string
	if t := e.Spec.Etcd.ClientUrlTLS; t != nil {
		backend = fmt.Sprintf("https://%s-local:%d", e.Name, o.ClientGateBackendPort)
		serverTLS := mountedVolume(etcd, mountEtcdServerTLS)
		if serverTLS == "" {
			return fmt.Errorf("druid's etcd container of Etcd %s mounts no volume at %s: the client gate serves etcd's clients with etcd's server certificate (spec.etcd.clientUrlTls.serverTLSSecretRef %s)", e.Name, mountEtcdServerTLS, t.ServerTLSSecretRef.Name)
		}
		sc.VolumeMounts = setMount(sc.VolumeMounts, corev1.VolumeMount{Name: serverTLS, MountPath: mountEtcdServerTLS, ReadOnly: true})
		gateTLS = []string{
			"--client-gate-cert=" + mountEtcdServerTLS + "/tls.crt",
			"--client-gate-key=" + mountEtcdServerTLS + "/tls.key",
			fmt.Sprintf("--client-gate-client-ca=%s/%s", mountEtcdCA, ptr.Deref(t.TLSCASecretRef.DataKey, defaultCAKey)),
		}
	}
	const endpointsFlag = "--endpoints="
	var endpoints string
	for _, a := range sc.Args {
		if v, ok := strings.CutPrefix(a, endpointsFlag); ok {
			endpoints = v
		}
	}
	local, rest, _ := strings.Cut(endpoints, ",")
	if local == "" {
		return fmt.Errorf("the sidecar of Etcd %s has no %s flag to point past the client gate", e.Name, strings.TrimSuffix(endpointsFlag, "="))
	}
	value := backend
	if rest != "" {
		value += "," + rest
	}
	replaceFlag(sc, endpointsFlag, value)
	sc.Args = append(sc.Args, fmt.Sprintf("--client-gate-address=:%d", clientPort), "--client-gate-backend="+backend)
	sc.Args = append(sc.Args, gateTLS...)
	return nil
}
