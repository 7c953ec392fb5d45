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
