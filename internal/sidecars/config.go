package sidecars

import (
	"fmt"
	"strings"
	"time"
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
	var b strings.Builder
	fmt.Fprintf(&b, "node:\n  name: %s\n", c.Name)
	if c.HostID != "" {
		fmt.Fprintf(&b, "  host_id: %s\n", c.HostID)
	}
	if c.SocketDir != "" {
		fmt.Fprintf(&b, "  socket_dir: %s\n", c.SocketDir)
	}
	listen := c.Listen
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	fmt.Fprintf(&b, "listen: %s\ncontrol_socket: %s\n", listen, c.Socket)
	if c.DeviceKind != "" {
		fmt.Fprintf(&b, "device:\n  kind: %s\n  ordinal: %d\n", c.DeviceKind, c.DeviceOrdinal)
	}
	if c.SlotSize != "" || c.Slots > 0 {
		b.WriteString("staging:\n")
		if c.SlotSize != "" {
			fmt.Fprintf(&b, "  slot_size: %s\n", c.SlotSize)
		}
		if c.Slots > 0 {
			fmt.Fprintf(&b, "  slots: %d\n  window: %d\n", c.Slots, max(1, c.Slots/2))
		}
	}
	if c.LogLevel != "" {
		fmt.Fprintf(&b, "log:\n  level: %s\n", c.LogLevel)
	}
	if c.Route != "" {
		fmt.Fprintf(&b, "routes:\n  - name: %s\n    peers: [%q]\n", c.Route, c.Peer)
		if c.Stripes > 0 {
			fmt.Fprintf(&b, "    stripes: %d\n", c.Stripes)
		}
		if c.Transport != "" {
			fmt.Fprintf(&b, "    transport: %s\n", c.Transport)
		}
		if c.ConnectTimeout > 0 {
			fmt.Fprintf(&b, "    connect_timeout: %s\n", c.ConnectTimeout)
		}
		if c.ProgressTimeout > 0 {
			fmt.Fprintf(&b, "    progress_timeout: %s\n", c.ProgressTimeout)
		}
	}
	b.WriteString(c.Extra)
	return b.String()
}
