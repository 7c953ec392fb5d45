package check

import (
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// dir holds the manifests (this test runs in deploy/k8s/check).
const dir = ".."

const (
	sidecarName  = "staged"
	socketEnv    = "STAGE_CONTROL_SOCKET"
	tokenEnv     = "STAGE_SECURITY_TOKEN"
	trustEnv     = "STAGE_SECURITY_TRUST_SOCKET_PARENT"
	configPath   = "/etc/stage/staged.yaml"
	nodeSockPath = "/run/stage-node"
)

// manifests is every object of every manifest file (the kustomization's
// resources and the Secret example).
func manifests(t *testing.T) []Object {
	t.Helper()
	files, err := ManifestFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no manifests in %s", dir)
	}
	var all []Object
	for _, f := range files {
		objs, err := LoadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if len(objs) == 0 {
			t.Errorf("%s holds no object", f)
		}
		all = append(all, objs...)
	}
	return all
}

func TestManifestsDecodeStrictly(t *testing.T) {
	seen := map[string]string{}
	for _, o := range manifests(t) {
		key := o.GVK.Kind + "/" + o.Name
		if prev, dup := seen[key]; dup {
			t.Errorf("%s: %s is also defined in %s", o, key, prev)
		}
		seen[key] = o.String()
		t.Logf("decoded %s", o)
	}
}

// The decoder must be strict, or the test above proves nothing.
func TestDecodeRejects(t *testing.T) {
	for name, doc := range map[string]string{
		"unknown field":  "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  replica: 2\n",
		"nested unknown": "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec:\n  ports: [{port: 1, targetport: 2}]\n",
		"duplicate key":  "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: {a: b}\ndata: {c: d}\n",
		"wrong type":     "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: x}\nspec: {replicas: two}\n",
		"unknown kind":   "apiVersion: v1\nkind: ConfigMapp\nmetadata: {name: x}\n",
		"wrong group":    "apiVersion: v1\nkind: Deployment\nmetadata: {name: x}\n",
		"bad quantity": "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  template:\n    spec:\n" +
			"      containers: [{name: c, resources: {limits: {memory: lots}}}]\n",
	} {
		if _, _, err := Decode([]byte(doc)); err == nil {
			t.Errorf("%s: decoded without error:\n%s", name, doc)
		}
	}
	if _, _, err := Decode([]byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: {a: b}\n")); err != nil {
		t.Errorf("a valid ConfigMap: %v", err)
	}
}

func TestKustomization(t *testing.T) {
	k, err := LoadKustomization(dir)
	if err != nil {
		t.Fatal(err)
	}
	files, _ := ManifestFiles(dir)
	for _, f := range files {
		b := filepath.Base(f)
		listed := slices.Contains(k.Resources, b)
		if b == "secret.example.yaml" {
			if listed {
				t.Errorf("kustomization.yaml deploys %s: its placeholder token would reach the cluster", b)
			}
			continue
		}
		if !listed {
			t.Errorf("kustomization.yaml does not list %s", b)
		}
	}
	for _, r := range k.Resources {
		if _, err := os.Stat(filepath.Join(dir, r)); err != nil {
			t.Errorf("kustomization.yaml resource %s: %v", r, err)
		}
	}
	for _, im := range k.Images {
		if im.Name != "stage" {
			t.Errorf("kustomization.yaml images: %q matches no container image (stage:...)", im.Name)
		}
	}
}

// workload is a Deployment's or StatefulSet's pod template.
type workload struct {
	obj      Object
	selector map[string]string
	pod      *corev1.PodTemplateSpec
	replicas int32
	service  string // StatefulSet serviceName
}

