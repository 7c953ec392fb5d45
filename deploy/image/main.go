// Command stage-image assembles the stage sidecar image without a container
// engine: an OCI image layout (a directory that skopeo, crane, podman and
// containerd read) and a docker-archive tarball (`docker load`, `podman
// load`), from a base root filesystem tarball and binaries built on the
// host. `make image` (scripts/image.sh) runs it; it replaces the Dockerfile.
//
// The image, two layers:
//
//   - the base: the rootfs tarball as it is (scripts/image.sh makes it with
//     debootstrap --variant=minbase, Debian bookworm);
//   - stage: /usr/local/bin/{staged,stagectl,stage-kvengine},
//     /etc/stage/staged.yaml, the user and group stage (10001) appended to
//     the base's /etc/passwd and /etc/group, and /run/stage (1777: like a
//     Kubernetes emptyDir, the socket volume's root is not the sidecar's).
//
// Its config: user 10001:10001, entrypoint staged, cmd --config
// /etc/stage/staged.yaml, STAGE_CONTROL_SOCKET=/run/stage/sock/staged.sock
// (read by staged, stagectl and stage-kvengine alike), port 7100/tcp, volume
// /run/stage. No healthcheck: orchestrators probe with `stagectl --socket
// /run/stage/sock/staged.sock stats`.
//
// Usage:
//
//	stage-image --base rootfs.tar --bin bin --config deploy/docker/staged.yaml \
//	    --tag stage:dev --out bin/image
//
// writes bin/image/oci (the layout; its manifest is annotated with the tag,
// so `skopeo copy oci:bin/image/oci:dev ...` finds it) and
// bin/image/docker-archive.tar. SOURCE_DATE_EPOCH, when set, is the image's
// creation time and the stage layer's file times.
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// What the image is; deploy/README.md describes it to users, and
// deploy/image/containere2e runs it.
const (
	uid, gid     = 10001, 10001
	userName     = "stage"
	binDir       = "usr/local/bin"
	configPath   = "etc/stage/staged.yaml"
	socketVolume = "/run/stage"
	controlSock  = "/run/stage/sock/staged.sock"
	peerPort     = "7100/tcp"
	defaultPATH  = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

var binaries = []string{"staged", "stagectl", "stage-kvengine"}

type options struct {
	base, bin, config, tag, out, revision string
	created                               time.Time
}

func main() {
	var o options
	flag.StringVar(&o.base, "base", "", "base root filesystem, an uncompressed tarball (required)")
	flag.StringVar(&o.bin, "bin", "bin", "directory holding "+strings.Join(binaries, ", "))
	flag.StringVar(&o.config, "config", "deploy/docker/staged.yaml", "the image's /"+configPath)
	flag.StringVar(&o.tag, "tag", "stage:dev", "image name and tag")
	flag.StringVar(&o.out, "out", "bin/image", "output directory: OUT/oci and OUT/docker-archive.tar")
	flag.StringVar(&o.revision, "revision", "", "source revision for the org.opencontainers.image.revision label")
	flag.Parse()
	if flag.NArg() > 0 {
		fail(fmt.Errorf("unexpected arguments %q: every input is a flag (see -h)", flag.Args()))
	}
	if o.base == "" {
		fail(errors.New("--base is required: the base root filesystem tarball (scripts/image.sh makes one with debootstrap)"))
	}
	o.created = time.Now().UTC().Truncate(time.Second)
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			fail(fmt.Errorf("SOURCE_DATE_EPOCH=%q is not a number of seconds: %v", s, err))
		}
		o.created = time.Unix(sec, 0).UTC()
	}
	digest, err := build(o)
	if err != nil {
		fail(err)
	}
	fmt.Printf("%s %s\n", o.tag, digest)
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "stage-image: %v\n", err)
	os.Exit(1)
}

// build writes the image to o.out and returns its manifest digest.
func build(o options) (v1.Hash, error) {
	var none v1.Hash
	tag, err := name.NewTag(o.tag)
	if err != nil {
		return none, fmt.Errorf("image name %q: %w", o.tag, err)
	}
	passwd, group, err := readBaseFiles(o.base)
	if err != nil {
		return none, err
	}
	stageTar, err := stageLayerTar(o, passwd, group)
	if err != nil {
		return none, err
	}
	img, err := assemble(o, stageTar)
	if err != nil {
		return none, err
	}
	digest, err := img.Digest()
	if err != nil {
		return none, fmt.Errorf("computing the image digest: %w", err)
	}
	if err := writeImage(o, tag, img); err != nil {
		return none, err
	}
	return digest, nil
}

