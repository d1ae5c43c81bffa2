//! Tenant isolation across nodes (ARCHITECTURE.md, "Across nodes: tenant identity on the
//! wire"), on a two-node Slurm cluster on this machine (src/multi_node.rs: each node a
//! network, UTS and mount namespace with its own slurmd, joined by a bridge in a namespace of
//! the test's own), with the whole product on every node: real Slurm, munge, nftables in each
//! node's namespace, real users and cgroups. Needs root; skips loudly otherwise.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tenancy_e2e::multi_node::{without_cross_node, NODE_NETWORK};
use tenancy_e2e::steer::{port_rewrite, REWRITE_PORT_ENV};
use tenancy_e2e::{probe_kv, scenario, MultiNode, Options, TenancyToml, TestUser, Users};

const JOB: Duration = Duration::from_secs(120);

/// The tenants' egress: acme's, globex's.
fn egress(acme: &'static [&str], globex: &'static [&str]) -> Options {
    Options::default().config(move |c: &mut TenancyToml| {
        c.tenant("acme").egress(acme);
        c.tenant("globex").egress(globex);
    })
}

/// A folder of `user`'s that every node sees.
fn user_folder(mn: &MultiNode, user: &TestUser, name: &str) -> PathBuf {
    let d = mn.user_dir(user).join(name);
    fs::create_dir_all(&d).unwrap();
    nix::unistd::chown(
        &d,
        Some(nix::unistd::Uid::from_raw(user.uid)),
        Some(nix::unistd::Gid::from_raw(user.gid)),
    )
    .unwrap();
    d
}

fn kv(path: &Path) -> BTreeMap<String, String> {
    probe_kv(&fs::read_to_string(path).unwrap_or_default())
}

/// A job of `tenant` on both nodes serving TCP and UDP on `port` until `dir/stop` exists;
/// returns once both listeners are up.
fn serve_job(mn: &MultiNode, user: &TestUser, tenant: &str, port: u16, dir: &Path) -> u64 {
    let (port, stop, d) = (
        port.to_string(),
        dir.join("stop"),
        dir.display().to_string(),
    );
    let id = mn
        .sbatch(
            user,
            tenant,
            &[],
            &["serve", &port, stop.to_str().unwrap(), &d],
        )
        .expect("sbatch serve");
    for n in ["n1", "n2"] {
        mn.wait_file_line(
            &dir.join(format!("serve-{n}.txt")),
            "listening=",
            Duration::from_secs(60),
        )
        .unwrap_or_else(|e| panic!("{tenant}'s listener on {n}: {e}; job {:?}", mn.job_info(id)));
    }
    id
}

/// A job of `tenant` on both nodes probing, from node n<i>, the targets `targets(i)`
/// (`name=host[@bind];...`) on `port`; returns each node's results.
fn probe_job(
    mn: &MultiNode,
    user: &TestUser,
    tenant: &str,
    port: u16,
    dir: &Path,
    targets: impl Fn(usize) -> String,
) -> Vec<BTreeMap<String, String>> {
    let env = [("TARGETS_n1", targets(0)), ("TARGETS_n2", targets(1))];
    let (d, port) = (dir.display().to_string(), port.to_string());
    let id = mn
        .sbatch(user, tenant, &env, &["probe", &d, &port])
        .expect("sbatch probe");
    let info = mn.wait_job_done(id, JOB).unwrap();
    assert_eq!(info["JobState"], "COMPLETED", "probe job: {info:?}");
    ["n1", "n2"]
        .iter()
        .map(|n| {
            let r = kv(&dir.join(format!("probe-{id}-{n}.txt")));
            assert_eq!(r.get("done").map(String::as_str), Some("1"), "{n}: {r:?}");
            r
        })
        .collect()
}

/// Sources the listeners of `dir` logged (`tcp_from`/`udp_from` lines of both nodes).
fn sources(dir: &Path) -> Vec<String> {
    ["n1", "n2"]
        .iter()
        .flat_map(|n| {
            fs::read_to_string(dir.join(format!("serve-{n}.txt")))
                .unwrap_or_default()
                .lines()
                .filter(|l| l.starts_with("tcp_from=") || l.starts_with("udp_from="))
                .map(|l| format!("{n}:{l}"))
                .collect::<Vec<_>>()
        })
        .collect()
}

