package site

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net"
	"strconv"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1/members"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
	"github.com/druid-stretch/druid-stretch/internal/testing/pki"
	"github.com/druid-stretch/druid-stretch/test/framework/apiload"
)

// ShootAPIServerImage is the image reference of a shoot's kube-apiserver;
// the node runs the site's own kube-apiserver binary for it (see Images).
const ShootAPIServerImage = "registry.local/kube-apiserver:site"

// shootAPIServerName names the Deployment, Service and Secret of a shoot's
// kube-apiserver, as in a Gardener seed's shoot namespace.
const shootAPIServerName = "kube-apiserver"

// shootAPIServerPort is the port kube-apiserver serves on in its pod.
const shootAPIServerPort = 6443

// ShootAPIServer is a shoot's kube-apiserver running in a site: a
// Deployment in the shoot namespace whose storage is the Etcd etcd-main of
// that namespace, reached through that Etcd's client Service of the same
// site, as a Gardener shoot control plane reaches its etcd.
type ShootAPIServer struct {
	// Name names the server in reports (the site's cluster identity).
	Name string
	// Config is a client configuration of a system:masters user, dialing
	// through the site's pod network; client-go defaults otherwise.
	Config *rest.Config

	site       *Site
	etcd       types.NamespacedName
	secret     *corev1.Secret
	service    *corev1.Service
	deployment *appsv1.Deployment
}

// NewShootAPIServer prepares a shoot's kube-apiserver in namespace, with
// the Etcd etcdName's client Service (in-cluster DNS name, over TLS with
// the shoot's etcd CA and client certificate, InstallShootTLS's Secrets)
// as its only etcd endpoint: its credentials and client
// configuration. Nothing is created in the site until Start or
// StartOnceMemberServes. The pod runs the real kube-apiserver on the node
// stand-in; it goes when the site stops. Its readiness probe is /readyz
// without the checks readyzExclude names (apiload.RBACBootstrapCheck).
func (s *Site) NewShootAPIServer(name, namespace, etcdName string, readyzExclude []string) (*ShootAPIServer, error) {
	ca, err := pki.NewCA("shoot-ca")
	if err != nil {
		return nil, err
	}
	svc := shootAPIServerName + "." + namespace + ".svc"
	serving, err := ca.Issue(shootAPIServerName, shootAPIServerName, shootAPIServerName+"."+namespace, svc, svc+"."+ClusterDomain, "localhost", "127.0.0.1")
	if err != nil {
		return nil, err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	saDER, err := x509.MarshalECPrivateKey(saKey)
	if err != nil {
		return nil, err
	}
	token := make([]byte, 16)
	if _, err := rand.Read(token); err != nil {
		return nil, err
	}
	adminToken := hex.EncodeToString(token)

	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: shootAPIServerName, Namespace: namespace},
		Data: map[string][]byte{
			"ca.crt":  ca.CertPEM(),
			"tls.crt": serving.CertPEM,
			"tls.key": serving.KeyPEM,
			"sa.key":  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: saDER}),
			// A static token of a system:masters user: the test's clients.
			"tokens.csv": fmt.Appendf(nil, "%s,shoot-admin,shoot-admin,system:masters\n", adminToken),
		},
	}
	labels := map[string]string{"app": shootAPIServerName}
	const (
		dir           = "/srv/kubernetes"
		etcdCADir     = "/srv/etcd/ca"
		etcdClientDir = "/srv/etcd/client"
	)
	probe := func(path string) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
				Path: path, Port: intstr.FromInt32(shootAPIServerPort), Scheme: corev1.URISchemeHTTPS}},
			PeriodSeconds: 1, FailureThreshold: 1, SuccessThreshold: 1, TimeoutSeconds: 1,
		}
	}
	deploy := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: shootAPIServerName, Namespace: namespace},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					Containers: []corev1.Container{{
						Name:    shootAPIServerName,
						Image:   ShootAPIServerImage,
						Command: []string{"/kube-apiserver"},
						Args: []string{
							// The shoot's etcd, as a Gardener shoot control plane
							// names it: the client Service of its own seed.
							fmt.Sprintf("--etcd-servers=https://%s-client.%s.svc.%s:2379", etcdName, namespace, ClusterDomain),
							// With the shoot's etcd CA and client certificate,
							// the Secrets of ShootTLS, as Gardener mounts them.
							"--etcd-cafile=" + etcdCADir + "/" + caBundleKey,
							"--etcd-certfile=" + etcdClientDir + "/tls.crt",
							"--etcd-keyfile=" + etcdClientDir + "/tls.key",
							fmt.Sprintf("--secure-port=%d", shootAPIServerPort),
							"--tls-cert-file=" + dir + "/tls.crt",
							"--tls-private-key-file=" + dir + "/tls.key",
							"--token-auth-file=" + dir + "/tokens.csv",
							"--authorization-mode=RBAC",
							"--service-account-issuer=https://" + svc,
							"--service-account-key-file=" + dir + "/sa.key",
							"--service-account-signing-key-file=" + dir + "/sa.key",
							"--service-cluster-ip-range=10.96.0.0/16",
							"--profiling=false",
							// As Gardener runs a shoot's kube-apiserver: the
							// shoot's "kubernetes" Endpoints are Gardener's to
							// keep, not each kube-apiserver's. With the default
							// lease reconciler, both sites' servers rewrote them
							// during a move (conflicting), and the source's
							// graceful stop reset them: writes that commit in
							// the destination, 1.5 s of the switch at 180 ms.
							"--endpoint-reconciler-type=none",
							// No --advertise-address: kube-apiserver takes the
							// address of the pod's default route, its pod IP
							// (the node stand-in cannot resolve status.podIP
							// for the environment).
						},
						Ports:          []corev1.ContainerPort{{Name: "https", ContainerPort: shootAPIServerPort}},
						ReadinessProbe: probe(apiload.ReadyzPath(readyzExclude)),
						VolumeMounts: []corev1.VolumeMount{
							{Name: "secrets", MountPath: dir, ReadOnly: true},
							{Name: "etcd-ca", MountPath: etcdCADir, ReadOnly: true},
							{Name: "etcd-client", MountPath: etcdClientDir, ReadOnly: true},
						},
					}},
					Volumes: []corev1.Volume{
						{Name: "secrets", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: shootAPIServerName}}},
						{Name: "etcd-ca", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: SecretEtcdCA}}},
						{Name: "etcd-client", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: SecretEtcdClient}}},
					},
					TerminationGracePeriodSeconds: ptr.To[int64](5),
				},
			},
		},
	}
	service := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: shootAPIServerName, Namespace: namespace},
		Spec: corev1.ServiceSpec{
			Selector: labels,
			// The pod's own port: the site has no kube-proxy to map a
			// Service port (see docs/sites.md).
			Ports: []corev1.ServicePort{{Name: "https", Port: shootAPIServerPort, TargetPort: intstr.FromInt32(shootAPIServerPort)}},
		},
	}
	return &ShootAPIServer{Name: name, Config: &rest.Config{
		// The Service's in-cluster name: the site's DNS answers it with the
		// ready pods' addresses, as kube-proxy would route it.
		Host:            "https://" + net.JoinHostPort(svc, strconv.Itoa(shootAPIServerPort)),
		BearerToken:     adminToken,
		TLSClientConfig: rest.TLSClientConfig{CAData: ca.CertPEM(), ServerName: svc},
		Dial:            s.DialContext,
	}, site: s, etcd: types.NamespacedName{Namespace: namespace, Name: etcdName},
		secret: secret, service: service, deployment: deploy}, nil
}

