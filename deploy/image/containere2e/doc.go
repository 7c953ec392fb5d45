// Package containere2e tests the sidecar image (`make image`, deploy/image)
// the way Kubernetes runs it, with no container engine: a prefill "pod"
// and a decode "pod", each a staged container and an engine container
// (stage-kvengine from the same image) sharing a socket volume and a
// network namespace, the two pods' namespaces joined by a veth pair. The
// prefill engine pushes a synthetic KV cache to the decode engine, which
// verifies every byte.
//
// The containers come from the image's OCI layout: its layers unpacked
// into a root filesystem, each container a process chrooted into it (read
// only) in namespaces of its own, with the image config's user, working
// directory, environment, entrypoint and command (runtime_test.go).
//
// It needs root, iproute2's ip and the image (STAGE_IMAGE_OUT, default
// bin/image; STAGE_IMAGE names the tag, default stage:dev); without them
// it skips, unless STAGE_IMAGE_TEST=1 (`make image-test`, CI), which makes
// them required. Every address is inside the test's two network
// namespaces: nothing outside the machine is contacted.
package containere2e
