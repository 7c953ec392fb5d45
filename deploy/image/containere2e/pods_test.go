package containere2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// What both engines agree on (stage-kvengine flags), and what the test
// checks against the sidecars' stats.
const (
	layers     = 4
	layerBytes = 4 << 20
	rounds     = 2
	socketPath = "/run/stage/sock/staged.sock" // the image's STAGE_CONTROL_SOCKET; the probe in deploy/k8s uses it too
	volumePath = "/run/stage"                  // the image's volume
	peerPort   = "7100/tcp"
)

var engineShape = []string{"--layers", fmt.Sprint(layers), "--layer-bytes", "4MiB", "--block", "16KiB", "--seed", "7",
	"--rounds", fmt.Sprint(rounds), "--timeout", "2m"}

// stats is the part of `stagectl stats --json` (wire.Stats) the test reads.
type stats struct {
	Links []struct {
		BytesOut uint64 `json:"bytes_out"`
		BytesIn  uint64 `json:"bytes_in"`
		XfersOK  uint64 `json:"transfers_ok"`
	} `json:"links"`
}

// image is the unpacked image and its config.
type image struct {
	rootfs   string
	cfg      v1.Config
	uid, gid int
}

// pod is a network namespace, a socket volume and the files every
// container of the pod gets.
type pod struct {
	name, host, addr string
	netns            string
	mounts           []mount
}

func (im *image) spec(p *pod, uid, gid int, args []string, env ...string) spec {
	dir := im.cfg.WorkingDir
	if dir == "" {
		dir = "/"
	}
	return spec{Root: im.rootfs, NetNS: "/run/netns/" + p.netns, Hostname: p.host, Mounts: p.mounts,
		UID: uid, GID: gid, Dir: dir, Env: append(slices.Clone(im.cfg.Env), env...), Args: args}
}

