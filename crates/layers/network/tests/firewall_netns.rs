//! Root integration tests: real nft tables in private network namespaces, real cgroup v2
//! job directories, real TCP, UDP and UDP-Lite probes placed in them (as uid 65534 for both
//! tenants).
//! Only addresses inside the namespaces created here are used.

mod common;

use std::process::Command;
use tenancy_test_support::output_with_stdin;

use common::*;
use tenancy_network::{add_job, apply, remove_job, Dest, Error, FirewallSpec};

/// Probe entry point: this binary re-executed with TNW_PROBE set acts as a listener/client.
#[test]
fn zz_probe_helper() {
    if let Ok(spec) = std::env::var(PROBE_ENV) {
        probe_main(&spec);
    }
}

fn spec(tree: &CgroupTree) -> FirewallSpec {
    let a = vec![Dest::parse("10.77.1.0/24:7001/tcp").unwrap()];
    FirewallSpec {
        infrastructure: vec![Dest::parse("10.77.3.0/24").unwrap()],
        ..two_tenants(tree, a, vec![])
    }
}

/// Node namespace N (the firewall is loaded there) and "remote host" R on a veth pair:
/// N is 10.77.0.1/24 (broadcast 10.77.0.255, multicast routed to the veth), R holds
/// 10.77.1.2 (in a's egress list), 10.77.2.2 (in no list) and 10.77.3.2 (infrastructure).
fn topology(node_prefix: &str, remote_prefix: &str) -> (Netns, Netns) {
    let node = Netns::new(node_prefix);
    let remote = Netns::new(remote_prefix);
    let (v0, v1) = node.veth_to(&remote, "tv");
    node.ip(&["addr", "add", "10.77.0.1/24", "brd", "+", "dev", &v0]);
    node.ip(&["link", "set", &v0, "up"]);
    node.ip(&["route", "add", "10.77.0.0/16", "dev", &v0]);
    node.ip(&["route", "add", "224.0.0.0/4", "dev", &v0]);
    for a in ["10.77.1.2/24", "10.77.2.2/24", "10.77.3.2/24"] {
        remote.ip(&["addr", "add", a, "dev", &v1]);
    }
    remote.ip(&["link", "set", &v1, "up"]);
    remote.ip(&["route", "add", "10.77.0.0/24", "dev", &v1]);
    (node, remote)
}

/// One datagram case: a `dgram-recv` probe, then a `dgram-send` probe; what each reported.
struct Dgram<'a> {
    name: &'a str,
    recv: &'a str,
    recv_cg: Option<&'a std::path::Path>,
    recv_ns: Option<&'a Netns>,
    send: &'a str,
    send_cg: Option<&'a std::path::Path>,
    /// (receiver, sender): Timeout = nothing arrived; Denied = the output hook refused it.
    want: (Outcome, Outcome),
}

/// The node and remote namespaces, the cgroup tree and the firewall spec most tests start
/// from; None (the test skips) without root.
fn isolated_node(node: &str, remote: &str) -> Option<(Netns, Netns, CgroupTree, FirewallSpec)> {
    if !requires_root("nft tables in a network namespace and cgroup v2 jobs") {
        return None;
    }
    let (node, remote) = topology(node, remote);
    let tree = CgroupTree::new("tnw-test-");
    let spec = spec(&tree);
    Some((node, remote, tree, spec))
}

impl<'a> Dgram<'a> {
    /// A case whose receiver runs in the job cgroup `recv_cg` of the node's namespace.
    fn to_job(
        recv_cg: Option<&'a std::path::Path>,
        name: &'a str,
        recv: &'a str,
        send: &'a str,
        send_cg: Option<&'a std::path::Path>,
        want: (Outcome, Outcome),
    ) -> Dgram<'a> {
        Dgram {
            name,
            recv,
            recv_cg,
            recv_ns: None,
            send,
            send_cg,
            want,
        }
    }
}

