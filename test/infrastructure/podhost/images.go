package podhost

import (
	"fmt"
	"path"
	"strings"
)

// Image says what a container image stands for on this machine: there is no
// container runtime and no registry here, so each image reference a Pod
// names maps to a local binary.
type Image struct {
	// Binary is the host path of the image's program; empty for an image
	// that only offers the host's tools (a shell image such as alpine).
	Binary string
	// Entrypoint is where the image holds that program, and the command a
	// container without `command` runs (the image's ENTRYPOINT).
	Entrypoint string
	// User is the image's USER: a container runtime runs a container as
	// that user when neither the container's nor the pod's security
	// context names one. nil: root, as for an image without USER.
	User *ImageUser
}

// ImageUser is an image's USER as numbers: the uid and the primary group
// the image's /etc/passwd gives it (distroless's nonroot is 65532:65532).
type ImageUser struct{ UID, GID uint32 }

// Images maps image repositories to local binaries. A key is a repository
// without tag or digest, either in full
// ("europe-docker.pkg.dev/gardener-project/public/gardener/etcdbrctl") or its
// last path element ("etcdbrctl"); the full key wins.
type Images map[string]Image

// Lookup finds the image for a reference such as
// "registry.example/gardener/etcdbrctl:v0.44.1" or "repo@sha256:...".
func (im Images) Lookup(ref string) (Image, error) {
	repo := repository(ref)
	if img, ok := im[repo]; ok {
		return img, nil
	}
	if img, ok := im[path.Base(repo)]; ok {
		return img, nil
	}
	known := make([]string, 0, len(im))
	for k := range im {
		known = append(known, k)
	}
	return Image{}, fmt.Errorf("image %q has no local stand-in (known: %s): add it to the node stand-in's image table", ref, strings.Join(known, ", "))
}

// repository strips the tag and digest from an image reference. A colon
// after the last slash starts the tag; one before it belongs to a registry
// port.
func repository(ref string) string {
	if i := strings.Index(ref, "@"); i >= 0 {
		ref = ref[:i]
	}
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		ref = ref[:i]
	}
	return ref
}
