package config

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/spf13/pflag"
)

// WatchDebounce is how long Watch waits after the last change in the file's
// directory before reloading: editors and Kubernetes ConfigMap updates touch
// several files in a burst.
const WatchDebounce = 100 * time.Millisecond

// Watch reloads the config file at path when it changes and hands each new
// valid configuration to onChange; an unreadable or invalid file goes to
// onError (with every problem, as Load reports them) and nothing else
// happens: the caller keeps what it has. Reloads use Load's sources (the
// file, env vars, and the flags of fs).
//
// It watches the file's directory, not the file, so it sees editors that
// replace the file and ConfigMap symlink swaps; a reload happens only when
// the file's bytes differ from the last ones seen (the bytes at the time
// Watch was called, at first). It does not watch security.token_file.
//
// Callbacks run one at a time on Watch's goroutine. stop ends the watch and
// waits for a callback in progress; no callback runs after stop returns.
// stop may be called more than once.
func Watch(path string, fs *pflag.FlagSet, onChange func(*Config), onError func(error)) (stop func(), err error) {
	if path == "" {
		return nil, errors.New("config watch: no file given")
	}
	if onChange == nil {
		onChange = func(*Config) {}
	}
	if onError == nil {
		onError = func(error) {}
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("config watch %s: %w", path, err)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("config watch %s: %w", path, err)
	}
	if err := w.Add(filepath.Dir(abs)); err != nil {
		w.Close()
		return nil, fmt.Errorf("config watch %s: %w", path, err)
	}

	cw := &watch{path: path, abs: abs, fs: fs, onChange: onChange, onError: onError}
	_, cw.last, _ = cw.read()

	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		cw.loop(w, done)
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(done)
			w.Close()
			<-exited
		})
	}, nil
}

type watch struct {
	path, abs string
	fs        *pflag.FlagSet
	onChange  func(*Config)
	onError   func(error)
	last      []byte // read's state at the last reload
}

// read reads the file and returns its bytes, its read error, and the state
// a reload depends on: the bytes, or the error.
func (cw *watch) read() (data, state []byte, err error) {
	b, err := os.ReadFile(cw.abs)
	if err != nil {
		return nil, append([]byte("\x00err:"), err.Error()...), err
	}
	return b, append([]byte("\x00ok:"), b...), nil
}

func (cw *watch) loop(w *fsnotify.Watcher, done <-chan struct{}) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-done:
			return
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			if ev.Op == fsnotify.Chmod {
				continue
			}
			timer.Reset(WatchDebounce)
		case err, ok := <-w.Errors:
			if !ok {
				return
			}
			cw.report(done, fmt.Errorf("config watch %s: %w", cw.path, err))
		case <-timer.C:
			cw.reload(done)
		}
	}
}

func (cw *watch) reload(done <-chan struct{}) {
	data, st, err := cw.read()
	if bytes.Equal(st, cw.last) {
		return
	}
	cw.last = st
	if err != nil {
		cw.report(done, fileError(cw.path, err))
		return
	}
	c, err := load(cw.path, data, cw.fs)
	if err != nil {
		cw.report(done, err)
		return
	}
	select {
	case <-done:
	default:
		cw.onChange(c)
	}
}

func (cw *watch) report(done <-chan struct{}, err error) {
	select {
	case <-done:
	default:
		cw.onError(err)
	}
}