fn end_job(mn: &MultiNode, dir: &Path, id: u64) {
    fs::write(dir.join("stop"), "").unwrap();
    let info = mn.wait_job_done(id, JOB).unwrap();
    assert_eq!(info["JobState"], "COMPLETED", "{info:?}");
}

fn other(i: usize) -> usize {
    1 - i
}

// acme's egress lists the node network (its MPI finds peers by host name); globex's lists
// nothing: its tasks reach each other through its own addresses alone.
scenario!(
    multi_node_job_reaches_its_own_tasks,
    egress(&[NODE_NETWORK], &[]),
    |mn: &mut MultiNode| {
        // `tenancyctl doctor` on each node finds its address and the tenants' addresses.
        for i in 0..2 {
            let mut c = mn.node_cmd(i, tenancy_e2e::artifact("tenancyctl").unwrap());
            c.arg("--config")
                .arg(&mn.tenancy_toml)
                .args(["doctor", "--format", "json"]);
            let o = c.output().unwrap();
            let text = String::from_utf8_lossy(&o.stdout);
            let rows: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
            let row = rows
                .as_array()
                .into_iter()
                .flatten()
                .find(|r| r["check"] == "firewall.cross_node")
                .unwrap_or_else(|| panic!("no firewall.cross_node check: {text}"));
            assert_eq!(row["severity"], "ok", "{row}");
            assert!(
                row["message"]
                    .as_str()
                    .unwrap()
                    .contains(&mn.nodes[i].addr()),
                "{row}"
            );
        }
        for (user, tenant, barrier) in [
            (mn.tenants.acme1.clone(), "acme", "name"),
            (mn.tenants.globex1.clone(), "globex", "addr"),
        ] {
            let dir = user_folder(mn, &user, &format!("a2a-{tenant}"));
            let peers: Vec<String> = mn
                .nodes
                .iter()
                .map(|n| format!("{}={}", n.name, n.tenant_addr(tenant)))
                .collect();
            let env = [("PEERS", peers.join(",")), ("BARRIER", barrier.to_string())];
            let d = dir.display().to_string();
            let id = mn
                .sbatch(&user, tenant, &env, &["alltoall", "7301", &d])
                .unwrap();
            let info = mn.wait_job_done(id, JOB).unwrap();
            assert_eq!(info["JobState"], "COMPLETED", "{tenant}: {info:?}");
            for (i, n) in mn.nodes.iter().enumerate() {
                let peer = &mn.nodes[other(i)];
                let r = kv(&dir.join(format!("alltoall-{}.txt", n.name)));
                let want = format!("ok {tenant}@{}", peer.name);
                for via in ["addr.tcp", "addr.udp"] {
                    let got = &r[&format!("{}.{via}", peer.name)];
                    assert_eq!(
                        got, &want,
                        "{tenant}: {} -> {} by {via}: {r:?}",
                        n.name, peer.name
                    );
                }
                for via in ["name.tcp", "name.udp"] {
                    let got = &r[&format!("{}.{via}", peer.name)];
                    if tenant == "acme" {
                        assert_eq!(
                            got, &want,
                            "acme: {} -> {} by {via}: {r:?}",
                            n.name, peer.name
                        );
                    } else {
                        // The node network is not in globex's egress: dropped at the sender.
                        assert!(
                            !got.starts_with("ok"),
                            "globex by {via} without egress: {r:?}"
                        );
                    }
                }
            }
            // Every connection and datagram between the nodes came from the tenant's addresses
            // (the cross-node SNAT), never from a node's own address.
            let src = sources(&dir);
            assert!(!src.is_empty());
            let prefix = mn.nodes[0].tenant_addr(tenant);
            let prefix = &prefix[..prefix.rfind('.').unwrap() + 1];
            for s in &src {
                assert!(
                    s.split('=').nth(1).unwrap().starts_with(prefix),
                    "{tenant}: a peer's source outside {prefix}*: {src:?}"
                );
            }
            eprintln!("{tenant}: all-to-all over TCP and UDP between n1 and n2: {src:?}");
        }
    }
);