func workloads(t *testing.T, objs []Object) []workload {
	var ws []workload
	for _, o := range objs {
		switch v := o.Obj.(type) {
		case *appsv1.Deployment:
			ws = append(ws, workload{obj: o, selector: v.Spec.Selector.MatchLabels, pod: &v.Spec.Template, replicas: deref(v.Spec.Replicas, 1)})
		case *appsv1.StatefulSet:
			ws = append(ws, workload{obj: o, selector: v.Spec.Selector.MatchLabels, pod: &v.Spec.Template, replicas: deref(v.Spec.Replicas, 1), service: v.Spec.ServiceName})
		}
	}
	if len(ws) == 0 {
		t.Fatal("no Deployment or StatefulSet")
	}
	return ws
}

func deref[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

func find[T any](objs []Object, name string) *T {
	for _, o := range objs {
		if v, ok := o.Obj.(*T); ok && o.Name == name {
			return v
		}
	}
	return nil
}

// allContainers returns init containers (sidecars among them) and containers.
func allContainers(p *corev1.PodSpec) []*corev1.Container {
	var cs []*corev1.Container
	for i := range p.InitContainers {
		cs = append(cs, &p.InitContainers[i])
	}
	for i := range p.Containers {
		cs = append(cs, &p.Containers[i])
	}
	return cs
}

func env(c *corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

func mountAt(c *corev1.Container, mountPath string) *corev1.VolumeMount {
	for i := range c.VolumeMounts {
		if path.Clean(c.VolumeMounts[i].MountPath) == path.Clean(mountPath) {
			return &c.VolumeMounts[i]
		}
	}
	return nil
}

func volume(p *corev1.PodSpec, name string) *corev1.Volume {
	for i := range p.Volumes {
		if p.Volumes[i].Name == name {
			return &p.Volumes[i]
		}
	}
	return nil
}

// The hardening and resources every container must have.
func TestContainersHardenedAndSized(t *testing.T) {
	for _, w := range workloads(t, manifests(t)) {
		p := &w.pod.Spec
		psc := p.SecurityContext
		if psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("%s: pod securityContext.seccompProfile must be RuntimeDefault", w.obj)
		}
		if deref(p.EnableServiceLinks, true) {
			t.Errorf("%s: enableServiceLinks must be false (service-link variables named STAGE_... would reach staged)", w.obj)
		}
		if !labels.SelectorFromSet(w.selector).Matches(labels.Set(w.pod.Labels)) || len(w.selector) == 0 {
			t.Errorf("%s: selector %v does not select the pod template's labels %v", w.obj, w.selector, w.pod.Labels)
		}
		for _, c := range allContainers(p) {
			where := w.obj.String() + " container " + c.Name
			r := c.Resources
			if r.Requests.Cpu().IsZero() || r.Requests.Memory().IsZero() || r.Limits.Memory().IsZero() {
				t.Errorf("%s: needs requests.cpu, requests.memory and limits.memory (has %v / %v)", where, r.Requests, r.Limits)
			}
			sc := c.SecurityContext
			if sc == nil {
				t.Errorf("%s: no securityContext", where)
				continue
			}
			nonRoot := sc.RunAsNonRoot
			if nonRoot == nil && psc != nil {
				nonRoot = psc.RunAsNonRoot
			}
			if !deref(nonRoot, false) {
				t.Errorf("%s: runAsNonRoot must be true", where)
			}
			if uid := sc.RunAsUser; uid != nil && *uid == 0 {
				t.Errorf("%s: runAsUser 0", where)
			}
			if !deref(sc.ReadOnlyRootFilesystem, false) {
				t.Errorf("%s: readOnlyRootFilesystem must be true", where)
			}
			if deref(sc.AllowPrivilegeEscalation, true) {
				t.Errorf("%s: allowPrivilegeEscalation must be false", where)
			}
			if deref(sc.Privileged, false) {
				t.Errorf("%s: privileged (device access comes from the device plugin resource)", where)
			}
			if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
				t.Errorf("%s: capabilities must drop ALL and add none", where)
			}
		}
	}
}

