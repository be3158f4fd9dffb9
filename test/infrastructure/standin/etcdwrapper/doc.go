// Package etcdwrapper is the test site's stand-in for the etcd container of
// an etcd-druid Pod: the etcd-wrapper image (github.com/gardener/etcd-wrapper
// v0.6.2, the tag etcd-druid v0.38.1 deploys by default, or v0.8.1, which it
// deploys under its UpgradeEtcdVersion feature gate and Gardener ships; the
// wrapper's own logic is the same in both). That image is not a Go module
// the project can build, so this package re-implements its one command,
// `etcd-wrapper start-etcd`:
//
//  1. Ask etcd-backup-restore (--backup-restore-host-port) to initialise the
//     data directory: poll GET /initialization/status once a second; on
//     "New" trigger GET /initialization/start?mode=full|sanity (sanity only
//     when the last run ended on SIGTERM or SIGINT, as recorded in
//     /var/etcd/data/exit_code); stop at "Successful"; any other answer
//     ("Progress", "Failed", an error) keeps it polling.
//  2. Fetch etcd's configuration (GET /config, five attempts), write it to
//     $HOME/etcd.conf.yaml and load it with embed.ConfigFromFile.
//  3. Start etcd embedded in this process with that configuration, and serve
//     /readyz and POST /stop on the wrapper port (default 9095; HTTPS with
//     etcd's server certificate when etcd's client URL uses TLS). /readyz
//     answers from a background check that every two seconds does a
//     linearizable Get of key "foo" against
//     <etcd-server-name>:<etcd-client-port> with a five-second timeout: a
//     learner, a member without quorum and a stopped member are not ready.
//  4. Run until SIGTERM/SIGINT (which first writes "terminated"/"interrupt"
//     to the exit-code file), POST /stop, or etcd stopping or failing; then
//     close etcd and exit 0. Failures before etcd runs exit 1.
//
// Where it deviates from etcd-wrapper v0.6.2, and why:
//
//   - The embedded etcd is v3.6.16, the project's etcd, not v3.4.34 (v0.6.2)
//     or v3.5.27 (v0.7.0 onwards, v0.8.1 among them, which etcd-druid
//     v0.38.1 pairs with etcd-backup-restore v0.44.1 under its
//     UpgradeEtcdVersion feature gate); the wrapper logic of these tags is
//     the same. etcd's file loader ignores keys it does not know, such as
//     druid's next-cluster-version-compatible (a v3.5 key) and
//     member-name-prefix, and reads druid's
//     peer-transport-security.skip-client-san-verification itself.
//   - Flags are parsed with pflag, as the project does elsewhere, not with
//     Go's flag package: the same names, types, defaults and --name=value
//     form, but single-dash long flags are refused and the help text
//     differs. Bad flags exit 2 and --help exits 0, as with the real
//     flag.ExitOnError.
//   - The umask 0077 is set before initialisation rather than after it; the
//     only file written in between, the etcd configuration, is 0600 anyway.
//   - The wrapper port is bound before etcd starts and a failure to bind or
//     serve ends Run with an error (exit 1), where the real wrapper logs
//     fatally from its server goroutine (also exit 1, but without closing
//     etcd).
//   - The readiness flag is atomic (the real one is a plain bool read and
//     written by two goroutines), and Run waits for its goroutines before it
//     returns.
//   - Log lines have the real wrapper's zap JSON format (ISO 8601 times,
//     info level); their messages are close to the real ones, not identical.
package etcdwrapper
