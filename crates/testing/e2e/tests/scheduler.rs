//! The scheduler layer on real Slurm: tenant quotas as slurmdbd associations that slurmctld
//! enforces (MariaDB + slurmdbd, `tenancyctl slurm sync`), node pools kept by job_submit/tenancy,
//! `share_node = false` on MCS labels (two nodes in namespaces), and the submission paths that
//! never run the SPANK plugin: slurmrestd (auth/jwt) and scrontab. Needs root.

use serde_json::json;
use std::collections::BTreeMap;
use std::process::Output;
use std::time::{Duration, Instant};
use tenancy_e2e::rest::{jwt_conf, Rest};
use tenancy_e2e::{artifact, scenario, submitted_id, text, Accounting, Client, Env, MultiNode};
use tenancy_e2e::{Limits, Options, Stack, TenancyToml, TestUser, Users};
use tenancy_test_support::output_text;

fn tempdir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(prefix).tempdir().unwrap()
}

fn accounting() -> Accounting {
    Accounting {
        gpu_types: vec![("1g.18gb".into(), 7), ("3g.71gb".into(), 2)],
    }
}

/// acme may hold 2 GPUs, one of them a 1g.18gb slice, in 4 running jobs.
fn acme_limits(c: &mut TenancyToml) {
    c.tenant("acme").limits(
        Limits::default()
            .gpus(2)
            .mig_slices("1g.18gb", 1)
            .running_jobs(4),
    );
}

fn sync(e: &Env, apply: bool) -> String {
    let args: &[&str] = if apply {
        &["slurm", "sync", "--apply"]
    } else {
        &["slurm", "sync"]
    };
    let o = e.ctl(args);
    let out = output_text(&o);
    eprintln!("tenancyctl {}:\n{out}", args.join(" "));
    assert!(o.status.success(), "{out}");
    out
}

/// `sacctmgr show association` rows of the cluster: (account, user) -> (GrpTRES, GrpJobs).
fn associations(stack: &Stack) -> BTreeMap<(String, String), (BTreeMap<String, String>, String)> {
    let mut c = stack.cluster.cmd("sacctmgr");
    c.args([
        "-n",
        "-P",
        "show",
        "association",
        "format=account,user,grptres,grpjobs",
    ]);
    let o = stack.cluster.run(c).unwrap();
    assert!(o.status.success(), "{}", output_text(&o));
    text(&o.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            let tres = f
                .get(2)?
                .split(',')
                .filter_map(|i| i.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            Some(((f[0].into(), f[1].into()), (tres, f.get(3)?.to_string())))
        })
        .collect()
}

