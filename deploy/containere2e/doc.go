// Package containere2e tests the sidecar image (Dockerfile, `make image`)
// the way Kubernetes runs it: a prefill "pod" and a decode "pod", each a
// staged container and an engine container (stage-kvengine from the same
// image) sharing a socket volume and a network namespace, the two sidecars
// joined by a network of their own. The prefill engine pushes a synthetic
// KV cache to the decode engine, which verifies every byte.
//
// It needs a usable docker command and the image (default stage:dev,
// STAGE_IMAGE to change it); without them it skips, unless
// STAGE_IMAGE_TEST=1 (`make image-test`), which makes them required.
package containere2e
