package podhost

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// volumes writes every volume of pod under dir/volumes and returns the host
// folder of each by volume name. What it supports is what druid's, the
// chart's and the tests' pods use; anything else is refused by name, so a
// Pod never runs with a volume silently missing.
func (h *Host) volumes(ctx context.Context, pod *corev1.Pod, dir string) (map[string]string, error) {
	paths := map[string]string{}
	for _, v := range pod.Spec.Volumes {
		p := filepath.Join(dir, "volumes", v.Name)
		var err error
		switch {
		case v.EmptyDir != nil:
			err = emptyDir(p)
			if err == nil {
				err = h.ownForFSGroup(pod, p)
			}
		case v.ConfigMap != nil:
			err = h.writeConfigMap(ctx, pod, p, v.ConfigMap.Name, v.ConfigMap.Items, v.ConfigMap.DefaultMode, v.ConfigMap.Optional)
		case v.Secret != nil:
			err = h.writeSecret(ctx, pod, p, v.Secret.SecretName, v.Secret.Items, v.Secret.DefaultMode, v.Secret.Optional)
		case v.Projected != nil:
			err = h.writeProjected(ctx, pod, p, v.Projected)
		case v.DownwardAPI != nil:
			err = h.writeDownwardAPI(pod, p, v.DownwardAPI.Items, v.DownwardAPI.DefaultMode)
		case v.PersistentVolumeClaim != nil:
			p, err = h.claimDir(ctx, pod, v.PersistentVolumeClaim.ClaimName)
		case v.HostPath != nil:
			p, err = h.hostPath(v.HostPath)
		default:
			err = errors.New("this volume type is not supported by the node stand-in")
		}
		if err != nil {
			return nil, fmt.Errorf("volume %q: %w", v.Name, err)
		}
		paths[v.Name] = p
	}
	return paths, nil
}

// emptyDir makes an emptyDir volume's folder writable by every user, as
// kubelet does (it chmods past the umask): a container that runs as a user
// of its image's, with no fsGroup to own the volume (druid's compaction
// Job), writes into it.
func emptyDir(p string) error {
	if err := os.MkdirAll(p, 0o777); err != nil {
		return err
	}
	return os.Chmod(p, 0o777)
}

// file is one file of a ConfigMap, Secret, projected or downward API volume.
type file struct {
	path string
	data []byte
	mode int32
}

func mode(item *int32, def *int32) int32 {
	if item != nil {
		return *item
	}
	return ptr.Deref(def, corev1.SecretVolumeSourceDefaultMode)
}

// keyFiles picks the files of a ConfigMap or Secret: every key, or the
// items listed.
func keyFiles(data map[string][]byte, items []corev1.KeyToPath, def *int32, what string) ([]file, error) {
	var files []file
	if len(items) == 0 {
		for k, v := range data {
			files = append(files, file{path: k, data: v, mode: mode(nil, def)})
		}
		return files, nil
	}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok {
			return nil, fmt.Errorf("%s has no key %q", what, it.Key)
		}
		files = append(files, file{path: it.Path, data: v, mode: mode(it.Mode, def)})
	}
	return files, nil
}

func (h *Host) configMapFiles(ctx context.Context, ns, name string, items []corev1.KeyToPath, def *int32, optional *bool) ([]file, error) {
	cm, err := h.opts.Client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if ptr.Deref(optional, false) && isNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading ConfigMap %s: %w", name, err)
	}
	data := map[string][]byte{}
	for k, v := range cm.Data {
		data[k] = []byte(v)
	}
	for k, v := range cm.BinaryData {
		data[k] = v
	}
	return keyFiles(data, items, def, "ConfigMap "+name)
}

func (h *Host) secretFiles(ctx context.Context, ns, name string, items []corev1.KeyToPath, def *int32, optional *bool) ([]file, error) {
	s, err := h.opts.Client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if ptr.Deref(optional, false) && isNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading Secret %s: %w", name, err)
	}
	return keyFiles(s.Data, items, def, "Secret "+name)
}