scenario!(
    slurm_sync_makes_tenant_associations_with_limits,
    Options::default().accounting(accounting()).config(|c| {
        acme_limits(c);
        c.tenant("globex")
            .limits(Limits::default().nodes(1).mig_slices("3g.71gb", 1));
        c.tier("regulated").require_limits(true);
    }),
    |e: &mut Env| {
        let t = e.t.clone();
        // doctor: globex's tier requires limits, and slurmdbd has none for it yet.
        let doctor = |want: &str| {
            let out = output_text(&e.ctl(&["doctor", "--format", "csv"]));
            let row = out
                .lines()
                .find(|l| l.starts_with("slurm.tenant_limits,"))
                .unwrap_or_else(|| panic!("no slurm.tenant_limits row: {out}"))
                .to_string();
            assert!(
                row.starts_with(&format!("slurm.tenant_limits,{want},")),
                "{row}"
            );
            row
        };
        let row = doctor("warn");
        assert!(
            row.contains("globex (tier regulated, account globex)"),
            "{row}"
        );
        let before = associations(&e.stack);
        let plan = sync(e, false);
        for want in [
            "+ add account acme under root (tenant acme, Organization=slurm-tenancy)".to_string(),
            "~ set on account acme: GrpTRES=gres/gpu=2,gres/gpu:1g.18gb=1 GrpJobs=4".into(),
            "~ set on account globex: GrpTRES=gres/gpu:3g.71gb=1,node=1".into(),
            format!("+ add user {} to account acme", t.acme1.name),
            format!("+ add user {} to account acme", t.both.name),
            format!("+ add user {} to account globex", t.globex1.name),
            format!("+ add user {} to account globex", t.both.name),
        ] {
            assert!(plan.contains(&want), "the plan lacks {want:?}");
        }
        assert!(!plan.contains(&t.outsider.name), "{plan}");
        assert_eq!(
            associations(&e.stack),
            before,
            "the plan alone changed slurmdbd"
        );

        let applied = sync(e, true);
        assert!(applied.contains("change(s) made"), "{applied}");
        let assocs = associations(&e.stack);
        let (acme_tres, acme_jobs) = &assocs[&("acme".to_string(), String::new())];
        assert_eq!(
            acme_tres.get("gres/gpu:1g.18gb").map(String::as_str),
            Some("1"),
            "{assocs:?}"
        );
        assert_eq!(
            acme_tres.get("gres/gpu").map(String::as_str),
            Some("2"),
            "{assocs:?}"
        );
        assert_eq!(acme_jobs, "4");
        let (globex_tres, _) = &assocs[&("globex".to_string(), String::new())];
        assert_eq!(
            globex_tres.get("gres/gpu:3g.71gb").map(String::as_str),
            Some("1")
        );
        assert_eq!(globex_tres.get("node").map(String::as_str), Some("1"));
        for (account, user) in [
            ("acme", &t.acme1),
            ("acme", &t.both),
            ("globex", &t.globex1),
            ("globex", &t.both),
        ] {
            assert!(
                assocs.contains_key(&(account.to_string(), user.name.clone())),
                "no association of {} in {account}: {assocs:?}",
                user.name
            );
        }
        assert!(!assocs.keys().any(|(_, u)| *u == t.outsider.name));
        let mut c = e.stack.cluster.cmd("sacctmgr");
        c.args([
            "-n",
            "-P",
            "show",
            "account",
            "acme",
            "format=account,organization",
        ]);
        let o = e.stack.cluster.run(c).unwrap();
        assert_eq!(text(&o.stdout).trim(), "acme|slurm-tenancy");

        doctor("ok");

        // The second run changes nothing.
        let again = sync(e, false);
        assert!(again.contains("nothing to change"), "{again}");
        let again = sync(e, true);
        assert!(again.contains("nothing to change"), "{again}");
        assert_eq!(associations(&e.stack), assocs);
    }
);

/// A job of `user` that holds what `args` ask for, `secs` seconds; its id.
fn sleep_job(c: &Client, user: &TestUser, args: &[&str], secs: u32) -> u64 {
    let o = c.sbatch_sleep(user, args, secs).unwrap();
    assert!(o.status.success(), "sbatch {args:?}: {}", output_text(&o));
    submitted_id(&o).unwrap()
}

