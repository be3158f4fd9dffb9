package webhook

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/members"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/validation"
)

// SidecarContainerName is the name of the injected container.
const SidecarContainerName = "druid-stretch-sidecar"

// SidecarPortName names the sidecar's container port (at most 15
// characters, as the API requires).
const SidecarPortName = "stretch-sidecar"

// druid's volume names and mount paths for the TLS Secrets of an Etcd
// (etcd-druid internal/common): the sidecar mounts the volumes druid already
// declares in the pod, so its files sit where backup-restore's do.
const (
	volumeEtcdCA                 = "etcd-ca"
	volumeEtcdClientTLS          = "etcd-client-tls"
	volumeBackupRestoreCA        = "backup-restore-ca"
	volumeBackupRestoreServerTLS = "backup-restore-server-tls"

	mountEtcdCA                 = "/var/etcd/ssl/ca"
	mountEtcdServerTLS          = "/var/etcd/ssl/server"
	mountEtcdClientTLS          = "/var/etcd/ssl/client"
	mountBackupRestoreCA        = "/var/etcdbr/ssl/ca"
	mountBackupRestoreServerTLS = "/var/etcdbr/ssl/server"

	// The client CA given by --sidecar-client-ca-secret-name is no druid
	// volume: it gets one of its own.
	volumeSidecarClientCA = "druid-stretch-client-ca"
	mountSidecarClientCA  = "/var/druid-stretch/ssl/client-ca"

	// druid's mode for Secret volumes: owner read-write, group read (the pod's
	// fsGroup is the non-root user).
	secretVolumeMode int32 = 0o640
	defaultCAKey           = "ca.crt"
)

// injectSidecar puts the sidecar container, and any TLS volume it needs
// that druid has not declared, into the pod spec. An existing container of
// the same name is replaced in place, so a re-admission yields the same pod
// spec and a changed --sidecar-image rolls out.
func injectSidecar(pod *corev1.PodSpec, e *v1alpha1.Etcd, o Options) error {
	if err := sidecarAccess(e, o); err != nil {
		return err
	}
	c, volumes := sidecarContainer(e, o)
	for _, other := range pod.Containers {
		if other.Name == SidecarContainerName {
			continue
		}
		for _, p := range other.Ports {
			if p.ContainerPort == o.SidecarPort {
				return fmt.Errorf("the sidecar port %d (--sidecar-port) is already container %s's port %q in StatefulSet %s; choose another sidecar port",
					o.SidecarPort, other.Name, p.Name, e.Name)
			}
		}
	}
	replaced := false
	for i := range pod.Containers {
		if pod.Containers[i].Name == SidecarContainerName {
			pod.Containers[i] = c
			replaced = true
		}
	}
	if !replaced {
		pod.Containers = append(pod.Containers, c)
	}
	for _, v := range volumes {
		if !hasVolume(pod, v.Name) {
			pod.Volumes = append(pod.Volumes, v)
		}
	}
	return nil
}

// sidecarAccess refuses to inject a sidecar that anyone reaching it could
// use to change membership: without spec.backup.tls it would serve plain
// HTTP, and without an allowed client identity every certificate of the
// client CA could change membership.
func sidecarAccess(e *v1alpha1.Etcd, o Options) error {
	if errs := validation.ValidateSidecarAccess(e); len(errs) > 0 {
		return fmt.Errorf("the Etcd %s: %w", e.Name, errs.ToAggregate())
	}
	if e.Spec.Backup.TLS != nil && len(allowedClients(e, o)) == 0 {
		return fmt.Errorf("the Etcd %s: no client identity may change membership through its sidecars: set --sidecar-allowed-clients (chart value sidecar.allowedClients) or the annotation %s",
			e.Name, v1alpha1.SidecarAllowedClientsAnnotation)
	}
	return nil
}

