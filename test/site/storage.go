package site

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v11/controller"
)

// StorageClassName is the site's default StorageClass; druid's
// volumeClaimTemplate uses it when an Etcd names none.
const StorageClassName = "standard"

// provisionerName is the provisioner of StorageClassName.
const provisionerName = "site.druid-stretch.io/hostpath"

// hostPathProvisioner gives each claim a folder under the node's hostPath
// root, as the local-path provisioner of kind does: a PersistentVolume is a
// folder, it outlives the pods that mount it and goes with its claim.
type hostPathProvisioner struct {
	dir  string // folder of the volumes, on this machine
	node string // the node stand-in's hostPath view of dir
}

func (p hostPathProvisioner) Provision(_ context.Context, o controller.ProvisionOptions) (*corev1.PersistentVolume, controller.ProvisioningState, error) {
	if err := os.MkdirAll(filepath.Join(p.dir, o.PVName), 0o777); err != nil {
		return nil, controller.ProvisioningFinished, err
	}
	// MkdirAll applies the umask; a volume must be writable for any user
	// until the kubelet (here, the node stand-in) applies the pod's fsGroup.
	if err := os.Chmod(filepath.Join(p.dir, o.PVName), 0o777); err != nil {
		return nil, controller.ProvisioningFinished, err
	}
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: o.PVName},
		Spec: corev1.PersistentVolumeSpec{
			PersistentVolumeReclaimPolicy: ptr.Deref(o.StorageClass.ReclaimPolicy, corev1.PersistentVolumeReclaimDelete),
			AccessModes:                   o.PVC.Spec.AccessModes,
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: o.PVC.Spec.Resources.Requests[corev1.ResourceStorage]},
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: filepath.Join(p.node, o.PVName), Type: ptr.To(corev1.HostPathDirectory)},
			},
		},
	}, controller.ProvisioningFinished, nil
}

func (p hostPathProvisioner) Delete(_ context.Context, pv *corev1.PersistentVolume) error {
	return os.RemoveAll(filepath.Join(p.dir, pv.Name))
}

// startProvisioner creates the default StorageClass and runs its
// provisioner until the site stops.
func (s *Site) startProvisioner(ctx context.Context) error {
	sc := &storagev1.StorageClass{
		ObjectMeta: metav1.ObjectMeta{
			Name:        StorageClassName,
			Annotations: map[string]string{"storageclass.kubernetes.io/is-default-class": "true"},
		},
		Provisioner:       provisionerName,
		ReclaimPolicy:     ptr.To(corev1.PersistentVolumeReclaimDelete),
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer),
	}
	if err := s.Client.Create(ctx, sc); err != nil {
		return fmt.Errorf("creating StorageClass %s: %w", sc.Name, err)
	}
	// The volumes sit under the node's hostPath root, at the path the
	// node stand-in maps hostPath /var/lib/site-volumes to.
	const nodePath = "/var/lib/site-volumes"
	p := hostPathProvisioner{dir: filepath.Join(s.HostPathRoot, nodePath), node: nodePath}
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(klog.NewContext(context.Background(), s.log.WithName("provisioner")))
	pc := controller.NewProvisionController(runCtx, s.Kube, provisionerName, p,
		controller.LeaderElection(false))
	done := make(chan struct{})
	go func() {
		defer close(done)
		pc.Run(runCtx)
	}()
	s.onStop(func() error {
		cancel()
		<-done
		return nil
	})
	return nil
}
