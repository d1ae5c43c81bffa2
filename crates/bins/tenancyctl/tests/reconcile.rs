//! `tenancyctl reconcile` on a node with real leftovers: a journal of a job Slurm no longer runs
//! (made by the real prolog), a live job's journal, an orphan MIG instance in the NVML shim, an
//! orphan product cgroup with a BPF device program, an orphan scratch folder and a retained
//! folder past retention, and a job as a power loss leaves it (journal file empty, intents in
//! the node's intent log from an earlier boot). Dry run changes nothing; --apply restores the
//! lost journal, removes exactly the orphans and the dead jobs, keeps the live job, and audits
//! every removal; without Slurm no journal is touched. A journal of an earlier boot undoes only
//! what outlives a restart (its folder), never a GPU instance or cgroup now at its place.
//!
//! The test runs in its own network namespace (this thread only), where the product's nft table
//! is loaded, so the host's firewall is never touched.

mod common;
use common::{id, sh};
use serde_json::Value;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};
use tenancy_accounting::verify_paths;
use tenancy_audit_log::{AnchorSet, Event, Outcome, Record};
use tenancy_config::Config;
use tenancy_job::intent_log::IntentLog;
use tenancy_job::JobContext;
use tenancy_node::{layers, Spine};
use tenancy_test_support::{
    nvml_fixture, nvml_stand_in, requires_root, Immutable, ScratchOnExit, TenancyToml,
};

const CGROUP2: &str = "/sys/fs/cgroup/unified";

/// Tests that open NVML here set NVML_SHIM_FIXTURE, shared by the whole process: one at a time.
static NVML_ENV: Mutex<()> = Mutex::new(());

fn nvml_env() -> std::sync::MutexGuard<'static, ()> {
    NVML_ENV.lock().unwrap_or_else(|e| e.into_inner())
}

fn need_root() -> bool {
    requires_root("reconcile with real cgroups, users, nft")
}

/// The NVML stand-in and the lock on the NVML variables, as root; None (skipped) otherwise.
fn root_and_stand_in() -> Option<(PathBuf, std::sync::MutexGuard<'static, ()>)> {
    if !need_root() {
        return None;
    }
    let shim = nvml_stand_in()?;
    Some((shim, nvml_env()))
}

struct Guard {
    tenants: Vec<String>,
    users: Vec<String>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        for t in &self.tenants {
            let tdir = Path::new(CGROUP2).join("tenancy").join(t);
            if let Ok(rd) = std::fs::read_dir(&tdir) {
                for e in rd.flatten() {
                    let _ = std::fs::remove_dir(e.path());
                }
            }
            let _ = std::fs::remove_dir(tdir);
        }
        let _ = std::fs::remove_dir(
            Path::new(CGROUP2)
                .join("tenancy")
                .join(tenancy_devices::job::PROGRAM_KEEPER),
        );
        for u in &self.users {
            let _ = Command::new("userdel").arg(u).status();
        }
        for t in &self.tenants {
            let _ = Command::new("groupdel").arg(t).status();
        }
    }
}

/// A 1g.18gb slice of `tenant` made directly through NVML (no journal names it).
fn make_slice(mig: &tenancy_mig::Mig, tenant: &str) {
    let intent = mig
        .choose(
            &tenancy_mig::Request {
                profile: Some("1g.18gb".into()),
                slot: None,
                tenant: tenant.to_string(),
                share_gpu: true,
            },
            &[],
        )
        .unwrap();
    mig.create(&intent).unwrap();
}

fn reconcile(config: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tenancyctl"))
        .arg("--config")
        .arg(config)
        .arg("reconcile")
        .args(["--node", "node1"])
        .args(args)
        .output()
        .unwrap()
}

/// `reconcile --apply --format json` for `tenant` alone, with no job running on the node.
fn apply_with_no_job_running(cfg: &Path, root: &Path, tenant: &str, more: &[&str]) -> Output {
    let running = root.join("running");
    std::fs::write(&running, "").unwrap();
    let mut args = vec![
        "--apply",
        "--format",
        "json",
        "--running-jobs-from",
        running.to_str().unwrap(),
        "--tenant",
        tenant,
    ];
    args.extend_from_slice(more);
    reconcile(cfg, &args)
}

