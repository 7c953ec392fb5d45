package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/stage-kv/stage/internal/certgen"
	"github.com/stage-kv/stage/internal/sidecars"
)

// sidecar is a staged process started by stagectl (demo, local benchmarks).
type sidecar = sidecars.Process

// stagedPath finds staged: the flag, else beside this executable, else PATH.
func stagedPath(flag string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "staged")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	p, err := exec.LookPath("staged")
	if err != nil {
		return "", fmt.Errorf("cannot find the staged binary beside stagectl or on PATH; build it (make build) or pass --staged")
	}
	return p, nil
}

func randomToken() string {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// startSidecar writes cfgYAML to dir/name.yaml and starts staged with it
// and any extra flags, waiting for its "staged ready" line. If stagectl
// dies (a closed pipe, a kill), its sidecars go with it.
func startSidecar(ctx context.Context, bin, dir, name, cfgYAML, token string, extra ...string) (*sidecar, error) {
	return sidecars.Start(ctx, sidecars.Options{Bin: bin, Dir: dir, Name: name, Config: cfgYAML, Token: token, Args: extra, DieWithParent: true})
}

// stopSidecar sends SIGTERM and waits for a clean exit.
func stopSidecar(sc *sidecar) error { return sc.Stop(syscall.SIGTERM, 20*time.Second) }

// sidecarYAML is a config for a local sidecar, on top of the embedded default.
// transport is the route's transport (auto, tcp, ipc, shm).
func sidecarYAML(name, socket string, dev engineDevice, slot string, slots int, route, peer string, stripes int, transport string) string {
	return sidecars.Config{Name: name, Socket: socket, DeviceKind: dev.kind, DeviceOrdinal: dev.ordinal, SlotSize: slot, Slots: slots,
		LogLevel: "info", Route: route, Peer: peer, Stripes: stripes, Transport: transport}.YAML()
}

// throwawayTLS makes a CA and a certificate for each of the two sidecars
// in dir, and returns the security.tls YAML of each.
func throwawayTLS(dir string) (decode, prefill string, err error) {
	set, err := certgen.WriteSet(dir, "decode", "prefill")
	if err != nil {
		return "", "", err
	}
	yaml := func(name string) string {
		f := set.Leaves[name]
		return fmt.Sprintf("security:\n  tls:\n    cert_file: %q\n    key_file: %q\n    ca_file: %q\n", f.Cert, f.Key, set.CA)
	}
	return yaml("decode"), yaml("prefill"), nil
}