// assemble makes the image: the base root filesystem and the stage layer
// (stageTar), with its config (user, entrypoint, socket volume, labels).
func assemble(o options, stageTar []byte) (v1.Image, error) {
	// Each layer is compressed once and kept: the digests, the layout and
	// the archive all read it.
	base, err := tarball.LayerFromFile(o.base, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
	if err != nil {
		return nil, fmt.Errorf("base layer from %s: %w", o.base, err)
	}
	stage, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(stageTar)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
	if err != nil {
		return nil, fmt.Errorf("stage layer: %w", err)
	}

	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	created := v1.Time{Time: o.created}
	img, err = mutate.Append(img,
		mutate.Addendum{Layer: base, History: v1.History{Created: created, CreatedBy: "base root filesystem " + filepath.Base(o.base) + " (scripts/image.sh: debootstrap --variant=minbase)"}},
		mutate.Addendum{Layer: stage, History: v1.History{Created: created, CreatedBy: "stage-image: " + strings.Join(binaries, ", ") + ", /" + configPath + ", user " + userName}},
	)
	if err != nil {
		return nil, fmt.Errorf("appending the layers: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("reading the image config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.Architecture = runtime.GOARCH // the binaries are the host's
	cf.OS = "linux"
	cf.Created = created
	labels := map[string]string{
		"org.opencontainers.image.title":       "stage",
		"org.opencontainers.image.description": "staged: KV-cache transfer sidecar for LLM inference pods (with stagectl)",
	}
	if o.revision != "" {
		labels["org.opencontainers.image.revision"] = o.revision
	}
	cf.Config = v1.Config{
		User:         fmt.Sprintf("%d:%d", uid, gid),
		Env:          []string{"PATH=" + defaultPATH, "STAGE_CONTROL_SOCKET=" + controlSock},
		Entrypoint:   []string{"/" + binDir + "/staged"},
		Cmd:          []string{"--config", "/" + configPath},
		WorkingDir:   "/",
		ExposedPorts: map[string]struct{}{peerPort: {}},
		Volumes:      map[string]struct{}{socketVolume: {}},
		Labels:       labels,
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, fmt.Errorf("setting the image config: %w", err)
	}
	return img, nil
}

// writeImage writes img as an OCI layout (o.out/oci) and a docker archive
// (o.out/docker-archive.tar), beside the old ones and then swapped in: a
// failed run leaves the previous image whole.
func writeImage(o options, tag name.Tag, img v1.Image) error {
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", o.out, err)
	}
	ociDir, archive := filepath.Join(o.out, "oci"), filepath.Join(o.out, "docker-archive.tar")
	tmpDir := ociDir + ".tmp"
	if err := os.RemoveAll(tmpDir); err != nil {
		return fmt.Errorf("removing a stale %s: %w", tmpDir, err)
	}
	p, err := layout.Write(tmpDir, empty.Index)
	if err != nil {
		return fmt.Errorf("creating the OCI layout %s: %w", tmpDir, err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": tag.TagStr(),
	})); err != nil {
		return fmt.Errorf("writing the image to the OCI layout %s: %w", tmpDir, err)
	}
	// Blobs are written through temporary files (0600): make them as
	// readable as the rest, so another user can push what root built.
	if err := filepath.WalkDir(tmpDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		return os.Chmod(p, 0o644)
	}); err != nil {
		return fmt.Errorf("making the OCI layout %s readable: %w", tmpDir, err)
	}
	if err := tarball.WriteToFile(archive+".tmp", tag, img); err != nil {
		return fmt.Errorf("writing the docker archive %s: %w", archive+".tmp", err)
	}
	if err := os.RemoveAll(ociDir); err != nil {
		return fmt.Errorf("removing the previous %s: %w", ociDir, err)
	}
	if err := os.Rename(tmpDir, ociDir); err != nil {
		return fmt.Errorf("moving the OCI layout into place: %w", err)
	}
	if err := os.Rename(archive+".tmp", archive); err != nil {
		return fmt.Errorf("moving the docker archive into place: %w", err)
	}
	return nil
}

