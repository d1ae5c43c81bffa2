//! Root integration tests: real nft tables in private network namespaces, real cgroup v2
//! job directories, real TCP/UDP probes placed in them (as uid 65534 for both tenants).
//! Only addresses inside the namespaces created here are used.

mod common;

use std::process::Command;

use common::*;
use tenancy_network::{add_job, apply, counters, remove_job, Dest, Error, FirewallSpec, TenantNet};

/// Probe entry point: this binary re-executed with TNW_PROBE set acts as a listener/client.
#[test]
fn zz_probe_helper() {
    if let Ok(spec) = std::env::var(PROBE_ENV) {
        probe_main(&spec);
    }
}

fn spec(tree: &CgroupTree) -> FirewallSpec {
    FirewallSpec {
        table_name: "tenancy".into(),
        cgroup: tree.layout.clone(),
        tenants: vec![
            TenantNet {
                name: "a".into(),
                id: 1,
                egress: vec![Dest::parse("10.77.1.0/24:7001/tcp").unwrap()],
            },
            TenantNet {
                name: "b".into(),
                id: 2,
                egress: vec![],
            },
        ],
        infrastructure: vec![Dest::parse("10.77.3.0/24").unwrap()],
    }
}

fn drops(spec: &FirewallSpec, tenant: &str) -> u64 {
    counters(spec)
        .unwrap()
        .into_iter()
        .find(|c| c.tenant == tenant)
        .unwrap()
        .packets
}

#[test]
fn tenants_are_isolated_and_egress_is_filtered() {
    if !need_root("nft tables in a network namespace and cgroup v2 jobs") {
        return;
    }
    // Node namespace N (firewall loaded here) and "remote host" R on a veth pair.
    let node = Netns::new("tnwn");
    let remote = Netns::new("tnwr");
    let (v0, v1) = (unique("tv"), unique("tv"));
    node.ip(&[
        "link",
        "add",
        &v0,
        "type",
        "veth",
        "peer",
        "name",
        &v1,
        "netns",
        &remote.name,
    ]);
    node.ip(&["addr", "add", "10.77.0.1/24", "dev", &v0]);
    node.ip(&["link", "set", &v0, "up"]);
    node.ip(&["route", "add", "10.77.0.0/16", "dev", &v0]);
    for a in ["10.77.1.2/24", "10.77.2.2/24", "10.77.3.2/24"] {
        remote.ip(&["addr", "add", a, "dev", &v1]);
    }
    remote.ip(&["link", "set", &v1, "up"]);
    remote.ip(&["route", "add", "10.77.0.0/24", "dev", &v1]);

    let tree = CgroupTree::new("tnw-test-");
    let spec = spec(&tree);
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
        let cases: Vec<(&str, Option<&std::path::Path>, &str, Outcome)> = vec![
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
        ];
        let mut failures = Vec::new();
        let before_b = drops(&spec, "b");
        for (name, cg, args, want) in &cases {
            let got = client(args, *cg);
            if got != *want {
                failures.push(format!("{name}: {args}: got {got:?}, want {want:?}"));
            }
        }
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
        let mut child = Command::new("nft")
            .args(["-f", "-"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(saved.as_bytes())
            .unwrap();
        assert!(
            child.wait().unwrap().success(),
            "reload of saved ruleset failed"
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
    if !need_root("nft tables in a network namespace and cgroup v2 jobs") {
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
