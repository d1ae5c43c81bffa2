//! Root integration tests (real nft in private network namespaces, real cgroup v2 jobs):
//! between tenants only what the rules allow crosses, for every IP protocol and for IPv6 as for
//! IPv4. Protocols the input hook's socket lookup cannot see (UDP-Lite, raw IP; SCTP and DCCP
//! alike, not built into this kernel) are dropped at the sender whatever its egress list says:
//! here tenant b's list covers loopback and the node's own subnets, IPv4 and IPv6.

mod common;

use common::*;
use tenancy_network::{add_job, apply, Dest, FirewallSpec};

/// Probe entry point: this binary re-executed with TNW_PROBE set acts as a listener/client.
#[test]
fn zz_probe_helper() {
    if let Ok(spec) = std::env::var(PROBE_ENV) {
        probe_main(&spec);
    }
}

/// Node namespace with 10.77.0.1/24 and fd77::1/64 on a veth (its peer in `remote`), the
/// firewall's cgroup tree, and a spec whose tenant b may reach every node address by egress.
fn node_with_wide_egress(prefix: &str) -> Option<(Netns, Netns, CgroupTree, FirewallSpec)> {
    if !requires_root("nft tables in a network namespace and cgroup v2 jobs") {
        return None;
    }
    let node = Netns::new(&format!("{prefix}n"));
    let remote = Netns::new(&format!("{prefix}r"));
    let (v0, v1) = node.veth_to(&remote, "tv");
    node.ip(&["addr", "add", "10.77.0.1/24", "dev", &v0]);
    node.ip(&["-6", "addr", "add", "fd77::1/64", "dev", &v0, "nodad"]);
    node.ip(&["link", "set", &v0, "up"]);
    node.ip(&["link", "set", "lo", "up"]);
    remote.ip(&["link", "set", &v1, "up"]);
    let tree = CgroupTree::new("tnw-proto-");
    let wide = ["127.0.0.0/8", "10.77.0.0/24", "[::1]", "[fd77::/64]"];
    let b = wide.iter().map(|d| Dest::parse(d).unwrap()).collect();
    let spec = two_tenants(&tree, vec![], b);
    Some((node, remote, tree, spec))
}

/// One datagram case: name, receiver probe, sender probe, the receiver's and the sender's job
/// cgroup (None: no job), and (received, sent) as wanted.
type Case<'a> = (
    &'a str,
    &'a str,
    &'a str,
    Option<&'a std::path::Path>,
    Option<&'a std::path::Path>,
    (Outcome, Outcome),
);

/// Runs datagram cases: a receiver in a's job (or none), a sender in b's (or none).
fn run(cases: &[Case]) -> Vec<String> {
    let mut failures = Vec::new();
    for (name, recv, send, recv_cg, send_cg, want) in cases {
        let r = start_receiver(recv, *recv_cg, None);
        let sent = client(send, *send_cg);
        let got = (received(r), sent);
        if got != *want {
            failures.push(format!(
                "{name}: [{recv}] <- [{send}]: got (received, sent) {got:?}, want {want:?}"
            ));
        }
    }
    failures
}

