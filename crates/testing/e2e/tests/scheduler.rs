//! The scheduler layer on real Slurm: tenant quotas as slurmdbd associations that slurmctld
//! enforces (MariaDB + slurmdbd, `tenancyctl slurm sync`), node pools kept by job_submit/tenancy,
//! `share_node = false` on MCS labels (two nodes in namespaces), and the submission paths that
//! never run the SPANK plugin: slurmrestd (auth/jwt) and scrontab. Needs root.

use serde_json::json;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};
use tenancy_e2e::multi_node::{MultiNode, MultiNodeOptions};
use tenancy_e2e::rest::{jwt_conf, Rest};
use tenancy_e2e::stack::{Stack, Tenants};
use tenancy_e2e::{artifact, require_root, submitted_id, Accounting, SlurmRoot, TestUser, Users};

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn tempdir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(prefix).tempdir().unwrap()
}

/// Rewrites the config the cluster reads (job_submit/tenancy and the prolog read it again on
/// the next job): `edits` are (exact text, replacement) pairs, each present.
fn edit_config(path: &Path, edits: &[(&str, &str)]) {
    let mut t = std::fs::read_to_string(path).unwrap();
    for (from, to) in edits {
        assert!(t.contains(from), "the config lacks {from:?}:\n{t}");
        t = t.replacen(from, to, 1);
    }
    std::fs::write(path, t).unwrap();
}

fn accounting() -> Accounting {
    Accounting {
        gpu_types: vec![("1g.18gb".into(), 7), ("3g.71gb".into(), 2)],
    }
}

fn sync(stack: &Stack, apply: bool) -> String {
    let mut c = stack.tenancyctl();
    c.args(["slurm", "sync"]);
    if apply {
        c.arg("--apply");
    }
    let o = stack.cluster.run(c).unwrap();
    let out = text(&o);
    eprintln!(
        "tenancyctl slurm sync{}:\n{out}",
        if apply { " --apply" } else { "" }
    );
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
    assert!(o.status.success(), "{}", text(&o));
    String::from_utf8_lossy(&o.stdout)
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

const ACME_LIMITS: &str =
    "accounts = [\"acme\"]\nlimits = { gpus = 2, mig_slices = { \"1g.18gb\" = 1 }, running_jobs = 4 }\n";

#[test]
fn slurm_sync_makes_tenant_associations_with_limits() {
    if !require_root("slurm_sync_makes_tenant_associations_with_limits") {
        return;
    }
    let mut users = Users::new();
    let t = Tenants::create(&mut users).unwrap();
    let root = tempdir("tenancy-e2e-sync-");
    let stack = Stack::start_with_accounting(root.path(), &t, accounting()).unwrap();
    edit_config(
        &stack.config,
        &[
            ("accounts = [\"acme\"]\n", ACME_LIMITS),
            (
                "accounts = [\"globex\"]\n",
                "accounts = [\"globex\"]\nlimits = { nodes = 1, mig_slices = { \"3g.71gb\" = 1 } }\n",
            ),
        ],
    );
    edit_config(
        &stack.config,
        &[(
            "[tiers.regulated]\n",
            "[tiers.regulated]\nrequire_limits = true\n",
        )],
    );
    // doctor: globex's tier requires limits, and slurmdbd has none for it yet.
    let doctor = |want: &str| {
        let mut d = stack.tenancyctl();
        d.args(["doctor", "--format", "csv"]);
        let out = text(&stack.cluster.run(d).unwrap());
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
    let before = associations(&stack);
    let plan = sync(&stack, false);
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
        associations(&stack),
        before,
        "the plan alone changed slurmdbd"
    );

    let applied = sync(&stack, true);
    assert!(applied.contains("change(s) made"), "{applied}");
    let assocs = associations(&stack);
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
    let mut c = stack.cluster.cmd("sacctmgr");
    c.args([
        "-n",
        "-P",
        "show",
        "account",
        "acme",
        "format=account,organization",
    ]);
    let o = stack.cluster.run(c).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "acme|slurm-tenancy"
    );

    doctor("ok");

    // The second run changes nothing.
    let again = sync(&stack, false);
    assert!(again.contains("nothing to change"), "{again}");
    let again = sync(&stack, true);
    assert!(again.contains("nothing to change"), "{again}");
    assert_eq!(associations(&stack), assocs);
}

