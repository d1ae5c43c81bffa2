//! Root integration test of the cross-node rules without Slurm: two "nodes", each a network
//! namespace with its own table (`cross_node` set), on a veth pair; jobs of tenants a and b
//! on both (cgroups of one tree: job ids differ). The e2e tests on a real two-node Slurm
//! cluster are tests/tests/multi_node.rs.

mod common;

use common::*;
use tenancy_network::{add_job, apply, CrossNode, Dest, FirewallSpec, Ipv4Net};

#[test]
fn zz_probe_helper() {
    if let Ok(spec) = std::env::var(PROBE_ENV) {
        probe_main(&spec);
    }
}

fn spec(tree: &CgroupTree) -> FirewallSpec {
    // Both tenants may reach the node network: the cross-node rules tell them apart.
    let egress = vec![Dest::parse("10.78.0.0/24").unwrap()];
    FirewallSpec {
        cross_node: Some(CrossNode {
            node_network: Ipv4Net::parse("10.78.0.0/24").unwrap(),
            prefixes: vec![
                ("a".into(), Ipv4Net::parse("10.78.1.0/24").unwrap()),
                ("b".into(), Ipv4Net::parse("10.78.2.0/24").unwrap()),
            ],
            node: None,
        }),
        ..two_tenants(tree, egress.clone(), egress)
    }
}

/// [`drops`] of `tenant` in node `ns`.
fn drops_in(ns: &Netns, spec: &FirewallSpec, tenant: &'static str) -> u64 {
    let spec = spec.clone();
    in_netns(ns, move || drops(&spec, tenant))
}