// readBaseFiles returns the base's /etc/passwd and /etc/group, and checks
// that it has the directories the stage layer puts files in.
func readBaseFiles(base string) (passwd, group []byte, err error) {
	f, err := os.Open(base)
	if err != nil {
		return nil, nil, fmt.Errorf("opening the base rootfs: %w", err)
	}
	defer f.Close()
	need := map[string]bool{"etc": false, "run": false, binDir: false}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, nil, fmt.Errorf("reading the base rootfs %s (an uncompressed tar of a root filesystem): %w", base, err)
		}
		n := strings.TrimSuffix(path.Clean("/" + h.Name)[1:], "/")
		switch {
		case n == "etc/passwd" && h.Typeflag == tar.TypeReg:
			passwd, err = io.ReadAll(tr)
		case n == "etc/group" && h.Typeflag == tar.TypeReg:
			group, err = io.ReadAll(tr)
		case h.Typeflag == tar.TypeDir:
			if _, ok := need[n]; ok {
				need[n] = true
			}
		}
		if err != nil {
			return nil, nil, fmt.Errorf("reading %s from the base rootfs: %w", n, err)
		}
	}
	if passwd == nil || group == nil {
		return nil, nil, fmt.Errorf("the base rootfs %s has no /etc/passwd or /etc/group: is it a root filesystem?", base)
	}
	for d, ok := range need {
		if !ok {
			return nil, nil, fmt.Errorf("the base rootfs %s has no directory /%s", base, d)
		}
	}
	return passwd, group, nil
}

// stageLayerTar returns the stage layer, an uncompressed tar.
func stageLayerTar(o options, passwd, group []byte) ([]byte, error) {
	passwd, err := appendEntry(passwd, "/etc/passwd", fmt.Sprintf("%s:x:%d:%d:stage sidecar:/nonexistent:/usr/sbin/nologin", userName, uid, gid), 2)
	if err != nil {
		return nil, err
	}
	group, err = appendEntry(group, "/etc/group", fmt.Sprintf("%s:x:%d:", userName, gid), 2)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hdr := func(n string, typ byte, mode int64, size int) *tar.Header {
		return &tar.Header{Name: n, Typeflag: typ, Mode: mode, Size: int64(size), ModTime: o.created, Format: tar.FormatPAX}
	}
	write := func(h *tar.Header, data []byte) error {
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("stage layer: %s: %w", h.Name, err)
		}
		if _, err := tw.Write(data); err != nil {
			return fmt.Errorf("stage layer: %s: %w", h.Name, err)
		}
		return nil
	}
	if err := write(hdr("etc/passwd", tar.TypeReg, 0o644, len(passwd)), passwd); err != nil {
		return nil, err
	}
	if err := write(hdr("etc/group", tar.TypeReg, 0o644, len(group)), group); err != nil {
		return nil, err
	}
	if err := write(hdr("etc/stage/", tar.TypeDir, 0o755, 0), nil); err != nil {
		return nil, err
	}
	cfg, err := os.ReadFile(o.config)
	if err != nil {
		return nil, fmt.Errorf("reading the image's staged.yaml: %w", err)
	}
	if err := write(hdr(configPath, tar.TypeReg, 0o644, len(cfg)), cfg); err != nil {
		return nil, err
	}
	// The socket volume's mount point, world-writable and sticky like an
	// emptyDir, so staged makes its own 0700 directory inside.
	if err := write(hdr("run/stage/", tar.TypeDir, 0o1777, 0), nil); err != nil {
		return nil, err
	}
	for _, b := range binaries {
		p := filepath.Join(o.bin, b)
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("reading %s (make build and scripts/image.sh build it): %w", p, err)
		}
		if err := write(hdr(binDir+"/"+b, tar.TypeReg, 0o755, len(data)), data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("stage layer: %w", err)
	}
	return buf.Bytes(), nil
}

// appendEntry appends line to a passwd-style file, refusing when its name
// or its id (field idField) is taken.
func appendEntry(file []byte, what, line string, idField int) ([]byte, error) {
	nf := strings.Split(line, ":")
	for _, l := range strings.Split(string(file), "\n") {
		f := strings.Split(l, ":")
		if len(f) <= idField {
			continue
		}
		if f[0] == nf[0] || f[idField] == nf[idField] {
			return nil, fmt.Errorf("the base's %s already has %q (name %s or id %s taken): use a base without it", what, l, nf[0], nf[idField])
		}
	}
	out := append([]byte(nil), file...)
	if len(out) > 0 && out[len(out)-1] != '\n' {
		out = append(out, '\n')
	}
	return append(out, line+"\n"...), nil
}