// allowedClients are the identities the webhook's options and e's
// annotation allow, each once.
func allowedClients(e *v1alpha1.Etcd, o Options) []string {
	var out []string
	for _, c := range append(slices.Clone(o.SidecarAllowedClients), e.SidecarAllowedClients()...) {
		if !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	return out
}

func hasVolume(pod *corev1.PodSpec, name string) bool {
	for _, v := range pod.Volumes {
		if v.Name == name {
			return true
		}
	}
	return false
}

// sidecarContainer renders the sidecar for e and the volumes it mounts.
// Its flags are backup-restore's, pointed at the files druid mounts:
//   - serving: spec.backup.tls's server certificate, client certificates
//     verified against spec.backup.tls's CA (or --sidecar-client-ca-secret-name),
//     the allowed identities of --sidecar-allowed-clients and the Etcd's
//     annotation; plain HTTP (--insecure-http) only for an Etcd with the
//     insecure opt-in for tests;
//   - etcd: spec.etcd.clientUrlTls's CA and client certificate, through
//     druid's <etcd>-local host alias (the etcd server certificate's name),
//     then druid's client Service for the time the local member is a learner.
//
// Every field the API server would default is set, so that re-admitting the
// stored StatefulSet produces no patch.
func sidecarContainer(e *v1alpha1.Etcd, o Options) (corev1.Container, []corev1.Volume) {
	var (
		args    = []string{"sidecar", "--listen-address=:" + strconv.Itoa(int(o.SidecarPort))}
		mounts  []corev1.VolumeMount
		volumes []corev1.Volume
	)
	mount := func(volume, path, secret string) {
		mounts = append(mounts, corev1.VolumeMount{Name: volume, MountPath: path, ReadOnly: true})
		volumes = append(volumes, corev1.Volume{Name: volume, VolumeSource: corev1.VolumeSource{
			Secret: &corev1.SecretVolumeSource{SecretName: secret, DefaultMode: ptr.To(secretVolumeMode)},
		}})
	}

	clientPort := ptr.Deref(e.Spec.Etcd.ClientPort, members.DefaultClientPort)
	scheme := "http"
	if t := e.Spec.Etcd.ClientUrlTLS; t != nil {
		scheme = "https"
		mount(volumeEtcdCA, mountEtcdCA, t.TLSCASecretRef.Name)
		mount(volumeEtcdClientTLS, mountEtcdClientTLS, t.ClientTLSSecretRef.Name)
		args = append(args,
			fmt.Sprintf("--cacert=%s/%s", mountEtcdCA, ptr.Deref(t.TLSCASecretRef.DataKey, defaultCAKey)),
			fmt.Sprintf("--cert=%s/tls.crt", mountEtcdClientTLS),
			fmt.Sprintf("--key=%s/tls.key", mountEtcdClientTLS),
			"--insecure-transport=false",
			"--insecure-skip-tls-verify=false",
		)
	} else {
		args = append(args, "--insecure-transport=true")
	}
	endpoints := fmt.Sprintf("--endpoints=%s://%s-local:%d", scheme, e.Name, clientPort)
	// druid creates the client Service only for the pods it runs; an Etcd of
	// externally managed members has none.
	if druidv1alpha1.ArePodsManagedByEtcdDruid(e.DruidEtcd()) {
		endpoints += fmt.Sprintf(",%s://%s:%d", scheme, druidv1alpha1.GetClientServiceName(e.ObjectMeta), clientPort)
	}
	args = append(args, endpoints)

	probeScheme := corev1.URISchemeHTTP
	if t := e.Spec.Backup.TLS; t != nil {
		probeScheme = corev1.URISchemeHTTPS
		mount(volumeBackupRestoreServerTLS, mountBackupRestoreServerTLS, t.ServerTLSSecretRef.Name)
		clientCA := fmt.Sprintf("%s/%s", mountBackupRestoreCA, ptr.Deref(t.TLSCASecretRef.DataKey, defaultCAKey))
		if o.SidecarClientCASecretName != "" {
			mount(volumeSidecarClientCA, mountSidecarClientCA, o.SidecarClientCASecretName)
			clientCA = mountSidecarClientCA + "/" + defaultCAKey
		} else {
			mount(volumeBackupRestoreCA, mountBackupRestoreCA, t.TLSCASecretRef.Name)
		}
		args = append(args,
			fmt.Sprintf("--server-cert=%s/tls.crt", mountBackupRestoreServerTLS),
			fmt.Sprintf("--server-key=%s/tls.key", mountBackupRestoreServerTLS),
			"--client-ca="+clientCA,
			"--allowed-client="+strings.Join(allowedClients(e, o), ","),
		)
	} else {
		// Only with the Etcd's insecure opt-in (sidecarAccess).
		args = append(args, "--insecure-http")
	}

	c := corev1.Container{
		Name:            SidecarContainerName,
		Image:           o.SidecarImage,
		ImagePullPolicy: o.SidecarImagePullPolicy,
		Args:            args,
		Ports: []corev1.ContainerPort{{
			Name: SidecarPortName, ContainerPort: o.SidecarPort, Protocol: corev1.ProtocolTCP,
		}},
		Resources:    *o.SidecarResources.DeepCopy(),
		VolumeMounts: mounts,
		// The sidecar's /healthz answers from the process alone: a
		// sidecar restart never waits for etcd, and an etcd outage never
		// restarts it.
		LivenessProbe: &corev1.Probe{
			ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
				Path: "/healthz", Port: intstr.FromInt32(o.SidecarPort), Scheme: probeScheme,
			}},
			TimeoutSeconds:   1,
			PeriodSeconds:    10,
			SuccessThreshold: 1,
			FailureThreshold: 3,
		},
		SecurityContext:          RestrictedSecurityContext(),
		TerminationMessagePath:   corev1.TerminationMessagePathDefault,
		TerminationMessagePolicy: corev1.TerminationMessageReadFile,
	}
	if len(c.Resources.Requests) == 0 {
		c.Resources.Requests = nil
	}
	if len(c.Resources.Limits) == 0 {
		c.Resources.Limits = nil
	}
	return c, volumes
}

// RestrictedSecurityContext is the securityContext of every container
// druid-stretch adds to a pod (the sidecar, its init container): Pod
// Security's restricted profile, and a read-only root filesystem. The
// druid-stretch image runs as a non-root user and writes nothing outside
// its mounted volumes.
func RestrictedSecurityContext() *corev1.SecurityContext {
	return &corev1.SecurityContext{
		RunAsNonRoot:             ptr.To(true),
		AllowPrivilegeEscalation: ptr.To(false),
		ReadOnlyRootFilesystem:   ptr.To(true),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}
