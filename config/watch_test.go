package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// replaceFile writes body next to path and renames it over path, as editors
// and atomic deploys do.
func replaceFile(t *testing.T, path, body string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func routesFile(names ...string) string {
	var b strings.Builder
	b.WriteString("security:\n  token: x\nroutes:\n")
	for _, n := range names {
		b.WriteString("  - name: " + n + "\n    peers: [\"" + n + ".svc:7100\"]\n")
	}
	return b.String()
}

func TestWatch(t *testing.T) {
	cleanEnv(t)
	path := filepath.Join(t.TempDir(), "stage.yaml")
	if err := os.WriteFile(path, []byte(routesFile("decode")), 0o600); err != nil {
		t.Fatal(err)
	}
	changes := make(chan *Config, 10)
	errs := make(chan error, 10)
	stop, err := Watch(path, nil, func(c *Config) { changes <- c }, func(err error) { errs <- err })
	if err != nil {
		t.Fatal(err)
	}
	defer stop()

	const wait = 5 * time.Second
	nextChange := func(t *testing.T) *Config {
		t.Helper()
		select {
		case c := <-changes:
			return c
		case err := <-errs:
			t.Fatalf("got error %v, want a change", err)
		case <-time.After(wait):
			t.Fatalf("got no change in %s, want one", wait)
		}
		return nil
	}
	noChange := func(t *testing.T) {
		t.Helper()
		select {
		case c := <-changes:
			t.Fatalf("got a change to %d routes, want none", len(c.Routes))
		case <-time.After(3 * WatchDebounce):
		}
	}

	t.Run("route change by rename", func(t *testing.T) {
		replaceFile(t, path, routesFile("decode", "prefill"))
		c := nextChange(t)
		if got := len(c.Routes); got != 2 {
			t.Fatalf("got %d routes, want 2", got)
		}
		if _, ok := c.Route("prefill"); !ok {
			t.Errorf("got routes %+v, want prefill among them", c.Routes)
		}
		noChange(t) // one burst of events, one reload
	})

	t.Run("route change by write in place", func(t *testing.T) {
		if err := os.WriteFile(path, []byte(routesFile("only")), 0o600); err != nil {
			t.Fatal(err)
		}
		c := nextChange(t)
		if got, want := c.Routes[0].Name, "only"; len(c.Routes) != 1 || got != want {
			t.Errorf("got routes %+v, want [%s]", c.Routes, want)
		}
	})

	t.Run("invalid edit reported, no change", func(t *testing.T) {
		replaceFile(t, path, routesFile("only")+"    stripes: 0\n")
		select {
		case err := <-errs:
			if !strings.Contains(err.Error(), "routes[0].stripes") || !strings.Contains(err.Error(), path) {
				t.Errorf("got %v, want it to name %s and routes[0].stripes", err, path)
			}
		case c := <-changes:
			t.Fatalf("got a change to %+v, want an error", c.Routes)
		case <-time.After(wait):
			t.Fatalf("got no error in %s, want one", wait)
		}
		noChange(t)
	})

	t.Run("other files in the directory are ignored", func(t *testing.T) {
		if err := os.WriteFile(filepath.Join(filepath.Dir(path), "other.txt"), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		noChange(t)
		select {
		case err := <-errs:
			t.Fatalf("got error %v, want none", err)
		default:
		}
	})

	t.Run("fixed file applies again", func(t *testing.T) {
		replaceFile(t, path, routesFile("fixed"))
		c := nextChange(t)
		if got, want := c.Routes[0].Name, "fixed"; got != want {
			t.Errorf("got route %q, want %q", got, want)
		}
	})

	t.Run("stop", func(t *testing.T) {
		stop()
		stop() // twice is fine
		replaceFile(t, path, routesFile("after-stop"))
		select {
		case c := <-changes:
			t.Fatalf("got a change to %+v after stop, want none", c.Routes)
		case <-time.After(3 * WatchDebounce):
		}
	})
}

func TestWatchErrors(t *testing.T) {
	if _, err := Watch("", nil, nil, nil); err == nil {
		t.Error("Watch(\"\"): got nil error, want one")
	}
	missingDir := filepath.Join(t.TempDir(), "nope", "stage.yaml")
	if _, err := Watch(missingDir, nil, nil, nil); err == nil || !strings.Contains(err.Error(), missingDir) {
		t.Errorf("Watch(%s): got %v, want an error naming it", missingDir, err)
	}
}