// Start creates the server's Secret, Service and Deployment. It returns once
// they exist; the server becomes ready when its etcd serves it (its pod's
// readiness probe is /readyz).
func (k *ShootAPIServer) Start(ctx context.Context) error {
	ns := k.deployment.Namespace
	if _, err := k.site.Kube.CoreV1().Secrets(ns).Create(ctx, k.secret, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating the shoot kube-apiserver's Secret: %w", err)
	}
	if _, err := k.site.Kube.CoreV1().Services(ns).Create(ctx, k.service, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating the shoot kube-apiserver's Service: %w", err)
	}
	if _, err := k.site.Kube.AppsV1().Deployments(ns).Create(ctx, k.deployment, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating the shoot kube-apiserver's Deployment: %w", err)
	}
	return nil
}

// StartOnceMemberServes waits until the Etcd's status shows one of its own
// members voting and serving clients, then starts the server: gardenlet
// sees that on the Etcd it waits on, 5-7 s before the member's pod is
// ready (druid's readiness probe starts 15 s after the container, then
// every 5 s), and the server's start (about 17 s of CPU on a busy 2-core
// machine, which needs no storage for most of it) overlaps that. Its etcd
// client retries on the client Service meanwhile, well within the 20 s
// after which kube-apiserver gives up on its storage.
func (k *ShootAPIServer) StartOnceMemberServes(ctx context.Context) error {
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		p, err := etcdview.Get(ctx, k.site.Client, k.etcd)
		if err != nil || p.View.Status.Membership == nil {
			return false, nil // not created yet, or the site's API server answers again on the next poll
		}
		for _, m := range p.View.Status.Membership.Members {
			if m.Votes() && m.Healthy && members.IsOwn(p.View, m) {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for a voting, serving member of Etcd %s in its status: %w", k.etcd, err)
	}
	return k.Start(ctx)
}

// Stop scales the server's Deployment to 0 and waits until its pods are
// gone, as gardenlet stops the source's kube-apiserver once the shoot's
// API endpoint points at the destination's.
func (k *ShootAPIServer) Stop(ctx context.Context) error {
	ns, name := k.deployment.Namespace, k.deployment.Name
	// The deployment controller writes the Deployment too (its status,
	// right after a start): a scale read before that write conflicts.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		scale, err := k.site.Kube.AppsV1().Deployments(ns).GetScale(ctx, name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("reading the scale of the shoot kube-apiserver: %w", err)
		}
		scale.Spec.Replicas = 0
		if _, err := k.site.Kube.AppsV1().Deployments(ns).UpdateScale(ctx, name, scale, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("scaling the shoot kube-apiserver to 0: %w", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	selector := metav1.FormatLabelSelector(k.deployment.Spec.Selector)
	err = wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		pods, err := k.site.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		return err == nil && len(pods.Items) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the shoot kube-apiserver's pods to go: %w", err)
	}
	return nil
}