// Both tenants may reach the node network (multi-node jobs by host name): the rules that tell
// them apart are the cross-node ones.
scenario!(
    other_tenant_cannot_reach_a_job_on_another_node,
    egress(&[NODE_NETWORK], &[NODE_NETWORK]),
    |mn: &mut MultiNode| {
        let (acme1, globex1) = (mn.tenants.acme1.clone(), mn.tenants.globex1.clone());
        for (server, s_tenant, client, c_tenant, port) in [
            (&globex1, "globex", &acme1, "acme", 7302u16),
            (&acme1, "acme", &globex1, "globex", 7303),
        ] {
            let sdir = user_folder(mn, server, &format!("serve-{s_tenant}"));
            let pdir = user_folder(mn, client, &format!("probe-{c_tenant}"));
            // sbatch -N2 jobs of the two tenants on the same two nodes.
            let sid = serve_job(mn, server, s_tenant, port, &sdir);
            // Control: a process outside every job on n1 reaches the listener on n2.
            let mut c = mn.node_cmd(0, "/usr/bin/python3");
            c.arg(mn.net_task())
                .args(["probe", pdir.to_str().unwrap(), &port.to_string()])
                .env("TARGETS_n1", "control=n2");
            assert!(c.status().unwrap().success());
            let control = kv(&pdir.join("probe-x-n1.txt"));
            assert!(control["control.tcp"].starts_with("ok"), "{control:?}");
            let drops_before: Vec<u64> = (0..2).map(|i| mn.drops(i, c_tenant).unwrap()).collect();
            let results = probe_job(mn, client, c_tenant, port, &pdir, |i| {
                let (me, peer) = (&mn.nodes[i], &mn.nodes[other(i)]);
                format!(
                    "name={};server_addr={};own_addr={};same_node={}",
                    peer.name,
                    peer.tenant_addr(s_tenant),
                    peer.tenant_addr(c_tenant),
                    me.addr()
                )
            });
            for (i, r) in results.iter().enumerate() {
                for (k, v) in r {
                    assert!(
                        !v.starts_with("ok"),
                        "{c_tenant}'s job on n{} reached {s_tenant}'s job: {k}={v} ({r:?})",
                        i + 1
                    );
                }
            }
            let src = sources(&sdir);
            assert!(
                src.iter().all(|s| s.ends_with("=10.231.0.1")),
                "{s_tenant}'s listeners heard from {c_tenant}: {src:?}"
            );
            let drops_after: Vec<u64> = (0..2).map(|i| mn.drops(i, c_tenant).unwrap()).collect();
            assert!(
                (0..2).all(|i| drops_after[i] > drops_before[i]),
                "{c_tenant}'s drop counters on n1, n2: {drops_before:?} -> {drops_after:?}"
            );
            eprintln!(
            "{c_tenant} -> {s_tenant} across nodes: {results:?}; drops {drops_before:?} -> {drops_after:?}"
        );
            end_job(mn, &sdir, sid);
        }
    }
);