fn run_dgram_cases(cases: &[Dgram]) -> Vec<String> {
    let mut failures = Vec::new();
    for c in cases {
        let r = start_receiver(c.recv, c.recv_cg, c.recv_ns);
        let sent = client(c.send, c.send_cg);
        let got = (received(r), sent);
        if got != c.want {
            failures.push(format!(
                "{}: [{}] <- [{}]: got (received, sent) {got:?}, want {:?}",
                c.name, c.recv, c.send, c.want
            ));
        }
    }
    failures
}

#[test]
fn tenants_are_isolated_and_egress_is_filtered() {
    let Some((node, remote, _tree, spec)) = isolated_node("tnwn", "tnwr") else {
        return;
    };
    let mut procs = Procs::default();
    // Remote listeners (not jobs): one in a's allowed CIDR, one outside, one infrastructure.
    for a in ["10.77.1.2:7001", "10.77.2.2:7001", "10.77.3.2:7001"] {
        start_listener(&mut procs, &format!("tcp-listen {a}"), None, Some(&remote));
    }

    let node_name = node.name.clone();
    let result = in_netns(&node, move || {
        let mut procs = procs;
        // The cgroups must exist before listeners are placed; apply creates them, so first
        // prove the attack works without the table (control), then load it.
        std::fs::create_dir_all(spec.cgroup.tenant_dir("a")).unwrap();
        std::fs::create_dir_all(spec.cgroup.tenant_dir("b")).unwrap();
        // add_job refuses while no table covers the tenant (fail closed).
        assert!(matches!(add_job(&spec, "a", 11), Err(Error::NotApplied(_))));
        apply(&spec).unwrap();
        let a1 = add_job(&spec, "a", 11).unwrap();
        let a2 = add_job(&spec, "a", 12).unwrap();
        let b1 = add_job(&spec, "b", 21).unwrap();
        assert!(a1
            .cgroup_path
            .ends_with(format!("{}/a/job_11", spec.cgroup.subtree)));
        // Idempotent add.
        assert_eq!(add_job(&spec, "a", 11).unwrap(), a1);

        let (a1p, a2p, b1p) = (&a1.cgroup_path, &a2.cgroup_path, &b1.cgroup_path);
        start_listener(&mut procs, "tcp-listen 0.0.0.0:5001", Some(a1p), None);
        start_listener(&mut procs, "udp-listen 0.0.0.0:5002", Some(a1p), None);
        start_listener(&mut procs, "tcp-listen [::1]:5003", Some(a1p), None);
        start_listener(&mut procs, "tcp-listen 0.0.0.0:6001", Some(b1p), None);
        start_listener(&mut procs, "udp-listen 0.0.0.0:6002", Some(b1p), None);
        start_listener(&mut procs, "tcp-listen [::1]:6003", Some(b1p), None);

        let a = Some(a2p.as_path());
        let b = Some(b1p.as_path());
        use Outcome::*;
        let before_b = drops(&spec, "b");
        let failures = client_failures(&[
            // same tenant, other job: allowed over loopback, node address, UDP and IPv6
            ("a->a lo tcp", a, "tcp 127.0.0.1:5001", Ok),
            ("a->a node addr tcp", a, "tcp 10.77.0.1:5001", Ok),
            ("a->a lo udp", a, "udp 127.0.0.1:5002", Ok),
            ("a->a ::1 tcp", a, "tcp [::1]:5003", Ok),
            // cross tenant: denied both ways, every path
            ("b->a lo tcp", b, "tcp 127.0.0.1:5001", Timeout),
            ("b->a node addr tcp", b, "tcp 10.77.0.1:5001", Timeout),
            ("b->a lo udp", b, "udp 127.0.0.1:5002", Timeout),
            ("b->a ::1 tcp", b, "tcp [::1]:5003", Timeout),
            ("a->b lo tcp", a, "tcp 127.0.0.1:6001", Timeout),
            ("a->b node addr tcp", a, "tcp 10.77.0.1:6001", Timeout),
            ("a->b node addr udp", a, "udp 10.77.0.1:6002", Timeout),
            ("a->b ::1 tcp", a, "tcp [::1]:6003", Timeout),
            // egress
            ("a->allowed cidr", a, "tcp 10.77.1.2:7001", Ok),
            ("a->other host", a, "tcp 10.77.2.2:7001", Timeout),
            ("a->infrastructure", a, "tcp 10.77.3.2:7001", Ok),
            ("b->a's cidr", b, "tcp 10.77.1.2:7001", Timeout),
            ("b->infrastructure", b, "tcp 10.77.3.2:7001", Ok),
            // non-job processes (root, no job cgroup) are unaffected
            ("root->a", None, "tcp 127.0.0.1:5001", Ok),
            ("root->b", None, "tcp 10.77.0.1:6001", Ok),
            ("root->other host", None, "tcp 10.77.2.2:7001", Ok),
        ]);
        assert!(
            failures.is_empty(),
            "policy violations:\n{}",
            failures.join("\n")
        );
        // Attempts are counted for the tenant that made them.
        let (da, db) = (drops(&spec, "a"), drops(&spec, "b"));
        assert!(da >= 5, "drop_a = {da}");
        assert!(db > before_b && db >= 5, "drop_b = {db}");

        // Save and reload: `nft list ruleset` output loads back and still enforces.
        let saved = nft(&["list", "ruleset"]);
        nft(&["delete", "table", "inet", "tenancy"]);
        assert_eq!(
            client("tcp 127.0.0.1:5001", b),
            Ok,
            "control: no table, b reaches a"
        );
        let reload = output_with_stdin(Command::new("nft").args(["-f", "-"]), &saved).unwrap();
        assert!(
            reload.status.success(),
            "reload of saved ruleset failed: {}",
            String::from_utf8_lossy(&reload.stderr)
        );
        assert_eq!(
            client("tcp 127.0.0.1:5001", b),
            Timeout,
            "after reload b->a"
        );
        assert_eq!(client("tcp 127.0.0.1:5001", a), Ok, "after reload a->a");

        // Teardown with listeners still running: remove_job kills them and removes the dirs.
        for (t, j) in [("a", 11), ("a", 12), ("b", 21)] {
            remove_job(&spec, t, j).unwrap();
            remove_job(&spec, t, j).unwrap(); // idempotent
            assert!(!spec.cgroup.job_dir(t, j).exists());
        }
        for c in &mut procs.0 {
            // listeners in jobs were killed by cgroup.kill; remote ones are still alive
            let _ = c.try_wait();
        }
        let after = nft(&["list", "ruleset"]);
        assert!(!after.contains("job_"), "job left in ruleset:\n{after}");
        assert_eq!(saved.matches("job_").count(), 0);
        procs
    });
    drop(result);
    eprintln!("node netns {node_name} done");
}