// The sidecar: config from a ConfigMap, token from the Secret, the socket
// shared with the engine, probes on the socket.
func TestSidecar(t *testing.T) {
	objs := manifests(t)
	secret := find[corev1.Secret](objs, "stage-token")
	for _, w := range workloads(t, objs) {
		p := &w.pod.Spec
		var sc *corev1.Container
		for _, c := range allContainers(p) {
			if c.Name == sidecarName {
				sc = c
			}
		}
		if sc == nil {
			t.Errorf("%s: no container named %s", w.obj, sidecarName)
			continue
		}
		where := w.obj.String() + " sidecar"
		if i := slices.IndexFunc(p.InitContainers, func(c corev1.Container) bool { return c.Name == sidecarName }); i >= 0 &&
			deref(p.InitContainers[i].RestartPolicy, "") != corev1.ContainerRestartPolicyAlways {
			t.Errorf("%s: an init container without restartPolicy Always would block the pod", where)
		}
		if !strings.HasPrefix(sc.Image, "stage:") {
			t.Errorf("%s: image %q, want stage:<tag> (kustomization.yaml rewrites it)", where, sc.Image)
		}
		if !slices.Equal(sc.Args, []string{"--config", configPath}) || len(sc.Command) > 0 {
			t.Errorf("%s: command %v args %v, want the image's entrypoint with --config %s", where, sc.Command, sc.Args, configPath)
		}

		// Config: a ConfigMap with staged.yaml mounted over /etc/stage.
		if m := mountAt(sc, path.Dir(configPath)); m == nil {
			t.Errorf("%s: nothing mounted at %s", where, path.Dir(configPath))
		} else if v := volume(p, m.Name); v == nil || v.ConfigMap == nil {
			t.Errorf("%s: %s is not a ConfigMap volume", where, path.Dir(configPath))
		} else if cm := find[corev1.ConfigMap](objs, v.ConfigMap.Name); cm == nil {
			t.Errorf("%s: ConfigMap %s is not defined", where, v.ConfigMap.Name)
		} else if _, ok := cm.Data[path.Base(configPath)]; !ok {
			t.Errorf("%s: ConfigMap %s has no %s", where, cm.Name, path.Base(configPath))
		}

		// Token: from the Secret, never a literal.
		if e := env(sc, tokenEnv); e == nil || e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
			t.Errorf("%s: %s must come from a secretKeyRef", where, tokenEnv)
		} else if ref := e.ValueFrom.SecretKeyRef; secret == nil || ref.Name != secret.Name {
			t.Errorf("%s: %s from Secret %q; secret.example.yaml defines stage-token", where, tokenEnv, ref.Name)
		} else if _, ok := secret.StringData[ref.Key]; !ok {
			t.Errorf("%s: %s from key %q, which secret.example.yaml does not set", where, tokenEnv, ref.Key)
		}
		if e := env(sc, "STAGE_NODE_NAME"); e == nil || e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.name" {
			t.Errorf("%s: STAGE_NODE_NAME should be the pod's name (fieldRef metadata.name)", where)
		}

		// Socket: STAGE_CONTROL_SOCKET in a directory of its own inside an
		// emptyDir (staged chmods its directory 0700, which it cannot do to
		// the volume's root), and every container naming it mounts the same
		// volume at the same place.
		e := env(sc, socketEnv)
		if e == nil || e.Value == "" {
			t.Errorf("%s: %s not set", where, socketEnv)
			continue
		}
		sock := e.Value
		var vol *corev1.VolumeMount
		for i := range sc.VolumeMounts {
			m := &sc.VolumeMounts[i]
			if strings.HasPrefix(sock, path.Clean(m.MountPath)+"/") && (vol == nil || len(m.MountPath) > len(vol.MountPath)) {
				vol = m
			}
		}
		if vol == nil {
			t.Errorf("%s: socket %s is on no volume", where, sock)
			continue
		}
		if v := volume(p, vol.Name); v == nil || v.EmptyDir == nil {
			t.Errorf("%s: the socket's volume %s must be an emptyDir", where, vol.Name)
		}
		if path.Dir(sock) == path.Clean(vol.MountPath) {
			t.Errorf("%s: socket %s sits in the volume's root %s: staged cannot chmod that directory; use a subdirectory", where, sock, vol.MountPath)
		}
		// An emptyDir is 0777 without the sticky bit: staged refuses a
		// socket directory inside it unless told the volume's writers (this
		// pod's containers) are trusted.
		if e := env(sc, trustEnv); path.Dir(path.Dir(sock)) == path.Clean(vol.MountPath) && (e == nil || e.Value != "true") {
			t.Errorf("%s: socket %s is inside the emptyDir %s (0777, no sticky bit): set %s=true or staged refuses its directory", where, sock, vol.MountPath, trustEnv)
		}
		if vol.ReadOnly {
			t.Errorf("%s: the socket volume is mounted read-only", where)
		}
		engines := 0
		for _, c := range allContainers(p) {
			if c == sc {
				continue
			}
			ce := env(c, socketEnv)
			if ce == nil {
				continue
			}
			engines++
			if ce.Value != sock {
				t.Errorf("%s container %s: %s=%s, the sidecar's is %s", w.obj, c.Name, socketEnv, ce.Value, sock)
			}
			if m := mountAt(c, vol.MountPath); m == nil || m.Name != vol.Name {
				t.Errorf("%s container %s: does not mount volume %s at %s", w.obj, c.Name, vol.Name, vol.MountPath)
			}
			if mountAt(c, nodeSockPath) != nil {
				t.Errorf("%s container %s: only the sidecar may mount %s", w.obj, c.Name, nodeSockPath)
			}
		}
		if engines == 0 {
			t.Errorf("%s: no engine container shares the socket (%s)", w.obj, socketEnv)
		}

		// Probes: the three of them ask the sidecar on that socket.
		want := []string{"stagectl", "--socket", sock, "stats"}
		for name, pr := range map[string]*corev1.Probe{"startupProbe": sc.StartupProbe, "readinessProbe": sc.ReadinessProbe, "livenessProbe": sc.LivenessProbe} {
			if pr == nil || pr.Exec == nil {
				t.Errorf("%s: no exec %s", where, name)
				continue
			}
			if !slices.Equal(pr.Exec.Command, want) {
				t.Errorf("%s: %s runs %v, want %v", where, name, pr.Exec.Command, want)
			}
			if pr.TimeoutSeconds < 2 {
				t.Errorf("%s: %s timeoutSeconds %d: stagectl needs more than the 1s default on a busy node", where, name, pr.TimeoutSeconds)
			}
		}

		// The node-local socket directory.
		if m := mountAt(sc, nodeSockPath); m == nil {
			t.Errorf("%s: %s is not mounted", where, nodeSockPath)
		} else if v := volume(p, m.Name); v == nil || v.HostPath == nil || v.HostPath.Path != nodeSockPath ||
			deref(v.HostPath.Type, "") != corev1.HostPathDirectoryOrCreate {
			t.Errorf("%s: %s must be a hostPath %s of type DirectoryOrCreate", where, nodeSockPath, nodeSockPath)
		}

		// The named ports are the ones staged listens on: peer (listen)
		// and, when served, metrics (metrics.listen).
		cfg := stagedConfig(t, objs, p, sc)
		for _, l := range []struct{ port, key, addr string }{{"peer", "listen", cfg.Listen}, {"metrics", "metrics.listen", cfg.Metrics.Listen}} {
			i := slices.IndexFunc(sc.Ports, func(cp corev1.ContainerPort) bool { return cp.Name == l.port })
			if l.addr == "" {
				if i >= 0 {
					t.Errorf("%s: port %s, but %s is off", where, l.port, l.key)
				}
				continue
			}
			_, port, err := net.SplitHostPort(l.addr)
			if err != nil {
				t.Errorf("%s: %s %q: %v", where, l.key, l.addr, err)
				continue
			}
			if i < 0 || strconv.Itoa(int(sc.Ports[i].ContainerPort)) != port {
				t.Errorf("%s: needs a port named %s = %s (%s %s); has %v", where, l.port, port, l.key, l.addr, sc.Ports)
			}
		}
	}
}