fn wait_reason(c: &Client, id: u64, reason: &str, timeout: Duration) -> BTreeMap<String, String> {
    let t = Instant::now();
    loop {
        let info = c.job_info(id).unwrap();
        if info.get("Reason").map(String::as_str) == Some(reason) {
            return info;
        }
        assert!(
            t.elapsed() < timeout,
            "job {id} has no reason {reason} after {timeout:?}: {info:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

scenario!(
    job_over_tenant_quota_waits_with_slurms_reason,
    Options::default()
        .slurm_conf("AccountingStorageEnforce=associations,limits")
        .accounting(accounting())
        .config(acme_limits),
    |e: &mut Env| {
        sync(e, true);
        // doctor sees slurmctld enforcing the quotas.
        let doctor = output_text(&e.ctl(&["doctor", "--format", "json"]));
        assert!(
            doctor.contains("\"check\": \"slurm.accounting_enforce\",\n    \"severity\": \"ok\""),
            "{doctor}"
        );

        let cluster = &e.stack.cluster;
        let args = ["--tenant=acme", "--mig=1g.18gb", "--gres=gpu:1g.18gb:1"];
        let first = sleep_job(cluster, &e.t.acme1, &args, 120);
        cluster
            .wait_job(first, &["RUNNING"], Duration::from_secs(60))
            .unwrap();
        // Over the tenant's one 1g.18gb slice: accepted, and it waits with Slurm's own reason.
        let second = sleep_job(cluster, &e.t.acme1, &args, 5);
        let info = wait_reason(cluster, second, "AssocGrpGRES", Duration::from_secs(90));
        assert_eq!(info["JobState"], "PENDING", "{info:?}");
        // Neither refused by the prolog nor a drain.
        assert!(e.stack.audit_events(second).unwrap().is_empty());
        let state = cluster.node_state().unwrap();
        assert!(!state.contains("drain"), "node {state}");
        assert_eq!(cluster.node_reason().unwrap(), "");
        // Another tenant is not held by acme's quota.
        let g = sleep_job(
            cluster,
            &e.t.globex1,
            &["--tenant=globex", "--mig=3g.71gb", "--gres=gpu:3g.71gb:1"],
            2,
        );
        let info = cluster.wait_job_done(g, Duration::from_secs(90)).unwrap();
        assert_eq!(info["JobState"], "COMPLETED", "{info:?}");
        // The waiting job runs once the tenant's first job ends.
        let mut c = cluster.cmd("scancel");
        c.arg(first.to_string());
        cluster.run(c).unwrap();
        let info = cluster
            .wait_job_done(second, Duration::from_secs(120))
            .unwrap();
        assert_eq!(info["JobState"], "COMPLETED", "{info:?}");
    }
);

// ---- node pools and share_node on two nodes ------------------------------------------------

/// `sbatch -N1 -n1 --tenant=T [args]` of a job sleeping `secs` s as `user` on the two nodes.
fn mn_sbatch(mn: &MultiNode, user: &TestUser, tenant: &str, args: &[&str], secs: u32) -> Output {
    let tenant = format!("--tenant={tenant}");
    let all = [&["-N1", "-n1", tenant.as_str()][..], args].concat();
    mn.sbatch_sleep(user, &all, secs).unwrap()
}

fn mn_job(mn: &MultiNode, user: &TestUser, tenant: &str, args: &[&str]) -> u64 {
    let o = mn_sbatch(mn, user, tenant, args, 120);
    assert!(o.status.success(), "sbatch {args:?}: {}", output_text(&o));
    submitted_id(&o).unwrap()
}

fn running_on(mn: &MultiNode, id: u64) -> String {
    mn.wait_job(id, &["RUNNING"], Duration::from_secs(60))
        .unwrap()["NodeList"]
        .clone()
}

/// Stays pending for `secs` seconds (while nodes it may not use are idle).
fn stays_pending(mn: &MultiNode, id: u64, secs: u64) -> BTreeMap<String, String> {
    let t = Instant::now();
    loop {
        let info = mn.job_info(id).unwrap();
        assert_eq!(
            info["JobState"], "PENDING",
            "job {id} left the queue: {info:?}"
        );
        if t.elapsed() > Duration::from_secs(secs) {
            return info;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// globex runs on n2 alone (`nodes = "n2"` on the tenant).
fn pool_options() -> Options {
    Options::default().config(|c| {
        c.tenant("globex").nodes("n2");
    })
}

/// `user`'s jobs of `tenant` fill `node` and the next one waits while `idle` (a node the
/// tenant may not use) stays idle; `--nodelist idle` is refused with `says`, and the user
/// cannot clear the pending job's exclusions.
fn kept_to(mn: &MultiNode, user: &TestUser, tenant: &str, node: &str, idle: &str, says: &str) {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    // As many one-CPU jobs as the node has CPUs, and one more.
    let ids: Vec<u64> = (0..=cpus).map(|_| mn_job(mn, user, tenant, &[])).collect();
    for id in &ids[..cpus] {
        assert_eq!(running_on(mn, *id), node, "job {id}");
    }
    let last = *ids.last().unwrap();
    let info = stays_pending(mn, last, 8);
    eprintln!("job {last} waits while {idle} is idle: {info:?}");
    let o = mn_sbatch(mn, user, tenant, &["-w", idle], 1);
    let out = output_text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(out.contains(says), "{out}\ndoes not say {says}");
    let mut u = mn.cmd_as(user, "scontrol");
    u.args(["update", &format!("jobid={last}"), "ExcNodeList="]);
    let o = u.output().unwrap();
    assert!(
        !o.status.success(),
        "the user cleared the pool's exclusions: {}",
        output_text(&o)
    );
    stays_pending(mn, last, 3);
}

scenario!(
    pool_tenant_runs_only_on_its_nodes,
    pool_options(),
    |mn: &mut MultiNode| {
        let g = mn.tenants.globex1.clone();
        kept_to(
            mn,
            &g,
            "globex",
            "n2",
            "n1",
            "tenancy: --nodelist names n1: node n1 is outside the node pool of tenant 'globex'",
        );
    }
);

scenario!(
    other_tenants_never_land_in_a_pool,
    pool_options(),
    |mn: &mut MultiNode| {
        let a = mn.tenants.acme1.clone();
        kept_to(
            mn,
            &a,
            "acme",
            "n1",
            "n2",
            "node n2 is in the node pool of tenant 'globex' (n2), which tenant 'acme' may not use",
        );
    }
);

/// acme's tier ("alone") shares no node.
fn alone_config(c: &mut TenancyToml) {
    c.tier("alone").share_node(false);
    c.tenant("acme").tier("alone");
}

/// Two nodes of 4 CPUs, acme alone on its nodes; MCS (mcs/group, the tenants' groups listed)
/// labels its jobs.
fn mcs_options() -> Options {
    Options::default()
        .slurm_conf("MCSPlugin=mcs/group")
        .slurm_conf("MCSParameters=ondemand,select:{acme_group}|{globex_group}")
        .cpus(4)
        .config(alone_config)
}

scenario!(
    share_node_false_tenant_packs_with_itself_never_with_others,
    mcs_options(),
    |mn: &mut MultiNode| {
        let (a, g) = (mn.tenants.acme1.clone(), mn.tenants.globex1.clone());
        // Two small jobs of the tenant: one node.
        let a1 = mn_job(mn, &a, "acme", &[]);
        let a2 = mn_job(mn, &a, "acme", &[]);
        let node = running_on(mn, a1);
        assert_eq!(
            running_on(mn, a2),
            node,
            "the tenant's two jobs did not pack"
        );
        let other = if node == "n1" { "n2" } else { "n1" };
        // Another tenant's jobs go to the other node, though acme's has free CPUs ...
        let g1 = mn_job(mn, &g, "globex", &["-c", "2"]);
        assert_eq!(running_on(mn, g1), other);
        let g2 = mn_job(mn, &g, "globex", &["-c", "2"]);
        assert_eq!(running_on(mn, g2), other);
        // ... and, the other node full, wait rather than join acme's.
        let g3 = mn_job(mn, &g, "globex", &[]);
        stays_pending(mn, g3, 8);
        // The tenant's third job still packs beside its own.
        let a3 = mn_job(mn, &a, "acme", &[]);
        assert_eq!(running_on(mn, a3), node);
        let info = mn.job_info(a1).unwrap();
        assert_eq!(
            info.get("MCS_label").map(String::as_str),
            Some(mn.tenants.acme_group.as_str()),
            "{info:?}"
        );
        // The label is the tenancy check's, not the user's.
        let o = mn_sbatch(
            mn,
            &g,
            "globex",
            &["--mcs-label", &mn.tenants.acme_group],
            1,
        );
        assert!(!o.status.success(), "{}", output_text(&o));
    }
);

/// The packing figure (BENCHMARKS.md): N one-CPU jobs of a `share_node = false` tenant on the
/// two 4-CPU nodes, with MCS (the product now) and without it (a node of its own per job, as
/// before): how many nodes they hold at once and how many run. Run with --ignored.
#[test]
#[ignore]
fn share_node_packing_figures() {
    scenario(
        "share_node_packing_figures",
        Options::default(),
        |users: &mut Users| {
            let n = 4;
            for (what, options) in [
                ("MCS label", mcs_options()),
                (
                    "exclusive (no MCS)",
                    Options::default().cpus(4).config(alone_config),
                ),
            ] {
                let mn = MultiNode::start(users, &options).expect("multi-node cluster");
                let a = mn.tenants.acme1.clone();
                let ids: Vec<u64> = (0..n).map(|_| mn_job(&mn, &a, "acme", &[])).collect();
                std::thread::sleep(Duration::from_secs(10));
                let mut nodes = std::collections::BTreeSet::new();
                let mut running = 0;
                for id in &ids {
                    let info = mn.job_info(*id).unwrap();
                    if info["JobState"] == "RUNNING" {
                        running += 1;
                        nodes.insert(info["NodeList"].clone());
                    }
                }
                eprintln!(
                    "FIGURES share_node=false, {n} one-CPU jobs, 2 nodes x 4 CPUs, {what}: {} \
                     node(s) held, {running} running, {} waiting",
                    nodes.len(),
                    n - running
                );
            }
        },
    );
}

// ---- submission paths without the SPANK plugin ---------------------------------------------

/// The one-line reason of a refusal, as sbatch prints it (`sbatch: error: tenancy: ...`).
fn sbatch_reason(o: &Output) -> String {
    let err = text(&o.stderr);
    err.lines()
        .find_map(|l| l.split_once("tenancy: ").map(|(_, r)| r.trim().to_string()))
        .unwrap_or_else(|| panic!("no tenancy: line in {err}"))
}

/// slurmrestd checks tokens with a JWT key made before the cluster that reads it; Debian's
/// slurmrestd (OpenAPI v0.0.38) talks to the host's Slurm.
#[test]
fn rest_submission_is_checked_like_sbatch() {
    let key_dir = tempdir("tenancy-e2e-jwt-");
    let options = jwt_conf(key_dir.path())
        .unwrap()
        .into_iter()
        .fold(Options::host(), Options::slurm_conf);
    scenario(
        "rest_submission_is_checked_like_sbatch",
        options,
        rest_submission,
    );
}

fn rest_submission(e: &mut Env) {
    let (stack, t) = (&e.stack, &e.t);
    let rest = Rest::start(&stack.cluster, "openapi/v0.0.38").unwrap();
    let token = Rest::token(&stack.cluster, &t.acme1).unwrap();
    let dir = stack.cluster.user_dir(&t.acme1);
    let job = |tenant: &str, name: &str, script: &str| {
        json!({
            "script": script,
            "job": {
                "name": name,
                "current_working_directory": dir.display().to_string(),
                "standard_output": dir.join(format!("{name}.out")).display().to_string(),
                "environment": {
                    "PATH": "/usr/bin:/bin",
                    "TENANCY_TENANT": tenant,
                },
            },
        })
    };
    const SUBMIT: &str = "/slurm/v0.0.38/job/submit";

    // Refused as sbatch refuses it, the same one line in the answer; the job never runs.
    let nothing = include_str!("../scripts/jobs/nothing.sh");
    let refused = e.job(&t.acme1, "refused", nothing, &[]);
    let (status, answer) = rest
        .post(SUBMIT, &t.acme1, &token, &job("globex", "refused", nothing))
        .unwrap();
    eprintln!("slurmrestd ({status}): {answer}");
    let msg = answer["job_submit_user_msg"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let script = refused.script.display().to_string();
    let via_sbatch = e.sbatch_raw(&t.acme1, &["--tenant=globex", &script]);
    assert!(!via_sbatch.status.success());
    let reason = sbatch_reason(&via_sbatch);
    assert!(
        reason.contains("is not a member of tenant 'globex'"),
        "{reason}"
    );
    assert!(
        msg.starts_with(&format!("tenancy: {reason}")),
        "REST answer {msg:?}, sbatch {reason:?}"
    );
    {
        let id = answer["job_id"]
            .as_u64()
            .unwrap_or_else(|| panic!("no job id: {answer}"));
        std::thread::sleep(Duration::from_secs(5));
        let info = stack.cluster.job_info(id).unwrap();
        assert_eq!(info["JobState"], "PENDING", "{info:?}");
        assert!(info["Reason"].starts_with("JobHeld"), "{info:?}");
        assert!(info["Comment"].starts_with("tenancy:"), "{info:?}");
        // Released, it ends on its deadline rather than run.
        let mut r = stack.cluster.cmd_as(&t.acme1, "scontrol");
        r.args(["release", &id.to_string()]);
        stack.cluster.run(r).unwrap();
        let info = stack
            .cluster
            .wait_job_done(id, Duration::from_secs(60))
            .unwrap();
        assert_eq!(info["JobState"], "DEADLINE", "{info:?}");
        assert!(
            stack.audit_events(id).unwrap().is_empty(),
            "job {id} reached a node"
        );
        assert_eq!(stack.cluster.node_reason().unwrap(), "");
    }

    // Accepted: it runs isolated like any other job of its tenant.
    let script = include_str!("../scripts/jobs/isolation-report.sh");
    let (status, answer) = rest
        .post(SUBMIT, &t.acme1, &token, &job("acme", "isolated", script))
        .unwrap();
    eprintln!("slurmrestd ({status}): {answer}");
    let id = answer["job_id"]
        .as_u64()
        .unwrap_or_else(|| panic!("no job id: {answer}"));
    let info = stack
        .cluster
        .wait_job_done(id, Duration::from_secs(90))
        .unwrap();
    assert_eq!(info["JobState"], "COMPLETED", "{info:?}");
    let out = std::fs::read_to_string(dir.join("isolated.out")).unwrap();
    eprintln!("job {id}:\n{out}");
    assert!(out.contains(&format!("tenancy/acme/job_{id}")), "{out}");
    assert!(
        out.contains(&format!(
            "TMPDIR={}",
            stack
                .paths
                .scratch_root
                .join("acme")
                .join(format!("job_{id}"))
                .display()
        )),
        "{out}"
    );
    assert!(out.contains("TENANT=acme"), "{out}");
    assert_eq!(stack.audit_events(id).unwrap(), ["job_start", "job_end"]);
    drop(rest);
}

// Debian 12's Slurm has no scrontab; 24.11's root (scripts/slurm-root 24.11 --plugins) has.
scenario!(
    scrontab_job_is_checked,
    Options::release("24.11").slurm_conf("ScronParameters=enable"),
    |e: &mut Env| {
        let crontab = |e: &Env, user: &TestUser| {
            let file = e.stack.cluster.user_dir(user).join("crontab");
            std::fs::write(&file, include_str!("../scripts/jobs/every-minute.crontab")).unwrap();
            let _ = nix::unistd::chown(&file, Some(nix::unistd::Uid::from_raw(user.uid)), None);
            let mut c = e.stack.cluster.cmd_as(user, "scrontab");
            c.arg(&file);
            e.stack.cluster.run(c).unwrap()
        };
        // Slurm 23.02 and later hand the plugin's message of a refused entry to scrontab in a
        // field it prints only on success: the user sees the refusal, slurmctld's log the
        // reason.
        let log = e.stack.cluster.path("log/slurmctld.log");
        let refused_in_log = |user: &TestUser, says: &str| {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            text.lines().any(|l| {
                l.contains(&format!(
                    "job_submit/tenancy: refused a job of uid {}",
                    user.uid
                )) && l.contains(says)
            })
        };
        let t = e.t.clone();
        // A member of a tenant whose tier does not allow a login environment: refused, with
        // why.
        let o = crontab(e, &t.acme1);
        eprintln!("scrontab as {}: {}", t.acme1.name, output_text(&o));
        assert!(!o.status.success(), "{}", output_text(&o));
        assert!(
            output_text(&o).contains("Access/permission denied"),
            "{}",
            output_text(&o)
        );
        assert!(
            refused_in_log(
                &t.acme1,
                "scrontab jobs ask for your login environment (scrontab sets \
                 SLURM_GET_USER_ENV=1 in every one)"
            ) && refused_in_log(&t.acme1, "tier 'internal' of tenant 'acme'"),
            "no refusal of {} in {}",
            t.acme1.name,
            log.display()
        );
        // A user of no tenant: refused as sbatch refuses them.
        let o = crontab(e, &t.outsider);
        assert!(!o.status.success(), "{}", output_text(&o));
        assert!(refused_in_log(&t.outsider, "is not a member of any tenant"));
        // The tier allows it: the entry is taken, as a job of the tenant.
        e.stack
            .reconfigure(|c| {
                c.tier("internal").allow_get_user_env(true);
            })
            .unwrap();
        let o = crontab(e, &t.acme1);
        assert!(o.status.success(), "{}", output_text(&o));
        let mut q = e.stack.cluster.cmd("squeue");
        q.args(["-h", "-u", &t.acme1.name, "-o", "%i %j"]);
        let queued = text(&e.stack.cluster.run(q).unwrap().stdout);
        assert!(!queued.trim().is_empty(), "no scrontab job queued");
    }
);

// ---- bad input -------------------------------------------------------------------------------

#[test]
fn bad_pool_and_limits_are_config_errors() {
    let dir = tempdir("tenancy-e2e-badcfg-");
    let d = dir.path();
    let slurm_conf = d.join("slurm.conf");
    // slurmdbd "down": nothing listens where slurm.conf says it is.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    std::fs::write(
        &slurm_conf,
        format!(
            "ClusterName=bad\nSlurmctldHost=localhost\nAuthType=auth/munge\n\
             AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=127.0.0.1\n\
             AccountingStoragePort={port}\nNodeName=gpu[01-02],cpu1 CPUs=1\n\
             PartitionName=p Nodes=ALL\n"
        ),
    )
    .unwrap();
    // acme (group root) on gpu01 and gpu02, two 1g.18gb slices at a time; `change` makes one
    // config differ from it.
    let config = |change: &dyn Fn(&mut TenancyToml)| {
        let mut c = TenancyToml::under("bad", d);
        c.tier("internal").mig_profiles(["1g.18gb"]);
        c.tenant("acme")
            .tier("internal")
            .groups(["root"])
            .nodes("gpu[01-02]")
            .limits(Limits::default().mig_slices("1g.18gb", 2));
        change(&mut c);
        c.to_string()
    };
    let base = config(&|_| {});
    let tenancyctl = artifact("tenancyctl").unwrap();
    let run = |toml: &str, args: &[&str]| {
        let path = d.join("tenancy.toml");
        std::fs::write(&path, toml).unwrap();
        std::process::Command::new(&tenancyctl)
            .env("SLURM_CONF", &slurm_conf)
            .arg("--config")
            .arg(&path)
            .args(args)
            .output()
            .unwrap()
    };
    let ok = run(&base, &["check"]);
    assert!(ok.status.success(), "{}", output_text(&ok));
    let unparsed = config(&|c| {
        c.tenant("acme").nodes("gpu[01-02");
    });
    // The error's place: the line of acme's `nodes`, the column its value starts at.
    let nodes_line = unparsed
        .lines()
        .position(|l| l.starts_with("nodes = "))
        .unwrap()
        + 1;
    let too_many = config(&|c| {
        c.tenant("acme").nodes("gpu[01-03]");
    });
    for (toml, says) in [
        (
            unparsed,
            format!(
                "tenancy.toml:{nodes_line}:9: tenant 'acme': nodes 'gpu[01-02' does not parse: \
                 a '[' without its ']'"
            ),
        ),
        (
            too_many.clone(),
            "tenant 'acme': nodes \"gpu[01-03]\" names a node that".into(),
        ),
        (
            config(&|c| {
                c.tenant("acme")
                    .limits(Limits::default().mig_slices("3g.71gb", 2));
            }),
            "tenant 'acme': limits.mig_slices names profile '3g.71gb', which tier 'internal' \
             does not offer"
                .into(),
        ),
    ] {
        let o = run(&toml, &["check"]);
        let out = output_text(&o);
        assert_eq!(o.status.code(), Some(1), "{out}");
        assert!(out.contains(&says), "{out}\ndoes not say {says}");
    }
    assert!(output_text(&run(&too_many, &["check"])).contains("gpu03"));
    // sync: sacctmgr missing, and slurmdbd down: the command run and its error.
    let o = run(
        &base,
        &["slurm", "sync", "--sacctmgr", "/nonexistent/sacctmgr"],
    );
    let out = output_text(&o);
    assert!(!o.status.success());
    assert!(
        out.contains("`/nonexistent/sacctmgr -n -P show cluster format=cluster`")
            && out.contains("sacctmgr is not installed here"),
        "{out}"
    );
    let o = run(&base, &["slurm", "sync", "--apply"]);
    let out = output_text(&o);
    assert!(!o.status.success());
    assert!(
        out.contains("`sacctmgr -n -P show cluster format=cluster` failed")
            && out.contains("Connection refused"),
        "{out}"
    );
}
