package config

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"reflect"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"

	"github.com/stage-kv/stage/internal/knobs"
)

//go:embed default.yaml
var defaultYAML []byte

// DefaultYAML returns the embedded default configuration: every key with its
// default value and a comment. A copy; callers may keep or change it.
func DefaultYAML() []byte { return bytes.Clone(defaultYAML) }

// EnvPrefix is the prefix of environment variables: STAGE_STAGING_SLOTS sets
// staging.slots.
const EnvPrefix = "STAGE"

// Route defaults, applied to each route that leaves the key out.
const (
	DefaultRouteStripes         = 4
	DefaultRouteTransport       = "auto"
	DefaultRouteChecksum        = false
	DefaultRouteConnectTimeout  = 5 * time.Second
	DefaultRouteProgressTimeout = 30 * time.Second
	DefaultRoutePick            = PickNamed
	DefaultRouteIdleTimeout     = 5 * time.Minute
	DefaultRouteDNSInterval     = 5 * time.Second
)

// flagKeys maps each flag RegisterFlags adds (except --config) to its key.
var flagKeys = []struct{ flag, key string }{
	{"listen", "listen"},
	{"control-socket", "control_socket"},
	{"node-name", "node.name"},
	{"device", "device.kind"},
	{"device-ordinal", "device.ordinal"},
	{"log-level", "log.level"},
	{"metrics-listen", "metrics.listen"},
	{"token", "security.token"},
}

// RegisterFlags adds the config flags to fs: --config and one flag for each
// of the most used keys. Flags left unset do not override anything; set
// ones win over env, file and default. Load binds them when given fs.
func RegisterFlags(fs *pflag.FlagSet) {
	fs.String("config", "", "config file (YAML); empty: built-in defaults, env and flags only")
	fs.String("listen", "", "host:port for peer sessions (listen)")
	fs.String("control-socket", "", "Unix socket path for local engines (control_socket)")
	fs.String("node-name", "", "name of this sidecar shown to peers (node.name)")
	fs.String("device", "", "device backend: hostmem, cuda, acl or hip (device.kind)")
	fs.Int("device-ordinal", 0, "device ordinal (device.ordinal)")
	fs.String("log-level", "", "debug, info, warn or error (log.level)")
	fs.String("metrics-listen", "", "host:port serving /metrics (metrics.listen)")
	fs.String("token", "", "peer auth token (security.token); discouraged: visible in ps, prefer STAGE_SECURITY_TOKEN or security.token_file")
}

// ConfigPath returns the value of --config in fs, or "" when fs is nil or
// has no such flag.
func ConfigPath(fs *pflag.FlagSet) string {
	if fs == nil {
		return ""
	}
	f := fs.Lookup("config")
	if f == nil {
		return ""
	}
	return f.Value.String()
}

// Default returns the embedded default configuration, decoded but neither
// validated nor touched by env or flags. It has no token, so it does not
// pass Validate as is.
func Default() *Config {
	v := viper.New()
	v.SetConfigType("yaml")
	if err := v.ReadConfig(bytes.NewReader(defaultYAML)); err != nil {
		panic("config: embedded default.yaml: " + err.Error())
	}
	var c Config
	if err := decode(v.AllSettings(), &c); err != nil {
		panic("config: embedded default.yaml: " + err.Error())
	}
	return &c
}

// Load builds the configuration: the embedded default, then the file at path
// (when path is not empty; it must exist), then STAGE_* env vars, then the
// flags of fs that were set (when fs is not nil). It rejects unknown keys and
// values of the wrong type, applies route defaults and validates the result.
// A *ValidationError lists every problem found, each with its key's path;
// when path is set, every error names the file.
func Load(path string, fs *pflag.FlagSet) (*Config, error) {
	var data []byte
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fileError(path, err)
		}
		data = b
	}
	return load(path, data, fs)
}

// Check loads and validates the file at path as staged would (env vars
// included, no flags): what `stagectl config check FILE` runs. Every error
// names the file. A valid file's Warnings come back: settings it may have
// that expose the sidecar.
func Check(path string) ([]Problem, error) {
	if path == "" {
		return nil, errors.New("config check: no file given")
	}
	c, err := Load(path, nil)
	if err != nil {
		return nil, err
	}
	return Warnings(c), nil
}

// fileError names path in an error reading it, keeping errors.Is working
// (fs.ErrNotExist, fs.ErrPermission).
func fileError(path string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s: config file does not exist: %w", path, err)
	}
	return fmt.Errorf("%s: cannot read config file: %w", path, err)
}