#[test]
fn add_job_fails_closed_when_table_missing_or_tenant_recreated() {
    if !requires_root("nft tables in a network namespace and cgroup v2 jobs") {
        return;
    }
    let node = Netns::new("tnwf");
    let tree = CgroupTree::new("tnw-test-");
    let spec = spec(&tree);
    in_netns(&node, move || {
        apply(&spec).unwrap();
        add_job(&spec, "a", 1).unwrap();
        remove_job(&spec, "a", 1).unwrap();
        // Table flushed by someone: refuse to start a job that would be unfiltered.
        nft(&["delete", "table", "inet", "tenancy"]);
        let e = add_job(&spec, "a", 2).unwrap_err();
        assert!(matches!(e, Error::NotApplied(_)), "{e}");
        assert!(e.to_string().contains("firewall apply"), "{e}");
        // Re-applied, then the tenant cgroup is re-created behind the table's back.
        apply(&spec).unwrap();
        std::fs::remove_dir(spec.cgroup.tenant_dir("b")).unwrap();
        std::fs::create_dir(spec.cgroup.tenant_dir("b")).unwrap();
        let e = add_job(&spec, "b", 3).unwrap_err();
        assert!(
            e.to_string()
                .contains("created after the firewall was loaded"),
            "{e}"
        );
        assert!(!spec.cgroup.job_dir("b", 3).exists());
        apply(&spec).unwrap();
        add_job(&spec, "b", 3).unwrap();
        remove_job(&spec, "b", 3).unwrap();
    });
}