func (h *Host) writeConfigMap(ctx context.Context, pod *corev1.Pod, dir, name string, items []corev1.KeyToPath, def *int32, optional *bool) error {
	files, err := h.configMapFiles(ctx, pod.Namespace, name, items, def, optional)
	if err != nil {
		return err
	}
	return writeFiles(pod, dir, files)
}

func (h *Host) writeSecret(ctx context.Context, pod *corev1.Pod, dir, name string, items []corev1.KeyToPath, def *int32, optional *bool) error {
	files, err := h.secretFiles(ctx, pod.Namespace, name, items, def, optional)
	if err != nil {
		return err
	}
	return writeFiles(pod, dir, files)
}

func (h *Host) writeDownwardAPI(pod *corev1.Pod, dir string, items []corev1.DownwardAPIVolumeFile, def *int32) error {
	files, err := downwardFiles(pod, items, def)
	if err != nil {
		return err
	}
	return writeFiles(pod, dir, files)
}

func downwardFiles(pod *corev1.Pod, items []corev1.DownwardAPIVolumeFile, def *int32) ([]file, error) {
	var files []file
	for _, it := range items {
		if it.FieldRef == nil {
			return nil, fmt.Errorf("downward API file %s: only fieldRef is supported", it.Path)
		}
		v, err := fieldValue(pod, it.FieldRef.FieldPath)
		if err != nil {
			return nil, err
		}
		files = append(files, file{path: it.Path, data: []byte(v), mode: mode(it.Mode, def)})
	}
	return files, nil
}

// fieldValue reads the pod fields a downward API volume may name.
func fieldValue(pod *corev1.Pod, path string) (string, error) {
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	}
	return "", fmt.Errorf("downward API field %q is not supported by the node stand-in", path)
}

// writeProjected writes a projected volume: the ServiceAccount token volume
// the API server adds to every pod, and ConfigMap, Secret and downward API
// sources.
func (h *Host) writeProjected(ctx context.Context, pod *corev1.Pod, dir string, p *corev1.ProjectedVolumeSource) error {
	var files []file
	for _, src := range p.Sources {
		var more []file
		var err error
		switch {
		case src.ServiceAccountToken != nil:
			var token string
			token, err = h.token(ctx, pod, src.ServiceAccountToken)
			more = []file{{path: src.ServiceAccountToken.Path, data: []byte(token), mode: mode(nil, p.DefaultMode)}}
		case src.ConfigMap != nil:
			more, err = h.configMapFiles(ctx, pod.Namespace, src.ConfigMap.Name, src.ConfigMap.Items, p.DefaultMode, src.ConfigMap.Optional)
		case src.Secret != nil:
			more, err = h.secretFiles(ctx, pod.Namespace, src.Secret.Name, src.Secret.Items, p.DefaultMode, src.Secret.Optional)
		case src.DownwardAPI != nil:
			more, err = downwardFiles(pod, src.DownwardAPI.Items, p.DefaultMode)
		default:
			err = errors.New("this projected volume source is not supported by the node stand-in")
		}
		if err != nil {
			return err
		}
		files = append(files, more...)
	}
	return writeFiles(pod, dir, files)
}

// token asks the API server for a token bound to the pod, as kubelet does.
// It is not refreshed: a site lives far shorter than the token.
func (h *Host) token(ctx context.Context, pod *corev1.Pod, src *corev1.ServiceAccountTokenProjection) (string, error) {
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: src.ExpirationSeconds,
		BoundObjectRef: &authenticationv1.BoundObjectReference{
			Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID,
		},
	}}
	if src.Audience != "" {
		req.Spec.Audiences = []string{src.Audience}
	}
	tr, err := h.opts.Client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, sa, req, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("requesting a token of ServiceAccount %s: %w", sa, err)
	}
	return tr.Status.Token, nil
}

// writeFiles replaces dir's content with files (swapFiles), the first
// time a pod's volume is written.
func writeFiles(pod *corev1.Pod, dir string, files []file) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return swapFiles(pod, dir, files)
}