func TestPrefillDecodePods(t *testing.T) {
	im := setup(t)
	id := randomHex(3)
	token := randomHex(16)
	t0 := time.Now()

	// The pods' network: a veth pair between their namespaces, addresses
	// in them alone. Removed after the containers (cleanups run last
	// registered first).
	pre := &pod{name: "prefill", host: "prefill-0", addr: "10.225.0.1"}
	dec := &pod{name: "decode", host: "decode-0", addr: "10.225.0.2"}
	hosts := filepath.Join(t.TempDir(), "hosts")
	writeFile(t, hosts, fmt.Sprintf("127.0.0.1\tlocalhost\n::1\tlocalhost\n%s\t%s\n%s\t%s\n", pre.addr, pre.host, dec.addr, dec.host), 0o644)
	for _, p := range []*pod{pre, dec} {
		p.netns = "stage-img-" + id + "-" + p.name
		if err := ip("netns", "add", p.netns); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := ip("netns", "delete", p.netns); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		})
		// The socket volume: root-owned and world-writable, like an emptyDir.
		vol := filepath.Join(t.TempDir(), "run-stage")
		if err := os.Mkdir(vol, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(vol, os.ModeSticky|0o777); err != nil {
			t.Fatal(err)
		}
		p.mounts = []mount{{Source: vol, Target: volumePath}, {Source: hosts, Target: "/etc/hosts", ReadOnly: true}}
	}
	if err := ip("link", "add", "eth0", "netns", pre.netns, "type", "veth", "peer", "name", "eth0", "netns", dec.netns); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*pod{pre, dec} {
		for _, args := range [][]string{{"addr", "add", p.addr + "/24", "dev", "eth0"}, {"link", "set", "eth0", "up"}, {"link", "set", "lo", "up"}} {
			if err := ip(append([]string{"-n", p.netns}, args...)...); err != nil {
				t.Fatal(err)
			}
		}
	}

	// The prefill sidecar's config, mounted read-only over /etc/stage like
	// a ConfigMap; it names the decode sidecar by its pod's host name. The
	// decode sidecar keeps the image's config.
	cfgDir := filepath.Join(t.TempDir(), "prefill-config")
	if err := os.Mkdir(cfgDir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(cfgDir, "staged.yaml"), `node:
  name: prefill-0
listen: ":7100"
routes:
  - name: decode
    peers: ["decode-0:7100"]
    stripes: 2
    connect_timeout: 2s
log:
  format: json
`, 0o644)

	var containers []*container
	t.Cleanup(func() {
		for _, c := range containers {
			c.kill()
			if t.Failed() {
				t.Logf("==== output of %s (%v)\n%s", c.name, c.err, c.out.String())
			}
		}
	})
	start := func(name string, s spec) *container {
		t.Helper()
		c, err := startContainer(name, s)
		if err != nil {
			t.Fatal(err)
		}
		containers = append(containers, c)
		return c
	}
	sidecarArgs := append(slices.Clone(im.cfg.Entrypoint), im.cfg.Cmd...)
	tokenEnv := "STAGE_SECURITY_TOKEN=" + token // in the environment: never on a command line
	decSidecar := start("decode-staged", im.spec(dec, im.uid, im.gid, sidecarArgs, tokenEnv, "STAGE_NODE_NAME=decode-0"))
	preSpec := im.spec(pre, im.uid, im.gid, sidecarArgs, tokenEnv)
	preSpec.Mounts = append(slices.Clone(preSpec.Mounts), mount{Source: cfgDir, Target: "/etc/stage", ReadOnly: true})
	preSidecar := start("prefill-staged", preSpec)
	for _, c := range []*container{decSidecar, preSidecar} {
		waitLog(t, c, "staged ready ", 30*time.Second)
	}
	t.Logf("two sidecars ready in %v", time.Since(t0).Round(time.Millisecond))

	// Engines: the pod's network namespace and socket volume, the image's
	// user (the socket is 0600 in a 0700 directory).
	engine := func(p *pod, args ...string) *container {
		a := append([]string{"/usr/local/bin/stage-kvengine", p.name}, engineShape...)
		return start(p.name+"-engine", im.spec(p, im.uid, im.gid, append(a, args...)))
	}
	t1 := time.Now()
	decEngine := engine(dec)
	waitLog(t, decEngine, "decode: ready", 30*time.Second)
	preEngine := engine(pre, "--route", "decode", "--remote", "decode-kv")
	for _, e := range []struct {
		c    *container
		want string
	}{{preEngine, fmt.Sprintf("pushed %d rounds", rounds)}, {decEngine, fmt.Sprintf("verified %d rounds", rounds)}} {
		if !e.c.wait(3 * time.Minute) {
			t.Fatalf("%s did not exit within 3m:\n%s", e.c.name, e.c.out.String())
		}
		out := e.c.out.String()
		if code := e.c.exitCode(); code != 0 {
			t.Fatalf("%s exited %d:\n%s", e.c.name, code, out)
		}
		if !strings.Contains(out, e.want) {
			t.Fatalf("%s did not report %q:\n%s", e.c.name, e.want, out)
		}
		t.Logf("%s:\n%s", e.c.name, strings.TrimSpace(out))
	}
	t.Logf("engines done in %v", time.Since(t1).Round(time.Millisecond))

	// The Kubernetes probe's command works in the sidecar's pod, and the
	// stats show the bytes crossed between the pods.
	inPod := func(p *pod, uid, gid int, args ...string) (string, int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, code, err := runContainer(ctx, p.name+": "+args[0], im.spec(p, uid, gid, args))
		if err != nil {
			t.Fatalf("%v:\n%s", err, out)
		}
		return out, code
	}
	want := uint64(rounds * layers * layerBytes)
	for _, p := range []*pod{pre, dec} {
		if out, code := inPod(p, im.uid, im.gid, "stagectl", "--socket", socketPath, "stats"); code != 0 {
			t.Fatalf("%s: the probe command `stagectl stats` exited %d:\n%s", p.name, code, out)
		}
		out, code := inPod(p, im.uid, im.gid, "stagectl", "--socket", socketPath, "stats", "--json")
		var st stats
		if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil {
			t.Fatalf("%s: stats --json exited %d (%v):\n%s", p.name, code, err, out)
		}
		var moved, ok uint64
		for _, l := range st.Links {
			if p == pre {
				moved += l.BytesOut
			} else {
				moved += l.BytesIn
			}
			ok += l.XfersOK
		}
		if moved < want || ok < rounds*layers {
			t.Errorf("%s sidecar stats: %d B moved and %d transfers ok, want >= %d B and >= %d: %+v", p.name, moved, ok, want, rounds*layers, st.Links)
		}
	}

	// The socket is the sidecar user's alone: its own 0700 directory inside
	// the shared volume, the socket 0600; another uid cannot connect.
	wantMode := fmt.Sprintf("700 %d\n600 %d", im.uid, im.uid)
	if out, _ := inPod(dec, im.uid, im.gid, "stat", "-c", "%a %u", volumePath+"/sock", socketPath); strings.TrimSpace(out) != wantMode {
		t.Errorf("socket directory and socket: mode and owner %q, want 700 and 600, owned by %d", out, im.uid)
	}
	if out, code := inPod(dec, im.uid+1, im.gid+1, "stagectl", "--socket", socketPath, "stats"); code == 0 || !strings.Contains(out, "permission denied") {
		t.Errorf("uid %d queried the sidecar (exit %d, output %q); want permission denied", im.uid+1, code, out)
	}

	// SIGTERM (what a kubelet sends) ends staged, PID 1 of its container, with 0.
	for _, c := range []*container{preSidecar, decSidecar} {
		if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatalf("SIGTERM to %s: %v", c.name, err)
		}
		if !c.wait(40 * time.Second) {
			t.Fatalf("%s did not exit within 40s of SIGTERM:\n%s", c.name, c.out.String())
		}
		if code := c.exitCode(); code != 0 {
			t.Errorf("%s exited %d after SIGTERM:\n%s", c.name, code, c.out.String())
		}
		if strings.Contains(c.out.String(), "panic") {
			t.Errorf("%s panicked:\n%s", c.name, c.out.String())
		}
	}
	t.Logf("whole test %v (%d containers)", time.Since(t0).Round(time.Millisecond), len(containers))
}

