package containere2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stage-kv/stage/wire"
)

// What both engines agree on (stage-kvengine flags), and what the test
// checks against the sidecars' stats.
const (
	layers     = 4
	layerBytes = 4 << 20
	rounds     = 2
	socketPath = "/run/stage/sock/staged.sock" // the image's STAGE_CONTROL_SOCKET; the probe in deploy/k8s uses it too
	sidecarUID = "10001"
)

var engineShape = []string{"--layers", fmt.Sprint(layers), "--layer-bytes", "4MiB", "--block", "16KiB", "--seed", "7",
	"--rounds", fmt.Sprint(rounds), "--timeout", "2m"}

// The hardening the Kubernetes manifests ask for (securityContext), in
// docker's words: read-only root, no capabilities, no privilege escalation,
// the image's non-root user.
var hardened = []string{"--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges"}

func TestPrefillDecodePods(t *testing.T) {
	dk := setup(t)
	id := randomHex(3)
	token := randomHex(16)
	dk.env = append(os.Environ(), "STAGE_SECURITY_TOKEN="+token) // passed by name: never on a command line
	name := func(s string) string { return "stage-e2e-" + id + "-" + s }
	label := "stage.e2e=" + id

	var containers, networks, volumes []string
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if t.Failed() {
			for _, c := range containers {
				out, err := dk.logs(ctx, c)
				t.Logf("==== logs of %s (%v)\n%s", c, err, out)
			}
		}
		for _, c := range containers {
			if _, err := dk.run(ctx, nil, "rm", "-f", "-v", c); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
		for _, n := range networks {
			if _, err := dk.run(ctx, nil, "network", "rm", n); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
		for _, v := range volumes {
			if _, err := dk.run(ctx, nil, "volume", "rm", v); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
	})
	newNetwork := func(n string) string {
		n = name(n)
		dk.must("network", "create", "--driver", "bridge", "--label", label, n)
		networks = append(networks, n)
		return n
	}
	newVolume := func(v string) string {
		v = name(v)
		dk.must("volume", "create", "--label", label, v)
		volumes = append(volumes, v)
		return v
	}
	start := func(c string, args ...string) string {
		c = name(c)
		containers = append(containers, c) // before run: a half-created container is removed too
		dk.must(append([]string{"run", "-d", "--name", c, "--label", label}, args...)...)
		return c
	}

	t0 := time.Now()
	peers := newNetwork("peers") // the sidecars' shared network: the cluster network
	type pod struct{ name, net, sock, sidecar, engine string }
	pre := &pod{name: "prefill", net: newNetwork("prefill"), sock: newVolume("prefill-sock")}
	dec := &pod{name: "decode", net: newNetwork("decode"), sock: newVolume("decode-sock")}

	// The prefill sidecar's config, in a volume mounted over /etc/stage like
	// a ConfigMap; it names the decode sidecar by its alias on the shared
	// network. The decode sidecar keeps the image's config.
	cfg := newVolume("prefill-config")
	prefillYAML := `node:
  name: prefill-0
listen: ":7100"
routes:
  - name: decode
    peers: ["decode-0:7100"]
    stripes: 2
    connect_timeout: 2s
log:
  format: json
`
	if _, err := dk.run(context.Background(), strings.NewReader(prefillYAML), "run", "--rm", "-i", "--label", label, "--user", "0",
		"--network", "none", "-v", cfg+":/cfg", "--entrypoint", "/bin/sh", dk.image, "-c", "cat > /cfg/staged.yaml && chmod 0644 /cfg/staged.yaml"); err != nil {
		t.Fatal(err)
	}

	sidecar := func(p *pod, extra ...string) {
		args := append([]string{"--network", p.net, "--memory", "1g", "-v", p.sock + ":/run/stage", "-e", "STAGE_SECURITY_TOKEN"}, hardened...)
		p.sidecar = start(p.name+"-staged", append(append(args, extra...), dk.image)...)
	}
	sidecar(dec, "-e", "STAGE_NODE_NAME=decode-0")
	sidecar(pre, "-v", cfg+":/etc/stage:ro")
	dk.must("network", "connect", "--alias", "decode-0", peers, dec.sidecar)
	dk.must("network", "connect", peers, pre.sidecar)
	for _, p := range []*pod{dec, pre} {
		dk.waitLog(p.sidecar, "staged ready ", 30*time.Second)
	}
	t.Logf("two sidecars ready in %v", time.Since(t0).Round(time.Millisecond))

	// Engines: the pod's network namespace and socket volume, the image's
	// user (the socket is 0600 in a 0700 directory).
	engine := func(p *pod, args ...string) {
		a := append([]string{"--network", "container:" + p.sidecar, "--memory", "512m", "-v", p.sock + ":/run/stage"}, hardened...)
		a = append(a, "--entrypoint", "/usr/local/bin/stage-kvengine", dk.image, p.name)
		p.engine = start(p.name+"-engine", append(append(a, engineShape...), args...)...)
	}
	t1 := time.Now()
	engine(dec)
	dk.waitLog(dec.engine, "decode: ready", 30*time.Second)
	engine(pre, "--route", "decode", "--remote", "decode-kv")
	for _, p := range []*pod{pre, dec} {
		if code := dk.wait(p.engine, 3*time.Minute); code != "0" {
			t.Fatalf("%s engine exited %s", p.name, code)
		}
	}
	t.Logf("engines done in %v", time.Since(t1).Round(time.Millisecond))
	for _, e := range []struct {
		p    *pod
		want string
	}{{pre, fmt.Sprintf("pushed %d rounds", rounds)}, {dec, fmt.Sprintf("verified %d rounds", rounds)}} {
		out, _ := dk.logs(context.Background(), e.p.engine)
		if !strings.Contains(out, e.want) {
			t.Fatalf("%s engine did not report %q:\n%s", e.p.name, e.want, out)
		}
		t.Logf("%s engine:\n%s", e.p.name, strings.TrimSpace(out))
	}

	// The Kubernetes probe's command works in the sidecar container, and the
	// stats show the bytes crossed between the pods.
	want := uint64(rounds * layers * layerBytes)
	for _, p := range []*pod{pre, dec} {
		dk.must("exec", p.sidecar, "stagectl", "--socket", socketPath, "stats")
		var st wire.Stats
		if err := json.Unmarshal([]byte(dk.must("exec", p.sidecar, "stagectl", "--socket", socketPath, "stats", "--json")), &st); err != nil {
			t.Fatalf("%s stats --json: %v", p.name, err)
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
	if got := dk.must("exec", dec.sidecar, "stat", "-c", "%a %u", "/run/stage/sock", socketPath); got != "700 "+sidecarUID+"\n600 "+sidecarUID {
		t.Errorf("socket directory and socket: mode and owner %q, want 700 and 600, owned by %s", got, sidecarUID)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	out, err := dk.run(ctx, nil, "exec", "--user", "10002", dec.sidecar, "stagectl", "--socket", socketPath, "stats")
	cancel()
	if err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("uid 10002 queried the sidecar (err %v, output %q); want permission denied", err, out)
	}

	// SIGTERM (docker stop) ends staged, PID 1 of its container, with 0.
	for _, p := range []*pod{pre, dec} {
		dk.must("stop", "-t", "40", p.sidecar)
		if code := dk.must("inspect", "-f", "{{.State.ExitCode}}", p.sidecar); code != "0" {
			t.Errorf("%s sidecar exited %s after SIGTERM", p.name, code)
		}
		if out, _ := dk.logs(context.Background(), p.sidecar); strings.Contains(out, "panic") {
			t.Errorf("%s sidecar panicked:\n%s", p.name, out)
		}
	}
	t.Logf("whole test %v (containers %d, networks %d, volumes %d)", time.Since(t0).Round(time.Millisecond), len(containers), len(networks), len(volumes))
}

type docker struct {
	t     *testing.T
	image string
	env   []string
}

// setup returns a docker runner, or skips (fails, with STAGE_IMAGE_TEST set)
// when docker or the image is missing.
func setup(t *testing.T) *docker {
	required := os.Getenv("STAGE_IMAGE_TEST") != ""
	image := os.Getenv("STAGE_IMAGE")
	if image == "" {
		image = "stage:dev"
	}
	unusable := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		if required {
			t.Fatalf("%s (required: STAGE_IMAGE_TEST is set)", msg)
		}
		t.Skipf("%s; build the image and run this test with `make image-test`", msg)
	}
	if _, err := exec.LookPath("docker"); err != nil {
		unusable("docker is not installed")
	}
	dk := &docker{t: t, image: image, env: os.Environ()}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := dk.run(ctx, nil, "version", "--format", "{{.Server.Version}}"); err != nil {
		unusable("docker cannot reach its daemon: %v", err)
	}
	if _, err := dk.run(ctx, nil, "image", "inspect", "--format", "{{.Id}}", image); err != nil {
		unusable("image %s is missing", image)
	}
	return dk
}

// run runs docker with args (stdin, when not nil), and returns its stdout
// without the trailing newline; an error carries stderr.
func (d *docker) run(ctx context.Context, stdin io.Reader, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "docker", args...)
	cmd.Env = d.env
	cmd.Stdin = stdin
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("docker %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return strings.TrimRight(out.String(), "\n"), nil
}

func (d *docker) must(args ...string) string {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := d.run(ctx, nil, args...)
	if err != nil {
		d.t.Fatal(err)
	}
	return out
}

// logs returns a container's stdout and stderr.
func (d *docker) logs(ctx context.Context, c string) (string, error) {
	cmd := exec.CommandContext(ctx, "docker", "logs", c)
	cmd.Env = d.env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// waitLog waits for s in a running container's stdout.
func (d *docker) waitLog(c, s string, within time.Duration) {
	d.t.Helper()
	deadline := time.Now().Add(within)
	for {
		out, _ := d.logs(context.Background(), c)
		if strings.Contains(out, s) {
			return
		}
		if running := d.must("inspect", "-f", "{{.State.Running}}", c); running != "true" {
			d.t.Fatalf("%s stopped (exit code %s) before printing %q:\n%s", c, d.must("inspect", "-f", "{{.State.ExitCode}}", c), s, out)
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("%s did not print %q within %v:\n%s", c, s, within, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// wait waits for a container to exit and returns its exit code.
func (d *docker) wait(c string, within time.Duration) string {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	out, err := d.run(ctx, nil, "wait", c)
	if err != nil {
		d.t.Fatalf("%s did not exit within %v: %v", c, within, err)
	}
	return strings.TrimSpace(out)
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}
