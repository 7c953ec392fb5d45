// Package netns holds fault-injection tests of real staged processes, each
// in its own Linux network namespace, joined through a bridge in a hub
// namespace where the test itself runs, with toxiproxy (as a library) and
// nftables rules between them.
//
// It is a module of its own so that toxiproxy and what it pulls in stay
// out of the sidecar's dependency graph. The tests need root and
// iproute2 (nftables for some); without them they skip, unless
// STAGE_NETNS_REQUIRED=1 (CI), where that is a failure. Every address is
// in 198.18.0.0/24 (RFC 2544 test range), and lives only in namespaces
// the tests create and delete; nothing is added to the host's namespace.
//
// How a test runs: in the host namespace it builds the namespaces, then
// runs itself again inside the hub namespace (ip netns exec), where the
// test body starts the sidecars (ip netns exec again, one namespace
// each). The outer run deletes the namespaces, and kills what is left in
// them, however the inner run ended.
package netns