// stagedYAML is what these tests read of a staged.yaml (stagectl config
// check validates all of it).
type stagedYAML struct {
	Listen  string `json:"listen"`
	Metrics struct {
		Listen string `json:"listen"`
	} `json:"metrics"`
	Routes []struct {
		Name  string   `json:"name"`
		Peers []string `json:"peers"`
		DNS   string   `json:"dns"`
	} `json:"routes"`
}

func stagedConfig(t *testing.T, objs []Object, p *corev1.PodSpec, sc *corev1.Container) *stagedYAML {
	t.Helper()
	m := mountAt(sc, path.Dir(configPath))
	if m == nil {
		t.Fatalf("sidecar mounts nothing at %s", path.Dir(configPath))
	}
	cm := find[corev1.ConfigMap](objs, volume(p, m.Name).ConfigMap.Name)
	var c stagedYAML
	if err := yaml.Unmarshal([]byte(cm.Data[path.Base(configPath)]), &c); err != nil {
		t.Fatalf("ConfigMap %s: %s: %v", cm.Name, path.Base(configPath), err)
	}
	return &c
}

// Every route peer is a decode pod's stable name: <statefulset>-<n>.<headless
// service>[.<namespace>...]:<service port>, with n below the replicas.
func TestRoutesNameStatefulSetPods(t *testing.T) {
	objs := manifests(t)
	routes := 0
	for _, o := range objs {
		cm, ok := o.Obj.(*corev1.ConfigMap)
		if !ok {
			continue
		}
		var c stagedYAML
		if err := yaml.Unmarshal([]byte(cm.Data["staged.yaml"]), &c); err != nil {
			t.Errorf("%s: staged.yaml: %v", o, err)
			continue
		}
		for _, r := range c.Routes {
			routes++
			if len(r.Peers) == 0 && r.DNS == "" {
				t.Errorf("%s: route %s has no peers and no dns", o, r.Name)
			}
			for _, peer := range r.Peers {
				checkPeer(t, objs, o.String()+" route "+r.Name, peer)
			}
			if r.DNS != "" {
				// <service>:<port> resolves to every pod behind a headless
				// Service: check it as the name of its pod 0.
				host, port, err := net.SplitHostPort(r.DNS)
				svc, _, _ := strings.Cut(host, ".")
				if err != nil || find[corev1.Service](objs, svc) == nil {
					t.Errorf("%s: route %s dns %q: want <headless service>[.<namespace>...]:<port> (%v)", o, r.Name, r.DNS, err)
					continue
				}
				sts := ""
				for _, x := range objs {
					if s, ok := x.Obj.(*appsv1.StatefulSet); ok && s.Spec.ServiceName == svc {
						sts = s.Name
					}
				}
				checkPeer(t, objs, o.String()+" route "+r.Name+" dns", net.JoinHostPort(sts+"-0."+host, port))
			}
		}
	}
	if routes == 0 {
		t.Error("no ConfigMap has a route")
	}
}