#[test]
fn udplite_sctp_and_raw_ip_do_not_cross_tenants() {
    let Some((node, _remote, _tree, spec)) = node_with_wide_egress("tnwp") else {
        return;
    };
    in_netns(&node, move || {
        apply(&spec).unwrap();
        let a = add_job(&spec, "a", 41).unwrap().cgroup_path;
        let b = add_job(&spec, "b", 42).unwrap().cgroup_path;
        let (a, b) = (Some(a.as_path()), Some(b.as_path()));
        use Outcome::*;
        let before = drops(&spec, "b");
        let failures = run(&[
            (
                "b->a udplite lo",
                "dgram-recv udplite 0.0.0.0:5201",
                "dgram-send udplite 127.0.0.1:5201",
                a,
                b,
                (Timeout, Denied),
            ),
            (
                "b->a udplite node addr",
                "dgram-recv udplite 0.0.0.0:5202",
                "dgram-send udplite 10.77.0.1:5202",
                a,
                b,
                (Timeout, Denied),
            ),
            (
                "b->a raw ip lo",
                "dgram-recv raw 0.0.0.0:0",
                "dgram-send raw 127.0.0.1:0",
                a,
                b,
                (Timeout, Denied),
            ),
            (
                "b->a raw ip node addr",
                "dgram-recv raw 0.0.0.0:0",
                "dgram-send raw 10.77.0.1:0",
                a,
                b,
                (Timeout, Denied),
            ),
            // controls: the protocols work outside jobs, and UDP is still judged at input
            (
                "root->a udplite lo",
                "dgram-recv udplite 0.0.0.0:5203",
                "dgram-send udplite 127.0.0.1:5203",
                a,
                None,
                (Ok, Ok),
            ),
            (
                "root->a raw ip lo",
                "dgram-recv raw 0.0.0.0:0",
                "dgram-send raw 127.0.0.1:0",
                a,
                None,
                (Ok, Ok),
            ),
            (
                "b->a udp lo (dropped at input)",
                "dgram-recv udp 0.0.0.0:5204",
                "dgram-send udp 127.0.0.1:5204",
                a,
                b,
                (Timeout, Ok),
            ),
        ]);
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        assert!(drops(&spec, "b") >= before + 12, "drop_b");
        // SCTP and DCCP: the same rule (no protocol but TCP, UDP and ICMP leaves a job).
        let rules = nft(&["list", "chain", "inet", "tenancy", "out_2"]);
        assert!(
            rules.lines().any(|l| l.contains("meta l4proto != {")
                && ["tcp", "udp", "icmp", "ipv6-icmp", "goto deny_2"]
                    .iter()
                    .all(|w| l.contains(w))),
            "{rules}"
        );
    });
}

#[test]
fn ipv6_does_not_cross_tenants() {
    let Some((node, _remote, _tree, spec)) = node_with_wide_egress("tnw6") else {
        return;
    };
    in_netns(&node, move || {
        apply(&spec).unwrap();
        let a1 = add_job(&spec, "a", 51).unwrap().cgroup_path;
        let a2 = add_job(&spec, "a", 52).unwrap().cgroup_path;
        let b1 = add_job(&spec, "b", 53).unwrap().cgroup_path;
        let (a, a2, b) = (Some(a1.as_path()), Some(a2.as_path()), Some(b1.as_path()));
        let mut procs = Procs::default();
        start_listener(&mut procs, "tcp-listen [::]:5301", a, None);
        use Outcome::*;
        let mut failures = client_failures(&[
            ("a->a tcp ::1", a2, "tcp [::1]:5301", Ok),
            ("a->a tcp node v6 addr", a2, "tcp [fd77::1]:5301", Ok),
            ("b->a tcp ::1", b, "tcp [::1]:5301", Timeout),
            ("b->a tcp node v6 addr", b, "tcp [fd77::1]:5301", Timeout),
            ("root->a tcp node v6 addr", None, "tcp [fd77::1]:5301", Ok),
        ]);
        failures.extend(run(&[
            (
                "b->a udp v6 (dropped at input)",
                "dgram-recv udp [::]:5302",
                "dgram-send udp [fd77::1]:5302",
                a,
                b,
                (Timeout, Ok),
            ),
            (
                "b->a udplite v6",
                "dgram-recv udplite [::]:5303",
                "dgram-send udplite [fd77::1]:5303",
                a,
                b,
                (Timeout, Denied),
            ),
            (
                "b->a udplite ::1",
                "dgram-recv udplite [::]:5304",
                "dgram-send udplite [::1]:5304",
                a,
                b,
                (Timeout, Denied),
            ),
            (
                "b->a raw ip v6",
                "dgram-recv raw [::]:0",
                "dgram-send raw [fd77::1]:0",
                a,
                b,
                (Timeout, Denied),
            ),
            (
                "root->a udplite v6",
                "dgram-recv udplite [::]:5305",
                "dgram-send udplite [fd77::1]:5305",
                a,
                None,
                (Ok, Ok),
            ),
        ]));
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        drop(procs);
    });
}