// syncVolumes keeps the pod's Secret and ConfigMap volumes as their
// objects are, every Options.VolumeSyncPeriod until the pod stops, as
// kubelet does: a changed object's files are swapped in place (swapFiles).
// A volume whose object cannot be read keeps its files.
func (r *podRun) syncVolumes() {
	tick := time.NewTicker(r.h.opts.VolumeSyncPeriod)
	defer tick.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-tick.C:
		}
		r.mu.Lock()
		pod := r.pod.DeepCopy()
		r.mu.Unlock()
		for _, v := range pod.Spec.Volumes {
			var (
				files []file
				err   error
			)
			switch {
			case v.Secret != nil:
				files, err = r.h.secretFiles(r.ctx, pod.Namespace, v.Secret.SecretName, v.Secret.Items, v.Secret.DefaultMode, v.Secret.Optional)
			case v.ConfigMap != nil:
				files, err = r.h.configMapFiles(r.ctx, pod.Namespace, v.ConfigMap.Name, v.ConfigMap.Items, v.ConfigMap.DefaultMode, v.ConfigMap.Optional)
			default:
				continue
			}
			dir := filepath.Join(r.dir, "volumes", v.Name)
			if err == nil && !sameFiles(dir, files) {
				if err = swapFiles(pod, dir, files); err == nil {
					r.log.Info("volume updated from its object", "volume", v.Name)
				}
			}
			if err != nil && r.ctx.Err() == nil {
				r.log.Info("volume not updated", "volume", v.Name, "error", err.Error())
			}
		}
	}
}

// sameFiles tells whether dir's current files (through ..data) are files.
func sameFiles(dir string, files []file) bool {
	n := 0
	err := filepath.WalkDir(filepath.Join(dir, dataLink)+string(filepath.Separator), func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			n++
		}
		return err
	})
	if err != nil || n != len(files) {
		return false
	}
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(dir, dataLink, filepath.Clean(f.path)))
		if err != nil || !bytes.Equal(data, f.data) {
			return false
		}
	}
	return true
}

// dataLink is the link kubelet's atomic writer keeps in a volume's folder:
// it names the folder of the current files, and every file's name links
// through it.
const dataLink = "..data"

// swapFiles lays files out in dir as kubelet's atomic writer does, owned by
// root and the pod's fsGroup: the files in a new folder ..<random>, the
// link ..data renamed onto it in one step, each top-level name a link
// through ..data, and the folder ..data named before removed. A process
// that watches a file (a certificate watcher) sees the old set or the new,
// never a mix, and a container that has the volume mounted sees the new
// set without a restart (syncVolumes).
func swapFiles(pod *corev1.Pod, dir string, files []file) error {
	for _, f := range files {
		if clean := filepath.Clean(f.path); filepath.IsAbs(clean) || strings.HasPrefix(clean, "..") {
			return fmt.Errorf("file path %q leaves the volume", f.path)
		}
	}
	old, _ := os.Readlink(filepath.Join(dir, dataLink))
	gen, err := os.MkdirTemp(dir, "..")
	if err != nil {
		return err
	}
	if err := os.Chmod(gen, 0o755); err != nil {
		return err
	}
	gid := -1
	if sc := pod.Spec.SecurityContext; sc != nil && sc.FSGroup != nil {
		gid = int(*sc.FSGroup)
	}
	top := map[string]bool{}
	for _, f := range files {
		clean := filepath.Clean(f.path)
		top[strings.Split(clean, string(filepath.Separator))[0]] = true
		p := filepath.Join(gen, clean)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		perm := fs.FileMode(f.mode) & fs.ModePerm
		if gid >= 0 {
			perm |= 0o040 // fsGroup members may read, as kubelet grants
		}
		if err := os.WriteFile(p, f.data, perm); err != nil {
			return err
		}
		if err := os.Chmod(p, perm); err != nil { // WriteFile's mode passes the umask
			return err
		}
		if gid >= 0 {
			if err := os.Chown(p, 0, gid); err != nil {
				return err
			}
		}
	}
	tmp := filepath.Join(dir, dataLink+"_tmp")
	_ = os.Remove(tmp)
	if err := os.Symlink(filepath.Base(gen), tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, dataLink)); err != nil {
		return err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if name := e.Name(); !strings.HasPrefix(name, "..") && !top[name] {
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				return err
			}
		}
	}
	for name := range top {
		link := filepath.Join(dir, name)
		if _, err := os.Lstat(link); err == nil {
			continue
		}
		if err := os.Symlink(filepath.Join(dataLink, name), link); err != nil {
			return err
		}
	}
	if old != "" && old != filepath.Base(gen) {
		return os.RemoveAll(filepath.Join(dir, old))
	}
	return nil
}

