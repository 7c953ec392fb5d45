package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"runtime/trace"
	"sync"
	"time"
)

// profiler collects CPU profiles of the spawned sidecars while bench times
// a row, so a bottleneck can be read off a profile rather than guessed
// (`go tool pprof -top staged DIR/FILE`).
type profiler struct {
	dir     string
	targets map[string]string // sidecar name -> pprof address
	wg      sync.WaitGroup
	mu      sync.Mutex
	err     error
}

func newProfiler(dir string, sidecars ...*sidecar) (*profiler, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("--profile: %w", err)
	}
	p := &profiler{dir: dir, targets: map[string]string{}}
	for _, sc := range sidecars {
		if sc.Pprof == "" {
			return nil, fmt.Errorf("--profile: sidecar %s did not report a profiler address (staged too old?)", sc.Name)
		}
		p.targets[sc.Name] = sc.Pprof
	}
	return p, nil
}

// start asks every sidecar for a CPU profile and an execution trace
// lasting d (whole seconds, at least one), written to
// DIR/<label>-<sidecar>.pprof and .trace (go tool trace reads the latter:
// where a goroutine waited, and for whom).
func (p *profiler) start(ctx context.Context, label string, d time.Duration) {
	secs := max(1, int(math.Ceil(d.Seconds())))
	p.traceSelf(label, time.Duration(secs)*time.Second)
	for name, addr := range p.targets {
		for _, k := range []struct{ endpoint, ext string }{{"profile", ".pprof"}, {"trace", ".trace"}} {
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				path := filepath.Join(p.dir, label+"-"+name+k.ext)
				url := fmt.Sprintf("http://%s/debug/pprof/%s?seconds=%d", addr, k.endpoint, secs)
				if err := fetchProfile(ctx, url, path, secs); err != nil {
					p.mu.Lock()
					p.err = fmt.Errorf("%s of %s: %w", k.endpoint, name, err)
					p.mu.Unlock()
				}
			}()
		}
	}
}

// traceSelf traces this process (the engine's side of the transfers) for d
// into DIR/<label>-engine.trace, so its share of a transfer's time can be
// read beside the sidecars'.
func (p *profiler) traceSelf(label string, d time.Duration) {
	f, err := os.Create(filepath.Join(p.dir, label+"-engine.trace"))
	if err == nil {
		err = trace.Start(f)
	}
	if err != nil {
		p.mu.Lock()
		p.err = fmt.Errorf("trace of the engine side: %w", err)
		p.mu.Unlock()
		if f != nil {
			f.Close()
		}
		return
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		time.Sleep(d)
		trace.Stop()
		f.Close()
	}()
}

// wait returns once every profile asked for is written.
func (p *profiler) wait() error {
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	err := p.err
	p.err = nil
	return err
}

func fetchProfile(ctx context.Context, url, path string, secs int) error {
	ctx, cancel := context.WithTimeout(ctx, time.Duration(secs+30)*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, b)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}