fn sbatch(stack: &Stack, user: &TestUser, args: &[&str], secs: u32) -> Output {
    let mut c = stack.cluster.cmd_as(user, "sbatch");
    c.args(args)
        .arg("--no-requeue")
        .args(["-o", "/dev/null", "--wrap"])
        .arg(format!("sleep {secs}"));
    stack.cluster.run(c).unwrap()
}

fn wait_reason(
    stack: &Stack,
    id: u64,
    reason: &str,
    timeout: Duration,
) -> BTreeMap<String, String> {
    let t = Instant::now();
    loop {
        let info = stack.cluster.job_info(id).unwrap();
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

#[test]
fn job_over_tenant_quota_waits_with_slurms_reason() {
    if !require_root("job_over_tenant_quota_waits_with_slurms_reason") {
        return;
    }
    let mut users = Users::new();
    let t = Tenants::create(&mut users).unwrap();
    let root = tempdir("tenancy-e2e-quota-");
    let stack = Stack::start_full(
        root.path(),
        &t,
        vec!["AccountingStorageEnforce=associations,limits".into()],
        vec![],
        Some(accounting()),
        None,
    )
    .unwrap();
    edit_config(&stack.config, &[("accounts = [\"acme\"]\n", ACME_LIMITS)]);
    sync(&stack, true);
    // doctor sees slurmctld enforcing the quotas.
    let mut d = stack.tenancyctl();
    d.args(["doctor", "--format", "json"]);
    let doctor = text(&stack.cluster.run(d).unwrap());
    assert!(
        doctor.contains("\"check\": \"slurm.accounting_enforce\",\n    \"severity\": \"ok\""),
        "{doctor}"
    );

    let args = ["--tenant=acme", "--mig=1g.18gb", "--gres=gpu:1g.18gb:1"];
    let first = submitted_id(&sbatch(&stack, &t.acme1, &args, 120)).unwrap();
    stack
        .cluster
        .wait_job(first, &["RUNNING"], Duration::from_secs(60))
        .unwrap();
    // Over the tenant's one 1g.18gb slice: accepted, and it waits with Slurm's own reason.
    let o = sbatch(&stack, &t.acme1, &args, 5);
    assert!(o.status.success(), "{}", text(&o));
    let second = submitted_id(&o).unwrap();
    let info = wait_reason(&stack, second, "AssocGrpGRES", Duration::from_secs(90));
    assert_eq!(info["JobState"], "PENDING", "{info:?}");
    // Neither refused by the prolog nor a drain.
    assert!(stack.audit_events(second).unwrap().is_empty());
    let state = stack.cluster.node_state().unwrap();
    assert!(!state.contains("drain"), "node {state}");
    assert_eq!(stack.cluster.node_reason().unwrap(), "");
    // Another tenant is not held by acme's quota.
    let g = sbatch(
        &stack,
        &t.globex1,
        &["--tenant=globex", "--mig=3g.71gb", "--gres=gpu:3g.71gb:1"],
        2,
    );
    let g = submitted_id(&g).unwrap();
    let info = stack
        .cluster
        .wait_job_done(g, Duration::from_secs(90))
        .unwrap();
    assert_eq!(info["JobState"], "COMPLETED", "{info:?}");
    // The waiting job runs once the tenant's first job ends.
    let mut c = stack.cluster.cmd("scancel");
    c.arg(first.to_string());
    stack.cluster.run(c).unwrap();
    let info = stack
        .cluster
        .wait_job_done(second, Duration::from_secs(120))
        .unwrap();
    assert_eq!(info["JobState"], "COMPLETED", "{info:?}");
}

// ---- node pools and share_node on two nodes ------------------------------------------------

fn multi(users: &mut Users, opts: MultiNodeOptions) -> MultiNode {
    MultiNode::start(users, opts).expect("multi-node cluster")
}

/// `sbatch -N1 -n1 [args] --tenant=T --wrap 'sleep S'` as `user` on the two-node cluster.
fn mn_sbatch(mn: &MultiNode, user: &TestUser, tenant: &str, args: &[&str], secs: u32) -> Output {
    let mut c = mn.cmd_as(user, "sbatch").unwrap();
    c.args(["-N1", "-n1", "--no-requeue", "-o", "/dev/null"])
        .arg(format!("--tenant={tenant}"))
        .args(args)
        .arg("--wrap")
        .arg(format!("sleep {secs}"));
    c.output().unwrap()
}

fn mn_job(mn: &MultiNode, user: &TestUser, tenant: &str, args: &[&str]) -> u64 {
    let o = mn_sbatch(mn, user, tenant, args, 120);
    assert!(o.status.success(), "sbatch {args:?}: {}", text(&o));
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
fn pool_config(mn: &MultiNode) {
    edit_config(
        &mn.tenancy_toml,
        &[(
            "accounts = [\"globex\"]\n",
            "accounts = [\"globex\"]\nnodes = \"n2\"\n",
        )],
    );
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
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains(says), "{}\ndoes not say {says}", text(&o));
    let mut u = mn.cmd_as(user, "scontrol").unwrap();
    u.args(["update", &format!("jobid={last}"), "ExcNodeList="]);
    let o = u.output().unwrap();
    assert!(
        !o.status.success(),
        "the user cleared the pool's exclusions: {}",
        text(&o)
    );
    stays_pending(mn, last, 3);
}

#[test]
fn pool_tenant_runs_only_on_its_nodes() {
    if !require_root("pool_tenant_runs_only_on_its_nodes") {
        return;
    }
    let mut users = Users::new();
    let mn = multi(&mut users, MultiNodeOptions::default());
    pool_config(&mn);
    let g = mn.tenants.globex1.clone();
    kept_to(
        &mn,
        &g,
        "globex",
        "n2",
        "n1",
        "tenancy: --nodelist names n1: node n1 is outside the node pool of tenant 'globex'",
    );
}

#[test]
fn other_tenants_never_land_in_a_pool() {
    if !require_root("other_tenants_never_land_in_a_pool") {
        return;
    }
    let mut users = Users::new();
    let mn = multi(&mut users, MultiNodeOptions::default());
    pool_config(&mn);
    let a = mn.tenants.acme1.clone();
    kept_to(
        &mn,
        &a,
        "acme",
        "n1",
        "n2",
        "node n2 is in the node pool of tenant 'globex' (n2), which tenant 'acme' may not use",
    );
}

/// acme's tier shares no node; MCS (mcs/group, the tenants' groups listed) labels its jobs.
fn mcs_options() -> MultiNodeOptions {
    MultiNodeOptions {
        extra_conf: vec![
            "MCSPlugin=mcs/group".into(),
            "MCSParameters=ondemand,select:{acme_group}|{globex_group}".into(),
        ],
        cpus: Some(4),
        ..MultiNodeOptions::default()
    }
}

fn alone_config(mn: &MultiNode) {
    edit_config(
        &mn.tenancy_toml,
        &[
            (
                "[tenants.acme]\ntier = \"research\"",
                "[tenants.acme]\ntier = \"alone\"",
            ),
            (
                "[tenants.acme]",
                "[tiers.alone]\nshare_node = false\n\n[tenants.acme]",
            ),
        ],
    );
}

#[test]
fn share_node_false_tenant_packs_with_itself_never_with_others() {
    if !require_root("share_node_false_tenant_packs_with_itself_never_with_others") {
        return;
    }
    let mut users = Users::new();
    let mn = multi(&mut users, mcs_options());
    alone_config(&mn);
    let (a, g) = (mn.tenants.acme1.clone(), mn.tenants.globex1.clone());
    // Two small jobs of the tenant: one node.
    let a1 = mn_job(&mn, &a, "acme", &[]);
    let a2 = mn_job(&mn, &a, "acme", &[]);
    let node = running_on(&mn, a1);
    assert_eq!(
        running_on(&mn, a2),
        node,
        "the tenant's two jobs did not pack"
    );
    let other = if node == "n1" { "n2" } else { "n1" };
    // Another tenant's jobs go to the other node, though acme's has free CPUs ...
    let g1 = mn_job(&mn, &g, "globex", &["-c", "2"]);
    assert_eq!(running_on(&mn, g1), other);
    let g2 = mn_job(&mn, &g, "globex", &["-c", "2"]);
    assert_eq!(running_on(&mn, g2), other);
    // ... and, the other node full, wait rather than join acme's.
    let g3 = mn_job(&mn, &g, "globex", &[]);
    stays_pending(&mn, g3, 8);
    // The tenant's third job still packs beside its own.
    let a3 = mn_job(&mn, &a, "acme", &[]);
    assert_eq!(running_on(&mn, a3), node);
    let info = mn.job_info(a1).unwrap();
    assert_eq!(
        info.get("MCS_label").map(String::as_str),
        Some(mn.tenants.acme_group.as_str()),
        "{info:?}"
    );
    // The label is the tenancy check's, not the user's.
    let o = mn_sbatch(
        &mn,
        &g,
        "globex",
        &["--mcs-label", &mn.tenants.acme_group],
        1,
    );
    assert!(!o.status.success(), "{}", text(&o));
}

/// The packing figure (BENCHMARKS.md): N one-CPU jobs of a `share_node = false` tenant on the
/// two 4-CPU nodes, with MCS (the product now) and without it (a node of its own per job, as
/// before): how many nodes they hold at once and how many run. Run with --ignored.
#[test]
#[ignore]
fn share_node_packing_figures() {
    if !require_root("share_node_packing_figures") {
        return;
    }
    let n = 4;
    for (what, opts) in [
        ("MCS label", mcs_options()),
        (
            "exclusive (no MCS)",
            MultiNodeOptions {
                cpus: Some(4),
                ..MultiNodeOptions::default()
            },
        ),
    ] {
        let mut users = Users::new();
        let mn = multi(&mut users, opts);
        alone_config(&mn);
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
            "FIGURES share_node=false, {n} one-CPU jobs, 2 nodes x 4 CPUs, {what}: {} node(s) \
             held, {running} running, {} waiting",
            nodes.len(),
            n - running
        );
    }
}

// ---- submission paths without the SPANK plugin ---------------------------------------------

/// The one-line reason of a refusal, as sbatch prints it (`sbatch: error: tenancy: ...`).
fn sbatch_reason(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr);
    err.lines()
        .find_map(|l| l.split_once("tenancy: ").map(|(_, r)| r.trim().to_string()))
        .unwrap_or_else(|| panic!("no tenancy: line in {err}"))
}

