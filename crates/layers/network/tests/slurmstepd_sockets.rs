//! Root integration test of slurmstepd's own sockets (src/stepd.rs): the socket program on the
//! cgroup2 root marks the sockets of root threads named `slurmstepd`, and the table judges
//! them as their job's (the tenant's ct mark, dropped at another tenant's job and counted for
//! the sender) while letting them reach the srun, sattach or salloc that asked, wherever it
//! listens, with no egress or infrastructure entry. The same connections from the job's code
//! (the user's uid, whatever it calls itself) or from another root process in the job are the
//! job's code's. Real nft tables in private network namespaces, real cgroup v2 job folders.

mod common;

use common::*;
use tenancy_network::{add_job, apply, stepd, FirewallSpec, TenantNet};

/// Probe entry point: this binary re-executed with TNW_PROBE set acts as a listener/client.
#[test]
fn zz_probe_helper() {
    if let Ok(spec) = std::env::var(PROBE_ENV) {
        probe_main(&spec);
    }
}

/// (name, job cgroup, uid (None: root), command name, probe, outcome wanted).
type Case<'a> = (
    &'a str,
    Option<&'a std::path::Path>,
    Option<u32>,
    &'a str,
    &'a str,
    Outcome,
);

#[test]
fn slurmstepd_sockets_are_judged_as_their_jobs() {
    if !requires_root("nft tables in a network namespace, cgroup v2 jobs, a cgroup socket program")
    {
        return;
    }
    // The node (10.78.0.1) and a login host on a veth pair (10.78.9.2, in no list).
    let node = Netns::new("tnsn");
    let login = Netns::new("tnsl");
    let (v0, v1) = (unique("ts"), unique("ts"));
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
        &login.name,
    ]);
    node.ip(&["addr", "add", "10.78.0.1/16", "dev", &v0]);
    node.ip(&["link", "set", &v0, "up"]);
    login.ip(&["addr", "add", "10.78.9.2/16", "dev", &v1]);
    login.ip(&["link", "set", &v1, "up"]);
    let tree = CgroupTree::new("tnw-stepd-");
    let spec = FirewallSpec {
        table_name: "tenancy".into(),
        cgroup: tree.layout.clone(),
        tenants: vec![
            TenantNet {
                name: "a".into(),
                id: 1,
                egress: vec![],
            },
            TenantNet {
                name: "b".into(),
                id: 2,
                egress: vec![],
            },
        ],
        infrastructure: vec![],
        slurm: None,
        cross_node: None,
    };
    let mut procs = Procs::default();
    // srun on the login host (the stepd's I/O connection goes to its port).
    start_listener(&mut procs, "tcp-listen 10.78.9.2:7103", None, Some(&login));
    in_netns(&node, move || {
        let mut procs = procs;
        apply(&spec).unwrap();
        let root = spec.cgroup.v2_mount.clone();
        let id = stepd::attached(&root).unwrap().unwrap_or_else(|| {
            panic!(
                "firewall apply attached no socket program on {}",
                root.display()
            )
        });
        // Applied again: the same program stays (no second one, no gap without the mark).
        apply(&spec).unwrap();
        assert_eq!(stepd::attach(&root).unwrap(), id);
        let a = add_job(&spec, "a", 31).unwrap().cgroup_path;
        let b = add_job(&spec, "b", 41).unwrap().cgroup_path;
        // srun on the node itself (outside every job), and a listener of tenant a's job.
        start_listener(&mut procs, "tcp-listen 0.0.0.0:7101", None, None);
        start_listener(&mut procs, "tcp-listen 0.0.0.0:7102", Some(&a), None);
        let (b, stepd_comm, user) = (Some(b.as_path()), "slurmstepd", Some(JOB_UID));
        use Outcome::*;
        let cases: Vec<Case> = vec![
            // b's slurmstepd: to srun wherever it is, never into another tenant's job
            (
                "b's stepd -> srun lo",
                b,
                None,
                stepd_comm,
                "tcp 127.0.0.1:7101",
                Ok,
            ),
            (
                "b's stepd -> srun node addr",
                b,
                None,
                stepd_comm,
                "tcp 10.78.0.1:7101",
                Ok,
            ),
            (
                "b's stepd -> srun login host",
                b,
                None,
                stepd_comm,
                "tcp 10.78.9.2:7103",
                Ok,
            ),
            (
                "b's stepd -> a's job",
                b,
                None,
                stepd_comm,
                "tcp 127.0.0.1:7102",
                Timeout,
            ),
            (
                "b's stepd -> a's job, node addr",
                b,
                None,
                stepd_comm,
                "tcp 10.78.0.1:7102",
                Timeout,
            ),
            // b's code, even named slurmstepd, and root code in b's job that is not slurmstepd
            (
                "b's code -> srun lo",
                b,
                user,
                stepd_comm,
                "tcp 127.0.0.1:7101",
                Timeout,
            ),
            (
                "b's code -> login host",
                b,
                user,
                stepd_comm,
                "tcp 10.78.9.2:7103",
                Timeout,
            ),
            (
                "root in b -> login host",
                b,
                None,
                "python3",
                "tcp 10.78.9.2:7103",
                Timeout,
            ),
            (
                "root in b -> a's job",
                b,
                None,
                "python3",
                "tcp 127.0.0.1:7102",
                Timeout,
            ),
            // a slurmstepd in no job speaks for no tenant: never into a job
            (
                "unjoined stepd -> a's job",
                None,
                None,
                stepd_comm,
                "tcp 127.0.0.1:7102",
                Timeout,
            ),
            (
                "unjoined stepd -> srun",
                None,
                None,
                stepd_comm,
                "tcp 127.0.0.1:7101",
                Ok,
            ),
            // processes outside every job reach jobs, as before
            (
                "root outside jobs -> a's job",
                None,
                None,
                "python3",
                "tcp 127.0.0.1:7102",
                Ok,
            ),
        ];
        let before = drops(&spec, "b");
        let mut failures = Vec::new();
        for (name, cg, uid, comm, args, want) in &cases {
            let got = client_named(args, *cg, *uid, comm);
            if got != *want {
                failures.push(format!("{name}: {args}: got {got:?}, want {want:?}"));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        // b's attempts into a's job (its stepd's and its code's) are counted for b.
        let after = drops(&spec, "b");
        assert!(after >= before + 4, "drop_b {before} -> {after}");
        drop(procs);
    });
}
