// Command staged is the stage sidecar: it runs beside an inference engine,
// takes registrations and transfer requests on a local control socket, and
// moves KV-cache bytes to and from the sidecars of its routes.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	_ "github.com/stage-kv/stage/acl" // Ascend, loaded with dlopen when configured
	"github.com/stage-kv/stage/config"
	_ "github.com/stage-kv/stage/cuda"           // NVIDIA, loaded with dlopen when configured
	_ "github.com/stage-kv/stage/device/hostmem" // the emulated backend
	_ "github.com/stage-kv/stage/hip"            // AMD, loaded with dlopen when configured
	"github.com/stage-kv/stage/proxy"
)

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "staged:", err)
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	cmd := &cobra.Command{
		Use:           "staged",
		Short:         "stage sidecar: moves KV-cache bytes between accelerators",
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
	}
	config.RegisterFlags(cmd.Flags())
	cmd.Flags().Bool("print-default-config", false, "print the embedded default configuration and exit")
	cmd.Flags().String("pprof", "", "serve Go profiles (net/http/pprof) on this address, e.g. 127.0.0.1:6060")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if p, _ := cmd.Flags().GetBool("print-default-config"); p {
			_, err := os.Stdout.Write(config.DefaultYAML())
			return err
		}
		cfg, err := config.Load(config.ConfigPath(cmd.Flags()), cmd.Flags())
		if err != nil {
			return err
		}
		log, err := newLogger(cfg.Log)
		if err != nil {
			return err
		}
		defer func() { _ = log.Sync() }()
		logStartConfig(log, cfg, os.Environ())
		var pprofAddr string
		if addr, _ := cmd.Flags().GetString("pprof"); addr != "" {
			bound, stop, err := servePprof(addr, log)
			if err != nil {
				return err
			}
			defer stop()
			pprofAddr = bound
		}
		return run(cfg, log, config.ConfigPath(cmd.Flags()), cmd.Flags(), pprofAddr)
	}
	return cmd
}

func run(cfg *config.Config, log *zap.Logger, path string, fs *pflag.FlagSet, pprofAddr string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	srv, err := proxy.New(cfg, log)
	if err != nil {
		return err
	}
	// The server has its own context: a signal starts the drain below, and
	// only Close ends the sessions.
	if err := srv.Start(context.Background()); err != nil {
		_ = srv.Close()
		return err
	}
	// Tell a parent (stagectl demo, tests) where we listen, on one line.
	line := fmt.Sprintf("staged ready peers=%s socket=%s", srv.PeerAddr(), srv.SocketPath())
	if m := srv.MetricsAddr(); m != "" {
		line += " metrics=" + m
	}
	if pprofAddr != "" {
		line += " pprof=" + pprofAddr
	}
	fmt.Println(line)

	// Routes reload without a restart: when the file changes, or on SIGHUP.
	// An invalid file is refused with its problems and the running config kept.
	reload := func(c *config.Config) { srv.ApplyRoutes(c) }
	refuse := func(err error) {
		log.Warn("config reload refused; the running config stays", zap.Error(err))
	}
	if path != "" {
		stopWatch, err := config.Watch(path, fs, reload, refuse)
		if err != nil {
			log.Warn("cannot watch the config file; reload with SIGHUP", zap.String("file", path), zap.Error(err))
		} else {
			defer stopWatch()
		}
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for waiting := true; waiting; {
		select {
		case <-ctx.Done():
			waiting = false
		case <-hup:
			if path == "" {
				log.Info("SIGHUP: no config file to reload (started without --config)")
				continue
			}
			c, err := config.Load(path, fs)
			if err != nil {
				refuse(err)
				continue
			}
			reload(c)
		}
	}
	log.Info("shutting down: draining transfers in flight", zap.Duration("drain_timeout", cfg.Drain))
	dctx, cancel := context.WithTimeout(context.Background(), cfg.Drain)
	left := srv.Drain(dctx)
	cancel()
	if left > 0 {
		log.Warn("drain deadline passed; failing the transfers still in flight", zap.Int("transfers", left))
	}
	done := make(chan error, 1)
	go func() { done <- srv.Close() }()
	select {
	case err := <-done:
		if err != nil {
			log.Warn("shutdown", zap.Error(err))
		}
	case <-time.After(cfg.Drain + 5*time.Second):
		return fmt.Errorf("shutdown did not finish within %v", cfg.Drain+5*time.Second)
	}
	return nil
}

// logStartConfig logs the device settings staged opens its backend with
// and the test fault switches set (so one left on is seen), and warns
// about each STAGE_* variable that sets nothing (a typo, or a name of an
// earlier release), naming it.
func logStartConfig(log *zap.Logger, cfg *config.Config, environ []string) {
	d := cfg.Device
	fields := []zap.Field{zap.String("kind", d.Kind), zap.Int("ordinal", d.Ordinal)}
	switch d.Kind {
	case "hostmem":
		fields = append(fields, zap.Float64("bandwidth_gbps", d.Hostmem.BandwidthGBps), zap.Duration("latency", d.Hostmem.Latency))
	case "cuda":
		fields = append(fields, zap.String("library", d.CUDA.Library), zap.String("copy_mode", d.CUDA.CopyMode),
			zap.String("event_wait", d.CUDA.EventWait), zap.String("ptx", d.CUDA.PTX))
	case "acl":
		fields = append(fields, zap.String("library", d.ACL.Library), zap.String("copy_mode", d.ACL.CopyMode))
	case "hip":
		fields = append(fields, zap.String("library", d.HIP.Library))
	}
	log.Info("device config", fields...)
	if set := cfg.Knobs.Set(); len(set) > 0 {
		log.Info("test fault switches set", zap.Strings("switches", set))
	}
	for _, u := range config.UnknownEnvVars(environ) {
		log.Warn("unknown environment variable: it sets no config key (STAGE_TEST_* are reserved for tests)", zap.String("variable", u.Name), zap.String("renamed_to", u.Hint))
	}
	for _, w := range config.Warnings(cfg) {
		log.Warn("insecure setting", zap.String("key", w.Key), zap.String("why", w.Msg))
	}
}

func newLogger(c config.Log) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(c.Level)
	if err != nil {
		return nil, fmt.Errorf("log.level: %w", err)
	}
	zc := zap.NewProductionConfig()
	if c.Format == "console" {
		zc = zap.NewDevelopmentConfig()
		zc.DisableStacktrace = true
	}
	zc.Level = zap.NewAtomicLevelAt(lvl)
	zc.OutputPaths = []string{"stderr"}
	return zc.Build()
}
