package sidecars

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Config is what a local sidecar differs in from the embedded default
// config; YAML writes it out. Zero fields are left out (the default holds).
type Config struct {
	Name   string // node.name
	Socket string // control_socket
	Listen string // listen, the peer address; "" is 127.0.0.1:0
	// node.host_id and node.socket_dir: sidecars with the same host id
	// and socket dir are on one node and may use the same-node paths.
	HostID, SocketDir string
	// node.idle_conn_timeout ("" leaves the default).
	NodeIdle string
	// device.kind and device.ordinal ("" leaves the default device).
	DeviceKind    string
	DeviceOrdinal int
	// staging.slot_size and slots; window is half the slots.
	SlotSize string
	Slots    int
	LogLevel string // log.level
	// One route, when Route is set: its name, its one peer, data streams,
	// transport, and timeouts (0: the default).
	Route, Peer                     string
	Stripes                         int
	Transport                       string
	ConnectTimeout, ProgressTimeout time.Duration
	// Extra is more YAML, appended as it is (top-level keys not set above).
	Extra string
}

// YAML returns the config file. Unless Listen says otherwise it listens
// for peers on 127.0.0.1, on a port the kernel picks (the ready line says
// which).
func (c Config) YAML() string {
	f := file{Node: node{Name: c.Name, HostID: c.HostID, SocketDir: c.SocketDir, Idle: c.NodeIdle}, Listen: c.Listen, ControlSocket: c.Socket}
	if f.Listen == "" {
		f.Listen = "127.0.0.1:0"
	}
	if c.DeviceKind != "" {
		f.Device = &device{Kind: c.DeviceKind, Ordinal: c.DeviceOrdinal}
	}
	if c.SlotSize != "" || c.Slots > 0 {
		f.Staging = &staging{SlotSize: c.SlotSize, Slots: c.Slots}
		if c.Slots > 0 {
			f.Staging.Window = max(1, c.Slots/2)
		}
	}
	if c.LogLevel != "" {
		f.Log = &logging{Level: c.LogLevel}
	}
	if c.Route != "" {
		f.Routes = []route{{Name: c.Route, Peers: []string{c.Peer}, Stripes: c.Stripes, Transport: c.Transport,
			ConnectTimeout: durationOrEmpty(c.ConnectTimeout), ProgressTimeout: durationOrEmpty(c.ProgressTimeout)}}
	}
	// Two-space indents and routes last: a test may append a route item
	// ("  - name: ...") to the text, as a person editing the file would.
	var b strings.Builder
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := errors.Join(enc.Encode(f), enc.Close()); err != nil { // only a type yaml cannot encode fails, and file has none
		panic(fmt.Sprintf("sidecars: marshal a config: %v", err))
	}
	return b.String() + c.Extra
}

func durationOrEmpty(d time.Duration) string {
	if d <= 0 {
		return ""
	}
	return d.String()
}

// The config file's keys Config sets; staged's config package reads them.
type (
	file struct {
		Node          node     `yaml:"node"`
		Listen        string   `yaml:"listen"`
		ControlSocket string   `yaml:"control_socket"`
		Device        *device  `yaml:"device,omitempty"`
		Staging       *staging `yaml:"staging,omitempty"`
		Log           *logging `yaml:"log,omitempty"`
		Routes        []route  `yaml:"routes,omitempty"`
	}
	node struct {
		Name      string `yaml:"name"`
		HostID    string `yaml:"host_id,omitempty"`
		SocketDir string `yaml:"socket_dir,omitempty"`
		Idle      string `yaml:"idle_conn_timeout,omitempty"`
	}
	device struct {
		Kind    string `yaml:"kind"`
		Ordinal int    `yaml:"ordinal"`
	}
	staging struct {
		SlotSize string `yaml:"slot_size,omitempty"`
		Slots    int    `yaml:"slots,omitempty"`
		Window   int    `yaml:"window,omitempty"`
	}
	logging struct {
		Level string `yaml:"level"`
	}
	route struct {
		Name            string   `yaml:"name"`
		Peers           []string `yaml:"peers"`
		Stripes         int      `yaml:"stripes,omitempty"`
		Transport       string   `yaml:"transport,omitempty"`
		ConnectTimeout  string   `yaml:"connect_timeout,omitempty"`
		ProgressTimeout string   `yaml:"progress_timeout,omitempty"`
	}
)