#[test]
fn tenants_are_told_apart_across_nodes() {
    if !requires_root("nft tables in network namespaces and cgroup v2 jobs") {
        return;
    }
    let n1 = Netns::new("tnxa");
    let n2 = Netns::new("tnxb");
    let (v0, v1) = n1.veth_to(&n2, "tx");
    n1.ip(&["addr", "add", "10.78.0.1/24", "dev", &v0]);
    n2.ip(&["addr", "add", "10.78.0.2/24", "dev", &v1]);
    n1.ip(&["link", "set", &v0, "up"]);
    n2.ip(&["link", "set", &v1, "up"]);
    let tree = CgroupTree::new("tnx-test-");
    let spec = spec(&tree);
    // `firewall apply` in each node: it finds the node's address (10.78.0.i on the veth), adds
    // a's and b's addresses there and loads the table.
    let mut jobs = Vec::new();
    for (ns, a_job, b_job) in [(&n1, 11, 21), (&n2, 12, 22)] {
        let spec = spec.clone();
        jobs.push(in_netns(ns, move || {
            apply(&spec).unwrap();
            let resolved = spec.for_this_node().unwrap();
            (
                add_job(&spec, "a", a_job).unwrap().cgroup_path,
                add_job(&spec, "b", b_job).unwrap().cgroup_path,
                resolved
                    .cross_node
                    .unwrap()
                    .address("a")
                    .unwrap()
                    .to_string(),
            )
        }));
    }
    assert_eq!(jobs[0].2, "10.78.1.1");
    assert_eq!(jobs[1].2, "10.78.1.2");
    let (a1, b1) = (jobs[0].0.as_path(), jobs[0].1.as_path());
    let (a2, b2) = (jobs[1].0.as_path(), jobs[1].1.as_path());
    // Job probes run as a job user, who cannot enter a namespace: they are spawned from a
    // thread in the node's, which lives until the end (a probe dies with its parent thread).
    let (a2o, b2o) = (a2.to_path_buf(), b2.to_path_buf());
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (end_tx, end_rx) = std::sync::mpsc::channel::<()>();
    let n2_path = n2.path();
    let listeners = std::thread::spawn(move || {
        let f = std::fs::File::open(&n2_path).unwrap();
        // SAFETY: valid fd; only this thread changes namespace.
        let rc = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&f), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0);
        let mut procs = Procs::default();
        start_listener(&mut procs, "tcp-listen 0.0.0.0:5001", Some(&a2o), None);
        start_listener(&mut procs, "udp-listen 0.0.0.0:5002", Some(&a2o), None);
        start_listener(&mut procs, "tcp-listen 0.0.0.0:6001", Some(&b2o), None);
        ready_tx.send(()).unwrap();
        let _ = end_rx.recv();
        drop(procs);
    });
    ready_rx.recv().unwrap();
    let b_drops_n2 = drops_in(&n2, &spec, "b");
    let b_drops_n1 = drops_in(&n1, &spec, "b");
    use Outcome::*;
    let cases: Vec<(&str, Option<&std::path::Path>, &str, Outcome)> = vec![
        (
            "a@n1 -> a@n2 by node address",
            Some(a1),
            "tcp 10.78.0.2:5001",
            Ok,
        ),
        (
            "a@n1 -> a@n2 by node address, udp",
            Some(a1),
            "udp 10.78.0.2:5002",
            Ok,
        ),
        (
            "a@n1 -> a@n2 by a's address",
            Some(a1),
            "tcp 10.78.1.2:5001",
            Ok,
        ),
        (
            "b@n1 -> a@n2 by node address",
            Some(b1),
            "tcp 10.78.0.2:5001",
            Timeout,
        ),
        (
            "b@n1 -> a@n2 by node address, udp",
            Some(b1),
            "udp 10.78.0.2:5002",
            Timeout,
        ),
        // The kernel picks a's on-link address of n1 as the source: not b's, dropped at n1.
        (
            "b@n1 -> a@n2 by a's address",
            Some(b1),
            "tcp 10.78.1.2:5001",
            Timeout,
        ),
        (
            "a@n1 -> b@n2 by node address",
            Some(a1),
            "tcp 10.78.0.2:6001",
            Timeout,
        ),
        (
            "a@n1 -> b@n2 by b's address",
            Some(a1),
            "tcp 10.78.2.2:6001",
            Timeout,
        ),
        (
            "b@n1 -> b@n2 by b's address",
            Some(b1),
            "tcp 10.78.2.2:6001",
            Ok,
        ),
        // Processes outside every job are no tenant's, here as on the node itself.
        ("root@n1 -> a@n2", None, "tcp 10.78.0.2:5001", Ok),
    ];
    let mut failures = Vec::new();
    for (name, cg, args, want) in &cases {
        let (args2, cg2) = (args.to_string(), cg.map(|p| p.to_path_buf()));
        let got = in_netns(&n1, move || client(&args2, cg2.as_deref()));
        if got != *want {
            failures.push(format!("{name}: {args}: got {got:?}, want {want:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "across nodes:\n{}",
        failures.join("\n")
    );
    // b's attempts by node address were refused by n2 (the receiver, on b's counter), the one
    // from a's address by n1 (the sender).
    assert!(drops_in(&n2, &spec, "b") > b_drops_n2);
    assert!(drops_in(&n1, &spec, "b") > b_drops_n1);
    end_tx.send(()).unwrap();
    listeners.join().unwrap();

    // A config change takes effect with apply: b's new prefix replaces its old address, and
    // without node_network no tenant address stays.
    let mut moved = spec.clone();
    moved.cross_node.as_mut().unwrap().prefixes[1].1 = Ipv4Net::parse("10.78.3.0/24").unwrap();
    let mut off = spec.clone();
    off.cross_node = None;
    let addrs = in_netns(&n1, move || {
        let list = || {
            let o = std::process::Command::new("ip")
                .args(["-4", "-o", "addr", "show"])
                .output()
                .unwrap();
            String::from_utf8_lossy(&o.stdout).into_owned()
        };
        apply(&moved).unwrap();
        let after_move = list();
        apply(&off).unwrap();
        (after_move, list())
    });
    assert!(
        addrs.0.contains("10.78.3.1/24") && !addrs.0.contains("10.78.2.1/"),
        "{}",
        addrs.0
    );
    assert!(addrs.0.contains("10.78.1.1/24"), "{}", addrs.0);
    assert!(
        !addrs.1.contains("10.78.1.1/") && !addrs.1.contains("10.78.3.1/"),
        "{}",
        addrs.1
    );
    assert!(addrs.1.contains("10.78.0.1/24"), "{}", addrs.1);
}