/// Protocols the input hook's socket lookup does not see (UDP-Lite here; SCTP alike) never
/// leave a job (the output chain denies them before the egress list: other_protocols.rs), so
/// another tenant's UDP-Lite socket on the node is out of reach and the send fails at once.
#[test]
fn udplite_to_local_addresses_follows_the_egress_list() {
    let Some((node, _remote, _tree, spec)) = isolated_node("tnw1n", "tnw1r") else {
        return;
    };
    in_netns(&node, move || {
        apply(&spec).unwrap();
        let a1 = add_job(&spec, "a", 31).unwrap().cgroup_path;
        let a2 = add_job(&spec, "a", 32).unwrap().cgroup_path;
        let b1 = add_job(&spec, "b", 33).unwrap().cgroup_path;
        let (a, a2, b) = (Some(a1.as_path()), Some(a2.as_path()), Some(b1.as_path()));
        use Outcome::*;
        let case =
            |name, recv, send, send_cg, want| Dgram::to_job(a, name, recv, send, send_cg, want);
        let before = drops(&spec, "b");
        let failures = run_dgram_cases(&[
            case(
                "b->a udplite lo",
                "dgram-recv udplite 0.0.0.0:5101",
                "dgram-send udplite 127.0.0.1:5101",
                b,
                (Timeout, Denied),
            ),
            case(
                "b->a udplite node addr",
                "dgram-recv udplite 0.0.0.0:5102",
                "dgram-send udplite 10.77.0.1:5102",
                b,
                (Timeout, Denied),
            ),
            case(
                "b->a udplite ::1",
                "dgram-recv udplite [::]:5103",
                "dgram-send udplite [::1]:5103",
                b,
                (Timeout, Denied),
            ),
            // controls: the probe and the protocol work; UDP still goes through the input hook
            case(
                "root->a udplite lo",
                "dgram-recv udplite 0.0.0.0:5104",
                "dgram-send udplite 127.0.0.1:5104",
                None,
                (Ok, Ok),
            ),
            case(
                "a->a udp lo",
                "dgram-recv udp 0.0.0.0:5105",
                "dgram-send udp 127.0.0.1:5105",
                a2,
                (Ok, Ok),
            ),
            case(
                "b->a udp lo (dropped at input)",
                "dgram-recv udp 0.0.0.0:5106",
                "dgram-send udp 127.0.0.1:5106",
                b,
                (Timeout, Ok),
            ),
        ]);
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        assert!(drops(&spec, "b") >= before + 9, "drop_b");
    });
}

/// The kernel hands a broadcast or multicast datagram to every socket bound to the port, while
/// the input hook judges only the one socket its lookup finds (here b's own sender, bound to
/// the port after a's receiver): a job may send neither, even where its egress list covers the
/// address (b's here: the node's subnet and a multicast range).
#[test]
fn broadcast_and_multicast_from_a_job_are_denied() {
    let Some((node, _remote, _tree, mut spec)) = isolated_node("tnw2n", "tnw2r") else {
        return;
    };
    spec.tenants[1].egress = vec![
        Dest::parse("10.77.0.0/24").unwrap(),
        Dest::parse("239.0.0.0/8").unwrap(),
    ];
    in_netns(&node, move || {
        apply(&spec).unwrap();
        let a1 = add_job(&spec, "a", 41).unwrap().cgroup_path;
        let b1 = add_job(&spec, "b", 42).unwrap().cgroup_path;
        let (a, b) = (Some(a1.as_path()), Some(b1.as_path()));
        use Outcome::*;
        let case =
            |name, recv, send, send_cg, want| Dgram::to_job(a, name, recv, send, send_cg, want);
        let failures = run_dgram_cases(&[
            case(
                "b->a subnet broadcast, b bound to the port",
                "dgram-recv udp 0.0.0.0:5201 reuse",
                "dgram-send udp 10.77.0.255:5201 bind=0.0.0.0:5201",
                b,
                (Timeout, Denied),
            ),
            case(
                "b->a multicast, b bound to the port",
                "dgram-recv udp 0.0.0.0:5202 reuse join=239.7.7.7@10.77.0.1",
                "dgram-send udp 239.7.7.7:5202 bind=0.0.0.0:5202",
                b,
                (Timeout, Denied),
            ),
            // controls: a non-job process reaches the same receivers the same way
            case(
                "root->a subnet broadcast",
                "dgram-recv udp 0.0.0.0:5203 reuse",
                "dgram-send udp 10.77.0.255:5203 bind=0.0.0.0:5203",
                None,
                (Ok, Ok),
            ),
            case(
                "root->a multicast",
                "dgram-recv udp 0.0.0.0:5204 reuse join=239.7.7.7@10.77.0.1",
                "dgram-send udp 239.7.7.7:5204 bind=0.0.0.0:5204",
                None,
                (Ok, Ok),
            ),
        ]);
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    });
}