fn rows(out: &Output) -> Vec<Value> {
    serde_json::from_slice::<Vec<Value>>(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn kinds(rows: &[Value]) -> Vec<(String, Option<u64>, String)> {
    let mut v: Vec<_> = rows
        .iter()
        .map(|r| {
            (
                r["kind"].as_str().unwrap().to_string(),
                r["job_id"].as_u64(),
                r["action"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    v.sort();
    v
}

fn gis(root: &Path) -> usize {
    let s: Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("shim-state.json")).unwrap())
            .unwrap();
    s["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["gis"].as_array().unwrap().len())
        .sum()
}

#[test]
fn reconcile_removes_what_no_running_job_owns_and_keeps_the_rest() {
    let Some((shim, _env)) = root_and_stand_in() else {
        return;
    };
    // This thread (and what it spawns) gets a network namespace of its own.
    // SAFETY: only the network namespace of this thread changes; no file descriptor table,
    // filesystem or memory state is unshared.
    unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNET) }.unwrap();

    let tag = format!("rc{}", std::process::id());
    let tmp = tempfile::Builder::new().prefix(&tag).tempdir().unwrap();
    let root = tmp.path();
    let tenants = vec![format!("{tag}a"), format!("{tag}b")];
    let users: Vec<String> = tenants.iter().map(|t| format!("{t}u")).collect();
    let _guard = Guard {
        tenants: tenants.clone(),
        users: users.clone(),
    };
    for (t, u) in tenants.iter().zip(&users) {
        sh("groupadd", &[t]);
        sh(
            "useradd",
            &["-M", "-N", "-g", t, "-s", "/usr/sbin/nologin", u],
        );
    }
    std::fs::create_dir(root.join("scratch")).unwrap();
    nvml_fixture(root, 2);
    let mut text = TenancyToml::under("rel", root);
    text.nvml_stand_in(root, &shim);
    text.tier("internal").mig_profiles(["1g.18gb"]);
    text.tier("keeper")
        .mig_profiles(["1g.18gb"])
        .scratch_on_exit(ScratchOnExit::Retain)
        .retain_days(2);
    text.tenant(&tenants[0])
        .tier("internal")
        .groups([&tenants[0]]);
    text.tenant(&tenants[1])
        .tier("keeper")
        .groups([&tenants[1]]);
    let text = text.to_string();
    let cfg_path = root.join("tenancy.toml");
    std::fs::write(&cfg_path, &text).unwrap();
    let config = Config::parse(&text, &cfg_path).unwrap();
    tenancy_network::apply(&layers::network::firewall_spec(&config).unwrap()).unwrap();

    // Two jobs through the real prolog: 11 (Slurm no longer runs it) and 12 (still running).
    let prolog = |job: u64, t: usize| {
        let vars: Vec<(OsString, OsString)> = [
            ("SLURM_JOB_ID", job.to_string()),
            ("SLURM_JOB_UID", id("-u", &users[t]).to_string()),
            ("SLURM_JOB_GID", id("-g", &users[t]).to_string()),
            ("SLURM_JOB_USER", users[t].clone()),
            ("SLURMD_NODENAME", "node1".into()),
            ("SPANK_TENANCY_TENANT", tenants[t].clone()),
            ("SPANK_TENANCY_MIG", "1g.18gb".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .collect();
        let mut spine = Spine::new(&config, layers::for_node(&config), "tenancy-prolog").unwrap();
        let end = spine.prolog(JobContext::from_vars(vars));
        assert_eq!(end.code, 0, "{}", end.message);
    };
    prolog(11, 0);
    prolog(12, 1);
    // 13 as a power loss leaves it: its journal file was written but never synced (empty now),
    // and its intents are in the node's intent log, recorded in an earlier boot.
    prolog(13, 0);
    let state = root.join("state");
    let log = IntentLog::open_existing(&state).unwrap().unwrap();
    let rec = log
        .records()
        .unwrap()
        .into_iter()
        .find(|r| r.job_id == 13)
        .unwrap();
    log.write(rec.slot, 13, &[0xee; 16], &rec.payload).unwrap();
    drop(log);
    std::fs::write(state.join("job_13.json"), b"").unwrap();
    assert_eq!(gis(root), 3);

    // Orphans no journal owns.
    let mig = tenancy_mig::Mig::open(Some(&shim)).unwrap();
    make_slice(&mig, &tenants[0]);
    drop(mig);
    assert_eq!(gis(root), 4);
    let orphan_cg = Path::new(CGROUP2)
        .join("tenancy")
        .join(&tenants[0])
        .join("job_77");
    let params = tenancy_devices::JobDeviceParams {
        job_id: 77,
        tenant: tenants[0].clone(),
        slices: vec![],
        extra: vec![],
        driver: tenancy_devices::DriverPaths {
            proc_devices: config.node.proc_devices.clone(),
            mig_minors: config.node.mig_minors.clone(),
            rdma_devices: config.node.rdma_devices.clone(),
            nvidia_caps: config.node.nvidia_caps_dir.clone(),
        },
        target: tenancy_devices::Target::Owned {
            root: CGROUP2.into(),
            backend: tenancy_devices::Backend::V2,
        },
    };
    let rec = tenancy_devices::setup(&params).unwrap();
    assert!(rec.v2.is_some() && orphan_cg.is_dir());
    let gid_a = id("-g", &users[0]);
    let spec = |job: u64, t: usize| tenancy_scratch::ScratchSpec {
        root: root.join("scratch"),
        tenant: tenants[t].clone(),
        tenant_gid: id("-g", &users[t]),
        job_id: job,
        uid: id("-u", &users[t]),
        gid: id("-g", &users[t]),
        mode: 0o700,
        quota: None,
        tenant_groups: Vec::new(),
    };
    tenancy_scratch::create(&spec(88, 0)).unwrap();
    std::fs::write(spec(88, 0).job_dir().join("data"), b"left behind").unwrap();
    let _ = gid_a;
    // Retained 10 days ago (past the 2 days), and 1 day ago (kept).
    tenancy_scratch::create(&spec(98, 1)).unwrap();
    tenancy_scratch::retain(
        &spec(98, 1),
        SystemTime::now() - Duration::from_secs(10 * 86_400),
    )
    .unwrap();
    tenancy_scratch::create(&spec(99, 1)).unwrap();
    tenancy_scratch::retain(
        &spec(99, 1),
        SystemTime::now() - Duration::from_secs(86_400),
    )
    .unwrap();

    // 14: a journal of an earlier boot (intents only) whose slice sat where live job 12's sits
    // now: a copy of 12's with its own scratch folder. Its MIG, device and network steps died
    // with the restart; undoing them would destroy job 12's slice and cgroup.
    let journals = tenancy_job::JournalDir::open(&state).unwrap();
    let mut old = journals.load(12).unwrap().unwrap();
    old.job_id = 14;
    old.boot_id = Some("ee".repeat(16));
    old.started = tenancy_job::intent_log::booted_at().unwrap() - chrono::Duration::hours(2);
    old.intent_slot = None;
    for step in &mut old.steps {
        step.state = tenancy_job::StepState::Intended;
        step.made = None;
        if step.layer == "scratch" {
            step.intent["spec"]["job_id"] = 14.into();
            step.intent["on_exit"] = "wipe".into();
        }
    }
    journals.save(&old, false).unwrap();
    tenancy_scratch::create(&spec(14, 1)).unwrap();

    let running = root.join("running");
    std::fs::write(&running, "12\n").unwrap();
    let running_arg = running.to_str().unwrap();
    let apply = [
        "--apply",
        "--format",
        "json",
        "--running-jobs-from",
        running_arg,
    ];
    let only = |args: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        for t in &tenants {
            v.push("--tenant".into());
            v.push(t.clone());
        }
        v
    };
    let run = |args: &[&str]| {
        let a = only(args);
        reconcile(&cfg_path, &a.iter().map(String::as_str).collect::<Vec<_>>())
    };

    // Dry run: everything is found, nothing changes, exit 1 (something is left).
    let out = run(&["--format", "json", "--running-jobs-from", running_arg]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let found = kinds(&rows(&out));
    let w = "would remove".to_string();
    assert_eq!(
        found,
        vec![
            ("cgroup".into(), Some(77), w.clone()),
            ("journal".into(), Some(11), w.clone()),
            ("journal".into(), Some(13), w.clone()),
            ("journal".into(), Some(13), "would restore".into()),
            ("journal".into(), Some(14), w.clone()),
            ("mig".into(), None, w.clone()),
            ("retained".into(), Some(98), w.clone()),
            ("scratch".into(), Some(88), w.clone()),
        ],
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(gis(root), 4);
    assert!(orphan_cg.is_dir() && spec(88, 0).job_dir().is_dir());
    assert_eq!(std::fs::read(state.join("job_13.json")).unwrap(), b"");
    assert!(root.join("state/job_11.json").exists());
    let audit_len = |p: &Path| {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .lines()
            .count()
    };
    let before = audit_len(&config.cluster.audit_log);

    // Without Slurm: no journal is touched, and the output says so; orphans are still judged
    // against every journal (so job 11's resources are not orphans).
    let out = run(&["--format", "json", "--squeue", "/nonexistent/squeue"]);
    assert_eq!(out.status.code(), Some(1));
    let r = rows(&out);
    let slurm: Vec<&Value> = r.iter().filter(|r| r["kind"] == "slurm").collect();
    assert_eq!(slurm.len(), 1, "{r:?}");
    assert!(slurm[0]["finding"]
        .as_str()
        .unwrap()
        .contains("Slurm cannot be asked"));
    assert!(slurm[0]["action"]
        .as_str()
        .unwrap()
        .contains("4 journal(s) not checked, none touched"));
    // (restoring a journal needs no answer from Slurm; a dry run only says so)
    let journals: Vec<_> = kinds(&r).into_iter().filter(|k| k.0 == "journal").collect();
    assert_eq!(
        journals,
        [("journal".into(), Some(13), "would restore".into())]
    );

    // Apply.
    let out = run(&apply);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let done = kinds(&rows(&out));
    assert!(
        done.iter()
            .all(|(_, j, a)| a == "removed" || (*j == Some(13) && a == "restored")),
        "{done:?}"
    );
    assert_eq!(done.len(), 8, "{done:?}");
    assert!(done.contains(&("journal".into(), Some(14), "removed".into())));
    let r14 = rows(&out).into_iter().find(|r| r["job_id"] == 14).unwrap();
    assert!(
        r14["finding"]
            .as_str()
            .unwrap()
            .contains("started before the node restarted"),
        "{r14}"
    );
    assert!(done.contains(&("journal".into(), Some(13), "removed".into())));
    // Left: job 12's slice, cgroup, scratch and journal; the young retained folder.
    assert_eq!(gis(root), 1);
    assert!(!orphan_cg.exists());
    assert!(!Path::new(CGROUP2)
        .join("tenancy")
        .join(&tenants[0])
        .join("job_11")
        .exists());
    assert!(Path::new(CGROUP2)
        .join("tenancy")
        .join(&tenants[1])
        .join("job_12")
        .is_dir());
    assert!(!spec(88, 0).job_dir().exists());
    assert!(!spec(11, 0).job_dir().exists());
    assert!(!spec(13, 0).job_dir().exists());
    assert!(!Path::new(CGROUP2)
        .join("tenancy")
        .join(&tenants[0])
        .join("job_13")
        .exists());
    assert!(spec(12, 1).job_dir().is_dir());
    assert!(!root.join("state/job_11.json").exists());
    assert!(!root.join("state/job_13.json").exists());
    // Job 14's folder is gone; job 12's slice, cgroup and folder were not touched (above).
    assert!(!spec(14, 1).job_dir().exists());
    assert!(!root.join("state/job_14.json").exists());
    // The intent log holds only the live job.
    let held: Vec<u64> = IntentLog::open_existing(&state)
        .unwrap()
        .unwrap()
        .records()
        .unwrap()
        .iter()
        .map(|r| r.job_id)
        .collect();
    assert_eq!(held, [12]);
    assert!(root.join("state/job_12.json").exists());
    // The occupancy index placement reads lists only the live job.
    let index = tenancy_job::JournalDir::open(&config.cluster.state_dir)
        .unwrap()
        .occupants(0)
        .unwrap();
    let ids: Vec<u64> = index.iter().map(|o| o.job_id).collect();
    assert_eq!(ids, [12], "{index:?}");
    let retained: Vec<String> = std::fs::read_dir(spec(99, 1).tenant_dir().join(".retained"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(retained.len(), 1);
    assert!(retained[0].starts_with("job_99."), "{retained:?}");

    // Every action is audited, in a valid chain.
    let recs: Vec<Record> = std::fs::read_to_string(&config.cluster.audit_log)
        .unwrap()
        .lines()
        .skip(before)
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // Seven actions, then the admin's command itself (issue 43).
    assert_eq!(recs.len(), 8, "{recs:?}");
    let (actions, admin) = recs.split_at(7);
    assert!(actions.iter().all(|r| r.event == Event::Reconcile
        && r.outcome == Outcome::Success
        && r.origin == "tenancyctl"));
    assert_eq!(admin[0].event, Event::AdminAction, "{admin:?}");
    assert!(
        admin[0].command.as_deref().unwrap().contains("reconcile"),
        "{admin:?}"
    );
    assert!(recs.iter().any(|r| r.job_id == Some(11)));
    assert!(verify_paths(
        std::slice::from_ref(&config.cluster.audit_log),
        &AnchorSet::default(),
        5
    )
    .unwrap()
    .is_clean());

    // A second run finds nothing; table output says so. Slurm is asked through --squeue: a
    // stand-in that checks its arguments (the node's jobs, and every job of the cluster) and
    // names job 12.
    let squeue = root.join("squeue");
    std::fs::write(
        &squeue,
        "#!/bin/sh\ncase \"$*\" in \"-h -o %A -w node1\"|\"-h -a -o %A\") echo 12 ;;\n\
         *) echo \"bad args: $*\" >&2; exit 1 ;; esac\n",
    )
    .unwrap();
    std::fs::set_permissions(&squeue, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = run(&["--apply", "--squeue", squeue.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("nothing to reconcile"));

    // An orphan cgroup that still holds a process: reconcile does not kill what it cannot
    // attribute; it fails loudly (exit 1), audits the failure, and succeeds once it is empty.
    let busy = Path::new(CGROUP2)
        .join("tenancy")
        .join(&tenants[0])
        .join("job_78");
    let rec = tenancy_devices::setup(&tenancy_devices::JobDeviceParams {
        job_id: 78,
        ..params.clone()
    })
    .unwrap();
    assert_eq!(rec.cgroup_dir, busy);
    let mut sleeper = Command::new("/bin/sleep").arg("60").spawn().unwrap();
    std::fs::write(busy.join("cgroup.procs"), sleeper.id().to_string()).unwrap();
    let out = run(&apply);
    assert_eq!(out.status.code(), Some(1));
    let r = rows(&out);
    assert_eq!(r.len(), 1, "{r:?}");
    let action = r[0]["action"].as_str().unwrap();
    assert!(
        action.starts_with("failed: ") && action.contains("processes are still in the cgroup"),
        "{action}"
    );
    assert!(busy.is_dir());
    // The failed action, then the admin's command that left it (exit 1).
    let tail: Vec<Record> = std::fs::read_to_string(&config.cluster.audit_log)
        .unwrap()
        .lines()
        .rev()
        .take(2)
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        (tail[1].event.clone(), tail[1].outcome, tail[1].job_id),
        (Event::Reconcile, Outcome::Failure, Some(78))
    );
    assert_eq!(
        (tail[0].event.clone(), tail[0].outcome),
        (Event::AdminAction, Outcome::Failure)
    );
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    let out = run(&[
        "--apply",
        "--format",
        "csv",
        "--running-jobs-from",
        running_arg,
    ]);
    assert_eq!(out.status.code(), Some(0));
    let csv = String::from_utf8_lossy(&out.stdout);
    assert!(
        csv.starts_with("kind,job,tenant,resource,finding,action\n"),
        "{csv}"
    );
    assert!(csv.contains(",78,") && csv.contains(",removed"), "{csv}");
    assert!(!busy.exists());

    // The live job ends normally.
    let end = Spine::new(&config, layers::for_node(&config), "tenancy-epilog")
        .unwrap()
        .epilog(
            &JobContext::from_vars(
                [
                    ("SLURM_JOB_ID", "12".to_string()),
                    ("SLURM_JOB_UID", id("-u", &users[1]).to_string()),
                    ("SLURM_JOB_GID", id("-g", &users[1]).to_string()),
                    ("SLURM_JOB_USER", users[1].clone()),
                    ("SLURMD_NODENAME", "node1".into()),
                ]
                .into_iter()
                .map(|(k, v)| (OsString::from(k), OsString::from(v))),
            )
            .unwrap(),
        );
    assert_eq!(end.code, 0, "{}", end.message);
    assert_eq!(gis(root), 0);
}

/// `root/tenancy.toml`: state, audit log and scratch under `root`, retention 2 days, one tenant
/// of group root; `cluster` sets more `[cluster]` keys.
fn small_config(root: &Path, tenant: &str, cluster: impl FnOnce(&mut TenancyToml)) -> PathBuf {
    std::fs::create_dir_all(root.join("scratch")).unwrap();
    let path = root.join("tenancy.toml");
    let mut c = TenancyToml::under("rel", root);
    cluster(&mut c);
    c.tier("keeper")
        .scratch_on_exit(ScratchOnExit::Retain)
        .retain_days(2);
    c.tenant(tenant).tier("keeper").groups(["root"]);
    std::fs::write(&path, c.to_string()).unwrap();
    path
}

/// As root (None, skipped, otherwise): a tenant named `prefix` and this process's id, a temp
/// folder with its [`small_config`] and an empty state folder.
fn small_node(prefix: &str) -> Option<(String, tempfile::TempDir, PathBuf)> {
    if !need_root() {
        return None;
    }
    let tenant = format!("{prefix}{}", std::process::id());
    let tmp = tempfile::Builder::new().prefix(&tenant).tempdir().unwrap();
    let cfg = small_config(tmp.path(), &tenant, |_| {});
    std::fs::create_dir(tmp.path().join("state")).unwrap();
    Some((tenant, tmp, cfg))
}

/// Scratch of job `job` of `tenant` (group root; the job runs as nobody) under `root/scratch`.
fn root_spec(root: &Path, tenant: &str, job: u64) -> tenancy_scratch::ScratchSpec {
    tenancy_scratch::ScratchSpec {
        root: root.join("scratch"),
        tenant: tenant.into(),
        tenant_gid: 0,
        job_id: job,
        uid: 65534,
        gid: 65534,
        mode: 0o700,
        quota: None,
        tenant_groups: Vec::new(),
    }
}

fn audit_records(path: &Path) -> Vec<Record> {
    tenancy_test_support::json_lines(path)
}

#[test]
fn reconcile_purges_past_a_retained_folder_it_cannot_remove_and_audits_both() {
    if !need_root() {
        return;
    }
    let tenant = format!("rp{}", std::process::id());
    let tmp = tempfile::Builder::new().prefix(&tenant).tempdir().unwrap();
    let root = tmp.path();
    let cfg = small_config(root, &tenant, |_| {});
    // Jobs 1, 2 and 3 retained 10 days ago (past the 2 days); 2, sorted between the others,
    // holds a file not even root can remove.
    let mut retained = Vec::new();
    for job in 1..=3 {
        let spec = root_spec(root, &tenant, job);
        let c = tenancy_scratch::create(&spec).unwrap();
        std::fs::write(c.path.join("data"), b"kept for a while").unwrap();
        let tenancy_scratch::Retained::Moved { to, .. } =
            tenancy_scratch::retain(&spec, SystemTime::now() - Duration::from_secs(10 * 86_400))
                .unwrap()
        else {
            panic!()
        };
        retained.push(to);
    }
    let Some(_pin) = Immutable::set(&retained[1].join("data")) else {
        return;
    };
    let out = apply_with_no_job_running(&cfg, root, &tenant, &[]);
    let r = rows(&out);
    assert_eq!(out.status.code(), Some(1), "{r:?}");
    let got: Vec<(&str, Option<u64>, &str)> = r
        .iter()
        .map(|r| {
            (
                r["kind"].as_str().unwrap(),
                r["job_id"].as_u64(),
                r["resource"].as_str().unwrap(),
            )
        })
        .collect();
    let paths: Vec<String> = retained.iter().map(|p| p.display().to_string()).collect();
    assert_eq!(
        got,
        [
            ("retained", Some(1), paths[0].as_str()),
            ("retained", Some(2), paths[1].as_str()),
            ("retained", Some(3), paths[2].as_str())
        ],
        "{r:?}"
    );
    assert_eq!(r[0]["action"], "removed");
    assert_eq!(r[2]["action"], "removed");
    let failed = r[1]["action"].as_str().unwrap();
    assert!(
        failed.starts_with("failed: ")
            && failed.contains(&format!("{}/data", paths[1]))
            && failed.contains("Operation not permitted"),
        "{failed}"
    );
    assert!(!retained[0].exists() && !retained[2].exists());
    assert!(retained[1].join("data").exists());

    // Both removals and the failure are audited.
    let recs = audit_records(&root.join("audit.jsonl"));
    let got: Vec<_> = recs
        .iter()
        .map(|r| (r.event.clone(), r.outcome, r.job_id))
        .collect();
    assert_eq!(
        got,
        [
            (Event::Reconcile, Outcome::Success, Some(1)),
            (Event::Reconcile, Outcome::Failure, Some(2)),
            (Event::Reconcile, Outcome::Success, Some(3)),
            // The admin's command, which left something (exit 1).
            (Event::AdminAction, Outcome::Failure, None),
        ],
        "{recs:?}"
    );
}

/// Removes the test's product cgroups (children first) on drop.
struct CgroupGuard(PathBuf);

impl Drop for CgroupGuard {
    fn drop(&mut self) {
        if let Ok(rd) = std::fs::read_dir(&self.0) {
            for e in rd.flatten() {
                let _ = std::fs::remove_dir(e.path());
            }
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn reconcile_keeps_what_an_unreadable_journal_may_own() {
    let Some((shim, _env)) = root_and_stand_in() else {
        return;
    };
    let tenant = format!("ru{}", std::process::id());
    let tmp = tempfile::Builder::new().prefix(&tenant).tempdir().unwrap();
    let root = tmp.path();
    let fixture = nvml_fixture(root, 1);
    let cfg = small_config(root, &tenant, |c| {
        c.cluster().nvml_library(&shim).nvml_shim_fixture(&fixture);
    });
    // Job 21's journal is garbage (corrupt, or of a newer format); job 22 has none.
    std::fs::create_dir(root.join("state")).unwrap();
    let journal = root.join("state/job_21.json");
    std::fs::write(&journal, b"{\"format\": 99, \"steps\": [").unwrap();
    for job in [21, 22] {
        tenancy_scratch::create(&root_spec(root, &tenant, job)).unwrap();
    }
    let tdir = Path::new(CGROUP2).join("tenancy").join(&tenant);
    let _cg = CgroupGuard(tdir.clone());
    for job in [21, 22] {
        std::fs::create_dir_all(tdir.join(format!("job_{job}"))).unwrap();
    }
    // A GPU instance no readable journal references: it may be job 21's.
    std::env::set_var("NVML_SHIM_FIXTURE", &fixture);
    let mig = tenancy_mig::Mig::open(Some(&shim)).unwrap();
    make_slice(&mig, &tenant);
    drop(mig);
    assert_eq!(gis(root), 1);
    let out = apply_with_no_job_running(&cfg, root, &tenant, &[]);
    let r = rows(&out);
    assert_eq!(out.status.code(), Some(1), "{r:?}");
    let kept = "left: kept: Slurm may still run the job; inspect its journal".to_string();
    assert_eq!(
        kinds(&r),
        [
            ("cgroup".into(), Some(21), kept.clone()),
            ("cgroup".into(), Some(22), "removed".into()),
            (
                "journal".into(),
                Some(21),
                "left: inspect it; its resources are treated as owned".into()
            ),
            ("mig".into(), None, "left: MIG instances not checked".into()),
            (
                "occupancy".into(),
                None,
                "left: kept as it is (its entries still refuse sharing); rerun once every \
                 journal reads"
                    .into()
            ),
            ("scratch".into(), Some(21), kept),
            ("scratch".into(), Some(22), "removed".into()),
        ],
        "{r:?}"
    );
    let finding = |kind: &str, job: Option<u64>| {
        r.iter()
            .find(|r| r["kind"] == kind && r["job_id"].as_u64() == job)
            .unwrap()["finding"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(
        finding("cgroup", Some(21)),
        "product cgroup of a job whose journal is unreadable"
    );
    assert_eq!(
        finding("scratch", Some(21)),
        "job folder of a job whose journal is unreadable"
    );
    assert!(
        finding("mig", None).contains("job(s) 21 is unreadable"),
        "{r:?}"
    );
    // Job 21's folder, cgroup, GPU instance and journal are there; job 22's are gone.
    assert!(root_spec(root, &tenant, 21).job_dir().is_dir());
    assert!(tdir.join("job_21").is_dir());
    assert_eq!(gis(root), 1);
    assert!(journal.exists());
    assert!(!root_spec(root, &tenant, 22).job_dir().exists());
    assert!(!tdir.join("job_22").exists());
}

/// A scratch_root the nodes share (Lustre, GPFS, NFS) holds the job folders of jobs running on
/// other nodes, which no journal of this node owns: reconcile removes a job folder only when
/// Slurm no longer has its job anywhere, and touches none when Slurm cannot be asked.
#[test]
fn reconcile_leaves_the_scratch_of_jobs_running_on_other_nodes() {
    let Some((tenant, tmp, cfg)) = small_node("rs") else {
        return;
    };
    let root = tmp.path();
    // No journal here for either: job 41 runs on another node, job 42 has ended.
    for job in [41, 42] {
        tenancy_scratch::create(&root_spec(root, &tenant, job)).unwrap();
    }
    let folder = |job: u64| root.join(format!("scratch/{tenant}/job_{job}"));

    // Slurm cannot be asked: no job folder is judged.
    let out = reconcile(
        &cfg,
        &[
            "--apply",
            "--format",
            "json",
            "--squeue",
            "/bin/false",
            "--tenant",
            &tenant,
        ],
    );
    let r = rows(&out);
    assert_eq!(out.status.code(), Some(1), "{r:?}");
    assert!(
        r.iter().any(|row| row["kind"] == "scratch"
            && row["action"]
                .as_str()
                .unwrap()
                .starts_with("left: job folders not checked")),
        "{r:?}"
    );
    assert!(folder(41).is_dir() && folder(42).is_dir());

    // Slurm has job 41 (elsewhere), not job 42.
    let known = root.join("known");
    std::fs::write(&known, "41\n").unwrap();
    let out = apply_with_no_job_running(
        &cfg,
        root,
        &tenant,
        &["--known-jobs-from", known.to_str().unwrap()],
    );
    let r = rows(&out);
    assert_eq!(out.status.code(), Some(0), "{r:?}");
    assert_eq!(
        kinds(&r),
        [("scratch".into(), Some(42), "removed".into())],
        "{r:?}"
    );
    assert!(
        folder(41).is_dir(),
        "job 41's folder, of a job Slurm still runs, was removed"
    );
    assert!(!folder(42).exists());
}

/// After a restart, an intent log record of an earlier boot that this build cannot read as a
/// journal names its job: the job's scratch folder and cgroup are kept, not judged orphans.
#[test]
fn reconcile_keeps_what_an_unreadable_intent_record_may_own() {
    let Some((tenant, tmp, cfg)) = small_node("ri") else {
        return;
    };
    let root = tmp.path();
    let mut log = tenancy_job::intent_log::IntentLog::open(&root.join("state")).unwrap();
    let slot = log.claim(|_| false).unwrap().unwrap();
    log.write(slot, 23, &[0xee; 16], b"{\"format\": 99")
        .unwrap();
    drop(log);
    tenancy_scratch::create(&root_spec(root, &tenant, 23)).unwrap();
    let tdir = Path::new(CGROUP2).join("tenancy").join(&tenant);
    let _cg = CgroupGuard(tdir.clone());
    std::fs::create_dir_all(tdir.join("job_23")).unwrap();
    let out = apply_with_no_job_running(&cfg, root, &tenant, &[]);
    let r = rows(&out);
    assert_eq!(out.status.code(), Some(1), "{r:?}");
    let kept = "left: kept: Slurm may still run the job; inspect its journal".to_string();
    let k = kinds(&r);
    assert!(
        k.contains(&("cgroup".into(), Some(23), kept.clone())),
        "{r:?}"
    );
    assert!(k.contains(&("scratch".into(), Some(23), kept)), "{r:?}");
    assert!(tdir.join("job_23").is_dir());
    assert!(root.join(format!("scratch/{tenant}/job_23")).is_dir());
}

/// An epilog killed between its journal's removal and the `- N` line (or a crash: the index is
/// not synced) left an occupancy entry without a journal, which refuses tiers that do not share
/// the node until the index is rebuilt: `--apply` rebuilds it from the journals.
#[test]
fn reconcile_rebuilds_an_occupancy_index_that_lists_a_job_without_a_journal() {
    let Some((tenant, tmp, cfg)) = small_node("ro") else {
        return;
    };
    let root = tmp.path();
    let index = root.join("state/occupancy");
    std::fs::write(&index, "+ 31 globex internal 1 0 -\n").unwrap();
    let dir = tenancy_job::JournalDir::open(&root.join("state")).unwrap();
    assert_eq!(dir.occupants(0).unwrap().len(), 1);

    // A dry run changes nothing.
    let running = root.join("running");
    std::fs::write(&running, "").unwrap();
    let out = reconcile(
        &cfg,
        &[
            "--format",
            "json",
            "--running-jobs-from",
            running.to_str().unwrap(),
        ],
    );
    assert_eq!(kinds(&rows(&out)), [], "{out:?}");
    assert_eq!(dir.occupants(0).unwrap().len(), 1);

    let out = apply_with_no_job_running(&cfg, root, &tenant, &[]);
    let r = rows(&out);
    assert_eq!(out.status.code(), Some(0), "{r:?}");
    assert_eq!(
        kinds(&r),
        [("occupancy".into(), None, "rebuilt".into())],
        "{r:?}"
    );
    assert!(
        r[0]["finding"].as_str().unwrap().contains("listed jobs 31"),
        "{r:?}"
    );
    assert_eq!(dir.occupants(0).unwrap(), vec![]);
    // A second pass finds the index as the journals say.
    let out = apply_with_no_job_running(&cfg, root, &tenant, &[]);
    assert_eq!(kinds(&rows(&out)), [], "{out:?}");
}