scenario!(
    spoofed_source_address_is_dropped,
    egress(&[NODE_NETWORK], &[NODE_NETWORK]),
    |mn: &mut MultiNode| {
        let (acme1, globex1) = (mn.tenants.acme1.clone(), mn.tenants.globex1.clone());
        let sdir = user_folder(mn, &globex1, "serve");
        let pdir = user_folder(mn, &acme1, "probe");
        let sid = serve_job(mn, &globex1, "globex", 7304, &sdir);
        let drops_before: Vec<u64> = (0..2).map(|i| mn.drops(i, "acme").unwrap()).collect();
        // acme's job binds globex's address of its own node (a local address: bind succeeds) and
        // talks to globex's job on the other node, by node address and by globex's address there.
        let results = probe_job(mn, &acme1, "acme", 7304, &pdir, |i| {
            let (me, peer) = (&mn.nodes[i], &mn.nodes[other(i)]);
            let spoof = me.tenant_addr("globex");
            format!(
                "by_name={}@{spoof};by_addr={}@{spoof}",
                peer.name,
                peer.tenant_addr("globex")
            )
        });
        for (i, r) in results.iter().enumerate() {
            for (k, v) in r.iter().filter(|(k, _)| *k != "done") {
                assert!(
                    !v.starts_with("ok"),
                    "n{}: spoof got through: {k}={v}",
                    i + 1
                );
            }
            // Dropped at the sender: the kernel hands the drop of a datagram back to the socket.
            assert_eq!(r["by_name.udp"], "EPERM", "n{}: {r:?}", i + 1);
        }
        let drops_after: Vec<u64> = (0..2).map(|i| mn.drops(i, "acme").unwrap()).collect();
        assert!(
            (0..2).all(|i| drops_after[i] > drops_before[i]),
            "acme's drops at the senders: {drops_before:?} -> {drops_after:?}"
        );
        // A process of acme's user outside every job on n1, bound to globex's address there: its
        // flow leaves from the node's own address (processes outside jobs are no tenant's), so
        // globex's job hears the node, never globex.
        let mut c = mn.node_cmd_as(0, &acme1, "/usr/bin/python3");
        c.arg(mn.net_task())
            .args(["probe", pdir.to_str().unwrap(), "7304"])
            .env(
                "TARGETS_n1",
                format!("spoof=n2@{};plain=n2", mn.nodes[0].tenant_addr("globex")),
            );
        assert!(c.status().unwrap().success());
        let r = kv(&pdir.join("probe-x-n1.txt"));
        assert!(r["spoof.tcp"].starts_with("ok"), "{r:?}");
        assert!(r["plain.tcp"].starts_with("ok"), "{r:?}");
        let src = sources(&sdir);
        assert!(
            src.iter().all(|s| s.ends_with("=10.231.0.1")),
            "globex's listeners heard a spoofed source: {src:?}"
        );
        eprintln!(
            "spoofs: {results:?}; outside jobs: {r:?}; drops {drops_before:?} -> {drops_after:?}"
        );
        end_job(mn, &sdir, sid);
    }
);

scenario!(
    egress_listing_the_compute_network_does_not_open_other_tenants,
    Options::default(),
    |users: &mut Users| {
        for cross_node in [true, false] {
            let mut options = egress(&[NODE_NETWORK], &[]);
            if !cross_node {
                options = options.config(without_cross_node);
            }
            let mn = MultiNode::start(users, &options).expect("multi-node cluster");
            let mn = &mn;
            let (acme1, globex1) = (mn.tenants.acme1.clone(), mn.tenants.globex1.clone());
            let sdir = user_folder(mn, &globex1, "serve");
            let pdir = user_folder(mn, &acme1, "probe");
            let sid = serve_job(mn, &globex1, "globex", 7306, &sdir);
            // A daemon of the node (root, outside every job) on n2 and n1: acme's egress opens it.
            let ddir = mn.path("jobs/daemon");
            fs::create_dir_all(&ddir).unwrap();
            let mut daemons = Vec::new();
            for i in 0..2 {
                let mut c = mn.node_cmd(i, "/usr/bin/python3");
                c.arg(mn.net_task()).args([
                    "serve",
                    "7307",
                    ddir.join("stop").to_str().unwrap(),
                    ddir.to_str().unwrap(),
                ]);
                daemons.push(c.spawn().unwrap());
            }
            for n in ["n1", "n2"] {
                mn.wait_file_line(
                    &ddir.join(format!("serve-{n}.txt")),
                    "listening=",
                    Duration::from_secs(20),
                )
                .unwrap();
            }
            let results = probe_job(mn, &acme1, "acme", 7306, &pdir, |i| {
                let peer = &mn.nodes[other(i)];
                format!(
                    "globex_by_name={};globex_by_node_addr={}",
                    peer.name,
                    peer.addr()
                )
            });
            // The node's daemon on port 7307, through the same egress entry.
            let dresults = probe_job(mn, &acme1, "acme", 7307, &pdir, |i| {
                format!("daemon={}", mn.nodes[other(i)].name)
            });
            fs::write(ddir.join("stop"), "").unwrap();
            for mut d in daemons {
                let _ = d.wait();
            }
            for r in &dresults {
                assert!(
                    r["daemon.tcp"].starts_with("ok"),
                    "egress to the node network: {r:?}"
                );
            }
            for (i, r) in results.iter().enumerate() {
                for (k, v) in r.iter().filter(|(k, _)| *k != "done") {
                    if cross_node {
                        assert!(
                            !v.starts_with("ok"),
                            "n{}: acme reached globex's job through its egress: {k}={v}",
                            i + 1
                        );
                    } else {
                        // Today's rules (no node_network): the egress entry opens globex's jobs
                        // on the other node, the gap the cross-node rules close.
                        assert!(
                            v.starts_with("ok"),
                            "without cross-node rules: {k}={v} ({r:?})"
                        );
                    }
                }
            }
            eprintln!(
            "cross_node={cross_node}: acme -> globex: {results:?}; acme -> node daemon: {dresults:?}"
        );
            end_job(mn, &sdir, sid);
        }
    }
);