/// A connection a job opens to a node-local socket that is no tenant job's (a daemon, root's
/// listener) is judged by the tenant's egress and infrastructure lists at input, like one to
/// another host; connections between jobs of a tenant and from outside to a job still work.
#[test]
fn node_local_services_are_reached_only_through_the_egress_list() {
    if !requires_root("nft tables in a network namespace and cgroup v2 jobs") {
        return;
    }
    let (node, remote) = topology("tnw3n", "tnw3r");
    // Node addresses inside a's egress CIDR and inside the infrastructure CIDR.
    node.ip(&["addr", "add", "10.77.1.1/32", "dev", "lo"]);
    node.ip(&["addr", "add", "10.77.3.1/32", "dev", "lo"]);
    let tree = CgroupTree::new("tnw-test-");
    let spec = spec(&tree);
    let remote = in_netns(&node, move || {
        let mut procs = Procs::default();
        apply(&spec).unwrap();
        let a1 = add_job(&spec, "a", 51).unwrap().cgroup_path;
        let a2 = add_job(&spec, "a", 52).unwrap().cgroup_path;
        let b1 = add_job(&spec, "b", 53).unwrap().cgroup_path;
        // Node daemons (root, outside any tenant cgroup) on every local address.
        start_listener(&mut procs, "tcp-listen [::]:7001", None, None);
        start_listener(&mut procs, "udp-listen 0.0.0.0:7302", None, None);
        start_listener(&mut procs, "tcp-listen 0.0.0.0:5301", Some(&a1), None);
        let (a, b) = (Some(a2.as_path()), Some(b1.as_path()));
        use Outcome::*;
        let before = drops(&spec, "a");
        let mut failures = client_failures(&[
            ("a->daemon lo", a, "tcp 127.0.0.1:7001", Timeout),
            ("a->daemon node addr", a, "tcp 10.77.0.1:7001", Timeout),
            ("a->daemon ::1", a, "tcp [::1]:7001", Timeout),
            ("a->daemon lo udp", a, "udp 127.0.0.1:7302", Timeout),
            ("b->daemon lo", b, "tcp 127.0.0.1:7001", Timeout),
            ("b->daemon in a's egress", b, "tcp 10.77.1.1:7001", Timeout),
            // allowed by the lists
            ("a->daemon in a's egress", a, "tcp 10.77.1.1:7001", Ok),
            ("a->daemon in infrastructure", a, "tcp 10.77.3.1:7001", Ok),
            (
                "b->daemon in infrastructure udp",
                b,
                "udp 10.77.3.1:7302",
                Ok,
            ),
            // unchanged: same tenant, non-job processes
            ("a->a node addr", a, "tcp 10.77.0.1:5301", Ok),
            ("root->daemon lo", None, "tcp 127.0.0.1:7001", Ok),
            ("root->a lo", None, "tcp 127.0.0.1:5301", Ok),
        ]);
        // A remote host opens a connection to a job's listener (its handshake's last ACK
        // meets a request socket, whose cgroup the lookup cannot read).
        let got = client_in("tcp 10.77.0.1:5301", None, Some(&remote));
        if got != Ok {
            failures.push(format!("remote->a listener: got {got:?}, want Ok"));
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        assert!(drops(&spec, "a") >= before + 4, "drop_a");
        drop(procs);
        remote
    });
    drop(remote);
}

/// A flow that a remote host or a non-job process opened (here datagrams to a port where
/// nothing listened yet) is no way out for a job that binds that port later: replies leave a
/// job only on flows of its own tenant. A host that reaches a job's socket still gets answers.
#[test]
fn a_flow_opened_from_outside_is_no_way_out_for_a_job() {
    let Some((node, remote, _tree, spec)) = isolated_node("tnw4n", "tnw4r") else {
        return;
    };
    let remote = in_netns(&node, move || {
        let mut procs = Procs::default();
        apply(&spec).unwrap();
        let a1 = add_job(&spec, "a", 61).unwrap().cgroup_path;
        let a2 = add_job(&spec, "a", 62).unwrap().cgroup_path;
        let a = Some(a2.as_path());
        use Outcome::*;
        // 10.77.2.2 is in no list of a's; nothing listens on 6402 / 6406 when the seeds come.
        let failures = run_dgram_cases(&[
            Dgram {
                name: "remote seeds node:6402, then a replies from 6402",
                recv: "dgram-recv udp 10.77.2.2:6401 seed=10.77.0.1:6402",
                recv_cg: None,
                recv_ns: Some(&remote),
                send: "dgram-send udp 10.77.2.2:6401 bind=0.0.0.0:6402",
                send_cg: a,
                want: (Timeout, Denied),
            },
            Dgram {
                name: "root seeds 127.0.0.1:6406, then a replies from 6406",
                recv: "dgram-recv udp 127.0.0.1:6405 seed=127.0.0.1:6406",
                recv_cg: None,
                recv_ns: None,
                send: "dgram-send udp 127.0.0.1:6405 bind=127.0.0.1:6406",
                send_cg: a,
                want: (Timeout, Denied),
            },
        ]);
        // Inbound to a job's sockets: the job's answers go back (the flow carries a's mark).
        start_listener(&mut procs, "udp-listen 0.0.0.0:6403", Some(&a1), None);
        start_listener(&mut procs, "tcp-listen 0.0.0.0:6404", Some(&a1), None);
        let mut failures = failures;
        for (args, ns) in [
            ("udp 10.77.0.1:6403", Some(&remote)),
            ("tcp 10.77.0.1:6404", Some(&remote)),
            ("udp 127.0.0.1:6403", None),
            ("tcp 127.0.0.1:6404", None),
        ] {
            let got = client_in(args, None, ns);
            if got != Ok {
                failures.push(format!(
                    "{args} from {ns:?}: got {got:?}, want Ok",
                    ns = ns.map(|n| &n.name)
                ));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        drop(procs);
        remote
    });
    drop(remote);
}

/// A pure cgroup v2 node with Slurm's cgroup/v2 plugin (`FirewallSpec::slurm`): jobs are keyed
/// by Slurm's job folder (`<scope>/job_<id>`), their processes stay in Slurm's step and task
/// folders below it, and the tenant rules hold as on the product's own tree. A replaced table
/// (`firewall apply`) keeps the running jobs' elements. Slurm cannot remove the job folder
/// while its keeper is in it; the epilog deletes the elements by cgroup id, then the keeper
/// and the folder, and the table stays loadable.
#[test]
fn anchored_jobs_are_keyed_by_slurms_job_folder() {
    if !requires_root("nft tables in a network namespace and Slurm-like cgroup v2 jobs") {
        return;
    }
    let node = Netns::new("tnwa");
    let tree = CgroupTree::new("tnw-anch-");
    let mut spec = spec(&tree);
    // Job folders sit at level 3, as Slurm's: system.slice/<node>_slurmstepd.scope/job_<id>.
    let scope_rel = format!("system.slice/{}_slurmstepd.scope", spec.cgroup.subtree);
    std::fs::create_dir_all(spec.cgroup.v2_mount.join(&scope_rel)).unwrap();
    let scope = tenancy_network::SlurmScope {
        v2_mount: spec.cgroup.v2_mount.clone(),
        rel: scope_rel,
    };
    spec.slurm = Some(scope.clone());
    in_netns(&node, move || {
        let mut procs = Procs::default();
        apply(&spec).unwrap();
        let a = add_job(&spec, "a", 5).unwrap();
        let b = add_job(&spec, "b", 6).unwrap();
        assert_eq!(a.cgroup_path, scope.job_dir(5));
        assert!(a.cgroup_id.is_some());
        // Slurm's folders below the job: where its tasks and slurmstepd live.
        let task = |j: &tenancy_network::JobNet, n: u32| {
            let t = j.cgroup_path.join(format!("step_0/user/task_{n}"));
            std::fs::create_dir_all(&t).unwrap();
            t
        };
        let (a0, a1, b0) = (task(&a, 0), task(&a, 1), task(&b, 0));
        start_listener(&mut procs, "tcp-listen 0.0.0.0:5101", Some(&a0), None);
        start_listener(&mut procs, "udp-listen 0.0.0.0:5102", Some(&a0), None);
        use Outcome::*;
        let (in_a1, in_b0) = (Some(a1.as_path()), Some(b0.as_path()));
        let cases = [
            ("a->a tcp", in_a1, "tcp 127.0.0.1:5101", Ok),
            ("a->a udp", in_a1, "udp 127.0.0.1:5102", Ok),
            ("b->a tcp", in_b0, "tcp 127.0.0.1:5101", Timeout),
            ("b->a udp", in_b0, "udp 127.0.0.1:5102", Timeout),
        ];
        let failures = client_failures(&cases);
        assert!(failures.is_empty(), "jobs added: {}", failures.join("\n"));
        // `firewall apply` while the jobs run: the new table holds their elements.
        let running: Vec<_> = [&a, &b]
            .into_iter()
            .filter_map(tenancy_network::AnchoredJob::of)
            .collect();
        assert_eq!(
            tenancy_network::apply_keeping(&spec, &running).unwrap(),
            vec![5, 6]
        );
        let failures = client_failures(&cases);
        assert!(
            failures.is_empty(),
            "after firewall apply: {}",
            failures.join("\n")
        );
        drop(procs);
        // Slurm ends the job and removes its step folders; the job folder stays (its keeper),
        // and the epilog deletes the elements by id, then the keeper and the folder, twice.
        for d in [&a0, &a1] {
            let _ = std::fs::write(d.join("cgroup.kill"), "1");
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
        for d in [
            "step_0/user/task_0",
            "step_0/user/task_1",
            "step_0/user",
            "step_0",
        ] {
            std::fs::remove_dir(a.cgroup_path.join(d)).unwrap();
        }
        let busy = std::fs::remove_dir(&a.cgroup_path).unwrap_err();
        assert_eq!(busy.raw_os_error(), Some(libc::EBUSY), "{busy}");
        for _ in 0..2 {
            tenancy_network::remove_anchored_job(&spec, &scope, 5, a.cgroup_id).unwrap();
        }
        assert!(
            !a.cgroup_path.exists(),
            "the epilog left {}",
            a.cgroup_path.display()
        );
        tenancy_network::remove_anchored_job(&spec, &scope, 6, b.cgroup_id).unwrap();
        let maps = nft(&["list", "map", "inet", "tenancy", "jobs_out"]);
        assert!(!maps.contains("elements"), "{maps}");
        // Nothing left that names a removed cgroup: the table reloads.
        apply(&spec).unwrap();
        let b_task = b.cgroup_path.join("step_0/user/task_0");
        let _ = std::fs::write(b_task.join("cgroup.kill"), "1");
        std::thread::sleep(std::time::Duration::from_millis(100));
        for d in ["step_0/user/task_0", "step_0/user", "step_0", ""] {
            let _ = std::fs::remove_dir(b.cgroup_path.join(d));
        }
        let _ = std::fs::remove_dir(scope.dir());
    });
}