#[test]
fn rest_submission_is_checked_like_sbatch() {
    if !require_root("rest_submission_is_checked_like_sbatch") {
        return;
    }
    let mut users = Users::new();
    let t = Tenants::create(&mut users).unwrap();
    let root = tempdir("tenancy-e2e-rest-");
    let key_dir = tempdir("tenancy-e2e-jwt-");
    let stack =
        Stack::start_with(root.path(), &t, jwt_conf(key_dir.path()).unwrap(), vec![]).unwrap();
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
    let (status, answer) = rest
        .post(
            SUBMIT,
            &t.acme1,
            &token,
            &job("globex", "refused", "#!/bin/sh\ntrue\n"),
        )
        .unwrap();
    eprintln!("slurmrestd ({status}): {answer}");
    let msg = answer["job_submit_user_msg"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let via_sbatch = {
        let mut c = stack.cluster.cmd_as(&t.acme1, "sbatch");
        c.args(["--tenant=globex", "--wrap", "true"]);
        stack.cluster.run(c).unwrap()
    };
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
    let script = "#!/bin/sh\ncat /proc/self/cgroup\necho \"TMPDIR=$TMPDIR\"\necho \"TENANT=$TENANCY_TENANT\"\n";
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

#[test]
fn scrontab_job_is_checked() {
    if !require_root("scrontab_job_is_checked") {
        return;
    }
    // Debian 12's Slurm has no scrontab; 24.11's root (scripts/slurm-root) has.
    let slurm = match SlurmRoot::make("24.11") {
        Ok(s) => s,
        Err(e) => panic!(
            "scrontab needs the Slurm 24.11 root (scripts/slurm-root 24.11 --plugins): {e:#}"
        ),
    };
    let mut users = Users::new();
    let t = Tenants::create(&mut users).unwrap();
    let root = tempdir("tenancy-e2e-scron-");
    let stack = Stack::start_full(
        root.path(),
        &t,
        vec!["ScronParameters=enable".into()],
        vec![],
        None,
        Some(slurm),
    )
    .unwrap();
    let crontab = |user: &TestUser| {
        let file = stack.cluster.user_dir(user).join("crontab");
        std::fs::write(&file, "#SCRON -t 1\n* * * * * /bin/true\n").unwrap();
        let _ = nix::unistd::chown(&file, Some(nix::unistd::Uid::from_raw(user.uid)), None);
        let mut c = stack.cluster.cmd_as(user, "scrontab");
        c.arg(&file);
        stack.cluster.run(c).unwrap()
    };
    // Slurm 23.02 and later hand the plugin's message of a refused entry to scrontab in a
    // field it prints only on success: the user sees the refusal, slurmctld's log the reason.
    let log = stack.cluster.path("log/slurmctld.log");
    let refused_in_log = |user: &TestUser, says: &str| {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        text.lines().any(|l| {
            l.contains(&format!(
                "job_submit/tenancy: refused a job of uid {}",
                user.uid
            )) && l.contains(says)
        })
    };
    // A member of a tenant whose tier does not allow a login environment: refused, with why.
    let o = crontab(&t.acme1);
    eprintln!("scrontab as {}: {}", t.acme1.name, text(&o));
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("Access/permission denied"),
        "{}",
        text(&o)
    );
    assert!(
        refused_in_log(
            &t.acme1,
            "scrontab jobs ask for your login environment (scrontab sets SLURM_GET_USER_ENV=1 \
             in every one)"
        ) && refused_in_log(&t.acme1, "tier 'internal' of tenant 'acme'"),
        "no refusal of {} in {}",
        t.acme1.name,
        log.display()
    );
    // A user of no tenant: refused as sbatch refuses them.
    let o = crontab(&t.outsider);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(refused_in_log(&t.outsider, "is not a member of any tenant"));
    // The tier allows it: the entry is taken, as a job of the tenant.
    edit_config(
        &stack.config,
        &[(
            "scratch_on_exit = \"wipe\"\n",
            "scratch_on_exit = \"wipe\"\nallow_get_user_env = true\n",
        )],
    );
    let o = crontab(&t.acme1);
    assert!(o.status.success(), "{}", text(&o));
    let mut q = stack.cluster.cmd("squeue");
    q.args(["-h", "-u", &t.acme1.name, "-o", "%i %j"]);
    let queued = text(&stack.cluster.run(q).unwrap());
    assert!(!queued.trim().is_empty(), "no scrontab job queued");
}

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
    let base = format!(
        "[cluster]\nname = \"bad\"\nstate_dir = \"{d}/state\"\naudit_log = \"{d}/audit.jsonl\"\n\
         scratch_root = \"{d}/scratch\"\n\n[tiers.internal]\nmig_profiles = [\"1g.18gb\"]\n\n\
         [tenants.acme]\ntier = \"internal\"\ngroups = [\"root\"]\nnodes = \"gpu[01-02]\"\n\
         limits = {{ mig_slices = {{ \"1g.18gb\" = 2 }} }}\n",
        d = d.display()
    );
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
    assert!(ok.status.success(), "{}", text(&ok));
    for (from, to, says) in [
        (
            "nodes = \"gpu[01-02]\"",
            "nodes = \"gpu[01-02\"",
            "tenancy.toml:13:9: tenant 'acme': nodes 'gpu[01-02' does not parse: a '[' without its ']'",
        ),
        (
            "nodes = \"gpu[01-02]\"",
            "nodes = \"gpu[01-03]\"",
            "tenant 'acme': nodes \"gpu[01-03]\" names a node that",
        ),
        (
            "\"1g.18gb\" = 2",
            "\"3g.71gb\" = 2",
            "tenant 'acme': limits.mig_slices names profile '3g.71gb', which tier 'internal' does not offer",
        ),
    ] {
        let o = run(&base.replace(from, to), &["check"]);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        assert!(text(&o).contains(says), "{}\ndoes not say {says}", text(&o));
    }
    assert!(text(&run(&base.replace("gpu[01-02]", "gpu[01-03]"), &["check"])).contains("gpu03"));
    // sync: sacctmgr missing, and slurmdbd down: the command run and its error.
    let o = run(
        &base,
        &["slurm", "sync", "--sacctmgr", "/nonexistent/sacctmgr"],
    );
    assert!(!o.status.success());
    assert!(
        text(&o).contains("`/nonexistent/sacctmgr -n -P show cluster format=cluster`")
            && text(&o).contains("sacctmgr is not installed here"),
        "{}",
        text(&o)
    );
    let o = run(&base, &["slurm", "sync", "--apply"]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("`sacctmgr -n -P show cluster format=cluster` failed")
            && text(&o).contains("Connection refused"),
        "{}",
        text(&o)
    );
}