func checkPeer(t *testing.T, objs []Object, where, peer string) {
	host, port, err := net.SplitHostPort(peer)
	if err != nil {
		t.Errorf("%s: peer %q: %v", where, peer, err)
		return
	}
	parts := strings.Split(host, ".")
	if len(parts) < 2 {
		t.Errorf("%s: peer %q: want <pod>.<service>", where, peer)
		return
	}
	podName, svcName := parts[0], parts[1]
	svc := find[corev1.Service](objs, svcName)
	if svc == nil {
		t.Errorf("%s: peer %q: no Service %s", where, peer, svcName)
		return
	}
	if svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("%s: Service %s must be headless (clusterIP: None) for per-pod names", where, svcName)
	}
	i := slices.IndexFunc(svc.Spec.Ports, func(sp corev1.ServicePort) bool { return strconv.Itoa(int(sp.Port)) == port })
	if i < 0 {
		t.Errorf("%s: peer %q: Service %s has no port %s", where, peer, svcName, port)
		return
	}
	sp := svc.Spec.Ports[i]
	cut := strings.LastIndexByte(podName, '-')
	n, err := strconv.Atoi(podName[cut+1:])
	if cut <= 0 || err != nil {
		t.Errorf("%s: peer %q: %s is not <statefulset>-<ordinal>", where, peer, podName)
		return
	}
	sts := find[appsv1.StatefulSet](objs, podName[:cut])
	if sts == nil {
		t.Errorf("%s: peer %q: no StatefulSet %s", where, peer, podName[:cut])
		return
	}
	if sts.Spec.ServiceName != svcName {
		t.Errorf("%s: StatefulSet %s has serviceName %q, the peer names Service %s", where, sts.Name, sts.Spec.ServiceName, svcName)
	}
	if r := deref(sts.Spec.Replicas, 1); int32(n) >= r {
		t.Errorf("%s: peer %q: StatefulSet %s has %d replicas", where, peer, sts.Name, r)
	}
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(sts.Spec.Template.Labels)) || len(svc.Spec.Selector) == 0 {
		t.Errorf("%s: Service %s does not select StatefulSet %s's pods", where, svcName, sts.Name)
	}
	// The Service's target port is the sidecar's peer port, by number: as
	// an init container, the sidecar's named ports are not resolved by
	// Services before Kubernetes 1.32/1.33.
	if sp.TargetPort.StrVal != "" && slices.ContainsFunc(sts.Spec.Template.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == sidecarName }) {
		t.Errorf("%s: Service %s targetPort %q: name a sidecar (init) container's port by number", where, svcName, sp.TargetPort.StrVal)
	}
	found := false
	for _, c := range allContainers(&sts.Spec.Template.Spec) {
		for _, cp := range c.Ports {
			match := (sp.TargetPort.StrVal != "" && cp.Name == sp.TargetPort.StrVal) || (sp.TargetPort.StrVal == "" && cp.ContainerPort == sp.TargetPort.IntVal)
			if match && c.Name == sidecarName {
				found = true
			}
		}
	}
	if !found {
		t.Errorf("%s: Service %s port %d targets %s, not the sidecar's port", where, svcName, sp.Port, sp.TargetPort.String())
	}
}

