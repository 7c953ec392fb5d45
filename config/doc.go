// Package config loads, validates and watches the configuration of staged,
// the stage sidecar. It is the only package besides cmd/ that touches viper;
// everything else receives a plain, validated *Config.
//
// # Sources and precedence
//
// Highest first:
//
//  1. flags set on the command line (RegisterFlags: --listen, --token, ...)
//  2. environment: STAGE_ + the key's path in upper case with dots as
//     underscores (STAGE_STAGING_SLOTS, STAGE_SECURITY_TOKEN); every scalar
//     key is bound, whether or not the file has it
//  3. the config file given to Load (--config)
//  4. the embedded default (default.yaml, DefaultYAML), complete and
//     commented, so staged runs with no file at all
//
// Routes come from the file only; each route gets DefaultRoute* values for
// the keys it leaves out.
//
// # Validation
//
// Load rejects unknown keys and values of the wrong type, then Validate checks
// ranges and cross-key rules. Every problem is reported at once, one per
// line, with the key's path: "staging.slot_size: must be between 64KiB and
// 256MiB (got 1KiB)". A peer token is required unless
// security.allow_insecure is true, and allow_insecure on a listen address
// that is not loopback needs security.allow_insecure_remote too. Warnings
// lists what a valid config allows that exposes the sidecar (no token, an
// unauthenticated metrics page on every interface); staged logs them at
// start. Check is what `stagectl config check` runs: problems as its
// error, warnings returned.
//
// # Hot reload
//
// Watch reloads the file when it changes (watching its directory, debounced)
// and hands over only configurations that load and validate; the proxy
// applies the route changes.
//
// # What it never does
//
// It keeps no global state (each Load uses its own viper instance), never
// writes files or creates directories (SocketPath only computes a path),
// never searches for a config file on its own, never silently ignores an
// unknown key or a value it cannot parse, never falls back to defaults for
// a file that is invalid, never logs (callers decide), and never puts the
// token into an error message.
package config