// setup loads and unpacks the image, or skips (fails, with
// STAGE_IMAGE_TEST set) when the test cannot run here.
func setup(t *testing.T) *image {
	required := os.Getenv("STAGE_IMAGE_TEST") != ""
	unusable := func(format string, args ...any) {
		t.Helper()
		msg := fmt.Sprintf(format, args...)
		if required {
			t.Fatalf("%s (required: STAGE_IMAGE_TEST is set)", msg)
		}
		t.Skipf("%s; build the image and run this test with `make image-test`", msg)
	}
	if os.Geteuid() != 0 {
		unusable("needs root (network namespaces, mounts, chroot)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		unusable("needs iproute2's ip (apt-get install iproute2)")
	}
	ref := os.Getenv("STAGE_IMAGE")
	if ref == "" {
		ref = "stage:dev"
	}
	dir := os.Getenv("STAGE_IMAGE_OUT")
	if dir == "" {
		dir = "../../../bin/image"
	}
	if _, err := os.Stat(filepath.Join(dir, "oci", "index.json")); err != nil {
		unusable("no image in %s (%v)", dir, err)
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatalf("STAGE_IMAGE=%q: %v", ref, err)
	}
	img, err := loadImage(filepath.Join(dir, "oci"), tag)
	if err != nil {
		t.Fatal(err)
	}
	if err := sameImage(img, filepath.Join(dir, "docker-archive.tar"), tag); err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatalf("reading the image config: %v", err)
	}
	if _, ok := cf.Config.Volumes[volumePath]; !ok {
		t.Fatalf("the image declares volumes %v, want %s", cf.Config.Volumes, volumePath)
	}
	if _, ok := cf.Config.ExposedPorts[peerPort]; !ok {
		t.Fatalf("the image exposes %v, want %s", cf.Config.ExposedPorts, peerPort)
	}
	if !slices.Contains(cf.Config.Env, "STAGE_CONTROL_SOCKET="+socketPath) {
		t.Fatalf("the image's environment %q does not set STAGE_CONTROL_SOCKET=%s", cf.Config.Env, socketPath)
	}
	uid, gid, err := imageUser(cf.Config.User)
	if err != nil {
		t.Fatal(err)
	}
	if uid == 0 {
		t.Fatalf("the image runs as root (user %q)", cf.Config.User)
	}

	t0 := time.Now()
	rootfs := filepath.Join(t.TempDir(), "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	skipped, err := unpack(img, rootfs)
	if err != nil {
		t.Fatalf("unpacking the image into %s: %v", rootfs, err)
	}
	// What a runtime provides: a file to mount the pod's /etc/hosts on.
	if _, err := os.Lstat(filepath.Join(rootfs, "etc/hosts")); os.IsNotExist(err) {
		writeFile(t, filepath.Join(rootfs, "etc/hosts"), "", 0o644)
	}
	t.Logf("image %s unpacked in %v (%d device nodes left out)", ref, time.Since(t0).Round(time.Millisecond), skipped)
	return &image{rootfs: rootfs, cfg: cf.Config, uid: uid, gid: gid}
}

// loadImage returns the image tagged tag in an OCI layout.
func loadImage(dir string, tag name.Tag) (v1.Image, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("reading the OCI layout %s: %w", dir, err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("reading the index of %s: %w", dir, err)
	}
	var tags []string
	for _, d := range m.Manifests {
		ref := d.Annotations["org.opencontainers.image.ref.name"]
		if ref == tag.TagStr() {
			img, err := idx.Image(d.Digest)
			if err != nil {
				return nil, fmt.Errorf("reading image %s from %s: %w", d.Digest, dir, err)
			}
			return img, nil
		}
		tags = append(tags, ref)
	}
	return nil, fmt.Errorf("the OCI layout %s has no image tagged %q (it has %q): run `make image` with STAGE_IMAGE=%s", dir, tag.TagStr(), tags, tag)
}

// sameImage checks that the docker archive holds img under tag: the same
// config and the same layers.
func sameImage(img v1.Image, archive string, tag name.Tag) error {
	other, err := tarball.ImageFromPath(archive, &tag)
	if err != nil {
		return fmt.Errorf("reading %s from the docker archive %s: %w", tag, archive, err)
	}
	for _, i := range []v1.Image{img, other} {
		if _, err := i.ConfigName(); err != nil {
			return fmt.Errorf("image config digest: %w", err)
		}
	}
	a, _ := img.ConfigName()
	b, _ := other.ConfigName()
	if a != b {
		return fmt.Errorf("the docker archive %s has config %s, the OCI layout %s: rebuild with `make image`", archive, b, a)
	}
	la, err := img.Layers()
	if err != nil {
		return fmt.Errorf("layers of the OCI image: %w", err)
	}
	lb, err := other.Layers()
	if err != nil {
		return fmt.Errorf("layers of the docker archive: %w", err)
	}
	if len(la) != len(lb) {
		return fmt.Errorf("the docker archive has %d layers, the OCI layout %d", len(lb), len(la))
	}
	for i := range la {
		da, err := la[i].Digest()
		if err != nil {
			return fmt.Errorf("OCI layer %d: %w", i, err)
		}
		db, err := lb[i].Digest()
		if err != nil {
			return fmt.Errorf("docker archive layer %d: %w", i, err)
		}
		if da != db {
			return fmt.Errorf("layer %d: %s in the docker archive, %s in the OCI layout", i, db, da)
		}
	}
	return nil
}

// waitLog waits for s in a running container's output.
func waitLog(t *testing.T, c *container, s string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		out := c.out.String()
		if strings.Contains(out, s) {
			return
		}
		if c.exited() {
			t.Fatalf("%s ended (%v) before printing %q:\n%s", c.name, c.err, s, out)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not print %q within %v:\n%s", c.name, s, within, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func writeFile(t *testing.T, p, data string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(p, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil { // whatever the umask
		t.Fatal(err)
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return hex.EncodeToString(b)
}