// Each ConfigMap's staged.yaml is YAML, and staged accepts it: `stagectl
// config check` (bin/stagectl from `make build`, or $STAGECTL), with a
// token in the environment as the pods have.
func TestStagedConfigs(t *testing.T) {
	stagectl := os.Getenv("STAGECTL")
	if stagectl == "" {
		stagectl = filepath.Join("..", "..", "..", "bin", "stagectl")
	}
	if _, err := os.Stat(stagectl); err != nil {
		t.Logf("no stagectl at %s (make build, or set STAGECTL): staged.yaml is only parsed as YAML", stagectl)
		stagectl = ""
	}
	tmp := t.TempDir()
	n := 0
	for _, o := range manifests(t) {
		cm, ok := o.Obj.(*corev1.ConfigMap)
		if !ok {
			continue
		}
		data, ok := cm.Data["staged.yaml"]
		if !ok {
			continue
		}
		n++
		var v map[string]any
		if err := yaml.Unmarshal([]byte(data), &v); err != nil {
			t.Errorf("%s: staged.yaml is not YAML: %v", o, err)
			continue
		}
		if _, ok := v["security"]; ok {
			t.Errorf("%s: staged.yaml has a security section: the token comes from the Secret", o)
		}
		if stagectl == "" {
			continue
		}
		f := filepath.Join(tmp, cm.Name+".yaml")
		if err := os.WriteFile(f, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(stagectl, "config", "check", f)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), tokenEnv + "=check-only", socketEnv + "=/run/stage/sock/staged.sock"}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s: stagectl config check: %v\n%s", o, err, out)
		}
	}
	if n == 0 {
		t.Error("no ConfigMap holds a staged.yaml")
	}
}