// claimDir finds the host folder of a bound PersistentVolumeClaim: the
// hostPath or local path of its PersistentVolume, under HostPathRoot.
func (h *Host) claimDir(ctx context.Context, pod *corev1.Pod, claim string) (string, error) {
	pvc, err := h.opts.Client.CoreV1().PersistentVolumeClaims(pod.Namespace).Get(ctx, claim, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("reading PersistentVolumeClaim %s: %w", claim, err)
	}
	if pvc.Spec.VolumeName == "" || pvc.Status.Phase != corev1.ClaimBound {
		return "", fmt.Errorf("PersistentVolumeClaim %s is not bound yet (phase %s)", claim, pvc.Status.Phase)
	}
	pv, err := h.opts.Client.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("reading PersistentVolume %s of claim %s: %w", pvc.Spec.VolumeName, claim, err)
	}
	// A volume's path is a path on the node, which lives under
	// HostPathRoot like every hostPath volume.
	var dir string
	switch {
	case pv.Spec.HostPath != nil:
		dir = filepath.Join(h.opts.HostPathRoot, filepath.Clean(pv.Spec.HostPath.Path))
	case pv.Spec.Local != nil:
		dir = filepath.Join(h.opts.HostPathRoot, filepath.Clean(pv.Spec.Local.Path))
	default:
		return "", fmt.Errorf("PersistentVolume %s of claim %s is neither hostPath nor local", pv.Name, claim)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	return dir, h.ownForFSGroup(pod, dir)
}

// hostPath maps a hostPath volume into Options.HostPathRoot: tests must not
// write into the machine's real folders.
func (h *Host) hostPath(src *corev1.HostPathVolumeSource) (string, error) {
	if !filepath.IsAbs(src.Path) {
		return "", fmt.Errorf("hostPath %q is not absolute", src.Path)
	}
	p := filepath.Join(h.opts.HostPathRoot, filepath.Clean(src.Path))
	switch ptr.Deref(src.Type, corev1.HostPathUnset) {
	case corev1.HostPathDirectoryOrCreate, corev1.HostPathUnset:
		return p, os.MkdirAll(p, 0o755)
	case corev1.HostPathDirectory:
		if st, err := os.Stat(p); err != nil || !st.IsDir() {
			return "", fmt.Errorf("hostPath %s (at %s) is no directory", src.Path, p)
		}
	}
	return p, nil
}

// ownForFSGroup gives a writable volume to the pod's fsGroup, as kubelet
// does: group ownership and group read-write on every file, with the
// set-group-ID bit on folders so that new files inherit the group. With
// fsGroupChangePolicy OnRootMismatch it stops at a root that already fits.
func (h *Host) ownForFSGroup(pod *corev1.Pod, dir string) error {
	sc := pod.Spec.SecurityContext
	if sc == nil || sc.FSGroup == nil {
		return nil
	}
	gid := int(*sc.FSGroup)
	if ptr.Deref(sc.FSGroupChangePolicy, corev1.FSGroupChangeAlways) == corev1.FSGroupChangeOnRootMismatch {
		if st, err := os.Stat(dir); err == nil && statGID(st) == gid && st.Mode()&fs.ModeSetgid != 0 {
			return nil
		}
	}
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if err := os.Lchown(p, -1, gid); err != nil {
			return err
		}
		m := info.Mode() | 0o060
		if d.IsDir() {
			m |= 0o010 | fs.ModeSetgid
		}
		return os.Chmod(p, m&(fs.ModePerm|fs.ModeSetgid))
	})
}
