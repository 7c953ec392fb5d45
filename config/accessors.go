package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// SocketPath returns the control socket path: control_socket when set, else
// $XDG_RUNTIME_DIR/stage/staged.sock, else /tmp/stage-<uid>/staged.sock.
// It creates nothing.
func (c *Config) SocketPath() string {
	if c.ControlSocket != "" {
		return c.ControlSocket
	}
	if dir := os.Getenv("XDG_RUNTIME_DIR"); dir != "" {
		return filepath.Join(dir, "stage", "staged.sock")
	}
	return filepath.Join("/tmp", "stage-"+strconv.Itoa(os.Getuid()), "staged.sock")
}

// NodeSocketDir returns the directory of the same-node sockets:
// node.socket_dir when set, else "node" inside the default control socket
// directory ($XDG_RUNTIME_DIR/stage/node, else /tmp/stage-<uid>/node). It
// creates nothing.
func (c *Config) NodeSocketDir() string {
	if c.Node.SocketDir != "" {
		return c.Node.SocketDir
	}
	if dir := os.Getenv("XDG_RUNTIME_DIR"); dir != "" {
		return filepath.Join(dir, "stage", "node")
	}
	return filepath.Join("/tmp", "stage-"+strconv.Itoa(os.Getuid()), "node")
}

// NodeSocketName is the length of the node socket file names the sidecar
// creates in NodeSocketDir ("n-" + 16 hex digits + ".sock").
const NodeSocketName = 23

// ResolveToken returns the peer auth token: security.token, or the contents
// of security.token_file with surrounding white space trimmed. It returns ""
// and no error when neither is set (allow_insecure).
func (c *Config) ResolveToken() (string, error) {
	s := c.Security
	if s.Token != "" {
		return s.Token, nil
	}
	if s.TokenFile == "" {
		return "", nil
	}
	b, err := os.ReadFile(s.TokenFile)
	if err != nil {
		return "", fmt.Errorf("security.token_file %q: %w", s.TokenFile, err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("security.token_file %q: file is empty", s.TokenFile)
	}
	return tok, nil
}

// Route returns the route named name, pointing into c.Routes.
func (c *Config) Route(name string) (*Route, bool) {
	for i := range c.Routes {
		if c.Routes[i].Name == name {
			return &c.Routes[i], true
		}
	}
	return nil, false
}