// load is Load with the file's bytes already read (Watch reads them itself).
func load(path string, data []byte, fs *pflag.FlagSet) (*Config, error) {
	prefix := ""
	if path != "" {
		prefix = path + ": "
	}
	v := viper.New()
	v.SetConfigType("yaml")
	if err := v.ReadConfig(bytes.NewReader(defaultYAML)); err != nil {
		return nil, fmt.Errorf("config: embedded default.yaml: %w", err)
	}
	defaults := v.AllSettings()

	w := newWalker()
	fileProblems := 0
	if path != "" {
		// Parse the file alone first: viper's merge silently drops a value
		// whose shape differs from the default's (staging: 5), so shapes and
		// unknown keys are checked on the file as written.
		fv := viper.New()
		fv.SetConfigType("yaml")
		if err := fv.ReadConfig(bytes.NewReader(data)); err != nil {
			return nil, fmt.Errorf("%sinvalid YAML: %w", prefix, err)
		}
		w.walk("", fv.AllSettings(), configType)
		fileProblems = len(w.problems)
		if err := v.MergeConfig(bytes.NewReader(data)); err != nil {
			return nil, fmt.Errorf("%sinvalid YAML: %w", prefix, err)
		}
	}

	if err := bindEnvAndFlags(v, fs); err != nil {
		return nil, err
	}

	// Walk the merged settings: catches bad values from env and flags, and
	// returns a copy without unknown keys and bad values, so decoding below
	// cannot fail and a bad value keeps its default instead.
	clean, _ := w.walk("", v.AllSettings(), configType)
	cleanMap, _ := clean.(map[string]any)
	applyRouteDefaults(cleanMap)

	var c Config
	if err := decode(defaults, &c); err != nil {
		return nil, fmt.Errorf("config: embedded default.yaml: %w", err)
	}
	c.Routes = nil
	if err := decode(cleanMap, &c); err != nil {
		// Not expected: the walk removed what would not decode.
		return nil, fmt.Errorf("%s%w", prefix, err)
	}

	problems := w.problems
	if err := Validate(&c); err != nil {
		var ve *ValidationError
		if !errors.As(err, &ve) {
			return nil, fmt.Errorf("%s%w", prefix, err)
		}
		for _, p := range ve.Problems {
			if !w.covers(p.Key) {
				problems = append(problems, p)
			}
		}
	}
	// Say where a bad value came from when it was not the file.
	for i := fileProblems; i < len(problems); i++ {
		if src := source(problems[i].Key, fs); src != "" {
			problems[i].Msg += " [from " + src + "]"
		}
	}
	if len(problems) > 0 {
		return nil, &ValidationError{File: path, Problems: problems}
	}
	k, err := knobs.Parse(os.Environ())
	if err != nil {
		return nil, fmt.Errorf("test fault switch %w", err)
	}
	c.SetKnobs(k)
	return &c, nil
}

// bindEnvAndFlags lets every key be set by its STAGE_ variable and the
// keys that have flags by their flag (fs nil: none), over the file.
func bindEnvAndFlags(v *viper.Viper, fs *pflag.FlagSet) error {
	v.SetEnvPrefix(EnvPrefix)
	v.SetEnvKeyReplacer(strings.NewReplacer(".", "_"))
	v.AutomaticEnv()
	for _, k := range LeafKeys() {
		if err := v.BindEnv(k); err != nil {
			return fmt.Errorf("config: bind env for %s: %w", k, err)
		}
	}
	if fs == nil {
		return nil
	}
	for _, fk := range flagKeys {
		if f := fs.Lookup(fk.flag); f != nil {
			if err := v.BindPFlag(fk.key, f); err != nil {
				return fmt.Errorf("config: bind flag --%s: %w", fk.flag, err)
			}
		}
	}
	return nil
}

// source names the flag or env var that set key, or "" when neither did.
func source(key string, fs *pflag.FlagSet) string {
	if fs != nil {
		for _, fk := range flagKeys {
			if fk.key == key {
				if f := fs.Lookup(fk.flag); f != nil && f.Changed {
					return "--" + fk.flag
				}
			}
		}
	}
	env := EnvName(key)
	if !strings.ContainsAny(key, "[") && os.Getenv(env) != "" {
		return env
	}
	return ""
}

// applyRouteDefaults fills the keys each route leaves out.
func applyRouteDefaults(settings map[string]any) {
	routes, _ := settings["routes"].([]any)
	for _, r := range routes {
		m, ok := r.(map[string]any)
		if !ok {
			continue
		}
		setDefault(m, "stripes", DefaultRouteStripes)
		setDefault(m, "transport", DefaultRouteTransport)
		setDefault(m, "checksum", DefaultRouteChecksum)
		setDefault(m, "connect_timeout", DefaultRouteConnectTimeout)
		setDefault(m, "progress_timeout", DefaultRouteProgressTimeout)
		setDefault(m, "pick", DefaultRoutePick)
		setDefault(m, "idle_timeout", DefaultRouteIdleTimeout)
		setDefault(m, "dns_interval", DefaultRouteDNSInterval)
	}
}

func setDefault(m map[string]any, key string, v any) {
	if _, ok := m[key]; !ok {
		m[key] = v
	}
}

var (
	configType   = reflect.TypeOf(Config{})
	durationType = reflect.TypeOf(time.Duration(0))
	byteSizeType = reflect.TypeOf(ByteSize(0))
	depthType    = reflect.TypeOf(Depth(0))
	spinType     = reflect.TypeOf(Spin(0))
	intType      = reflect.TypeOf(0)
)

// LeafKeys returns the path of every scalar key of Config ("node.name",
// "staging.slot_size", ...), in declaration order. Lists of tables (routes)
// are not included. These are the keys bound to STAGE_* env vars.
func LeafKeys() []string {
	var keys []string
	var walk func(prefix string, t reflect.Type)
	walk = func(prefix string, t reflect.Type) {
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name := f.Tag.Get("mapstructure")
			if name == "" || name == "-" {
				continue
			}
			key := joinKey(prefix, name)
			switch {
			case f.Type.Kind() == reflect.Struct:
				walk(key, f.Type)
			case f.Type.Kind() == reflect.Slice && f.Type.Elem().Kind() == reflect.Struct:
				// routes: not an env key
			default:
				keys = append(keys, key)
			}
		}
	}
	walk("", configType)
	return keys
}

func joinKey(prefix, name string) string {
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}

// decoderConfig is the one decoding setup: strict types (no weak typing),
// strings from env converted by decodeHook, unknown keys are errors.
func decoderConfig(result any) *mapstructure.DecoderConfig {
	return &mapstructure.DecoderConfig{
		DecodeHook:  mapstructure.DecodeHookFuncType(decodeHook),
		ErrorUnused: true,
		TagName:     "mapstructure",
		Result:      result,
	}
}

func decode(input any, result any) error {
	d, err := mapstructure.NewDecoder(decoderConfig(result))
	if err != nil {
		return err
	}
	return d.Decode(input)
}