// globex's user, on node n1 outside every job, runs a step of globex's job on n2 with srun
// reporting acme's port as its own (the LD_PRELOAD port rewrite): slurmstepd on n2 connects
// its I/O and launch response to n1's address at that port, where acme's job listens. The
// flow is globex's job's: it leaves n2 from globex's address, and n1 drops it for globex;
// acme's listener hears nothing. acme's own srun steered the same way reaches acme's
// listener on n1, from acme's address on n2.
scenario!(
    slurmstepd_relay_across_nodes_is_dropped,
    Options::default(),
    |mn: &mut MultiNode| {
        let (acme1, globex1) = (mn.tenants.acme1.clone(), mn.tenants.globex1.clone());
        let port = 7320u16;
        let a_dir = user_folder(mn, &acme1, "relay-serve");
        let a = serve_job(mn, &acme1, "acme", port, &a_dir);
        // globex's job on both nodes (its own listeners, on another port: step 0).
        let g_dir = user_folder(mn, &globex1, "relay-target");
        let g = serve_job(mn, &globex1, "globex", port + 1, &g_dir);
        // Step 1 of `job` (step 0 is its listeners), on n2, from n1, its ports reported as
        // acme's.
        let steered = |user: &TestUser, job: u64, what: &str| {
            let so = port_rewrite(&mn.user_dir(user), user).unwrap();
            let mut c = mn.node_cmd_as(0, user, "timeout");
            c.args([
                "30",
                "srun",
                &format!("--jobid={job}"),
                "--overlap",
                "-N1",
                "-n1",
            ])
            .args(["-w", "n2", "echo", what])
            .env("LD_PRELOAD", so)
            .env(REWRITE_PORT_ENV, port.to_string())
            .current_dir(mn.user_dir(user));
            let o = c.output().unwrap();
            // Everything the step's slurmstepd on n2 tried is over once it is done.
            let log = mn.path("log/slurmd-n2.log");
            let done = format!("[{job}.1] done with job");
            let t = std::time::Instant::now();
            while !fs::read_to_string(&log).unwrap_or_default().contains(&done) {
                assert!(t.elapsed() < JOB, "no {done:?} in {}", log.display());
                std::thread::sleep(Duration::from_millis(200));
            }
            o
        };
        let heard_on_n1 = || -> Vec<String> {
            sources(&a_dir)
                .into_iter()
                .filter(|s| s.starts_with("n1:tcp_from="))
                .collect()
        };
        let before = mn.drops(0, "globex").unwrap();
        let o = steered(&globex1, g, "globex-secret");
        let heard = heard_on_n1();
        assert!(
            heard.is_empty(),
            "slurmstepd of globex's step on n2 reached acme's listener on n1: {heard:?}; srun: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let after = mn.drops(0, "globex").unwrap();
        assert!(
            after > before,
            "n1 did not count the relay for globex: {before} -> {after}"
        );
        // Control: the same steering into acme's own job gets there, as acme.
        let _ = steered(&acme1, a, "acme-own");
        let heard = heard_on_n1();
        let acme_n2 = mn.nodes[1].tenant_addr("acme");
        assert!(
            heard.iter().any(|s| s.ends_with(&format!("={acme_n2}"))),
            "control: acme's steered step on n2 did not reach acme's listener on n1 from \
             {acme_n2}: {heard:?}"
        );
        end_job(mn, &g_dir, g);
        end_job(mn, &a_dir, a);
    }
);
