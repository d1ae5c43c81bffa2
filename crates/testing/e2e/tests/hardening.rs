//! A user's submission never drains a node (issue 32), on a real local Slurm cluster with the
//! whole product: what the prolog would refuse about a job's request is refused by slurmctld's
//! job_submit/tenancy with the prolog's words (no job, node idle); names Slurm and NSS give run;
//! tier rules are met by placement (a tier that shares no node, or no GPU, gets a node of its
//! own); a FUSE mount a job leaves in its scratch folder is detached and the folder wiped.
//! Needs root; skips loudly otherwise.

use serde_json::Value;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tenancy_e2e::stack::{Stack, Tenants};
use tenancy_e2e::{probe_kv, require_root, submitted_id, TestUser, Users};

/// Users are created by name: scenarios of this binary run one after the other.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

struct Env {
    stack: Stack,
    t: Tenants,
    _users: Users,
    _root: tempfile::TempDir,
}

fn env() -> Env {
    let mut users = Users::new();
    let t = Tenants::create(&mut users).expect("users");
    let root = tempfile::Builder::new()
        .prefix("tenancy-e2e-stack-")
        .tempdir()
        .unwrap();
    let stack = Stack::start(root.path(), &t).expect("stack");
    Env {
        stack,
        t,
        _users: users,
        _root: root,
    }
}

impl Env {
    fn probe(&self) -> String {
        self.stack.bin("tenancy-e2e-probe").display().to_string()
    }

    /// A job script of `user` in their folder; returns (script, output file).
    fn script(&self, user: &TestUser, name: &str, body: &str) -> (PathBuf, PathBuf) {
        let dir = self.stack.cluster.user_dir(user);
        let script = dir.join(format!("{name}.sh"));
        fs::write(&script, format!("#!/bin/sh\n{body}")).unwrap();
        (script, dir.join(format!("{name}.out")))
    }

    fn sbatch_raw(&self, user: &TestUser, args: &[&str]) -> Output {
        let mut c = self.stack.cluster.cmd_as(user, "sbatch");
        c.args(args);
        self.stack.cluster.run(c).unwrap()
    }

    fn sbatch(&self, user: &TestUser, args: &[&str], script: &Path, out: &Path) -> u64 {
        let mut all: Vec<&str> = args.to_vec();
        let (o, s) = (out.display().to_string(), script.display().to_string());
        all.extend(["-o", &o, &s]);
        let r = self.sbatch_raw(user, &all);
        assert!(
            r.status.success(),
            "sbatch {args:?} as {}: {}",
            user.name,
            text(&r.stderr)
        );
        submitted_id(&r).unwrap()
    }

    /// No job exists, and the node is idle with no drain reason.
    fn assert_no_job_and_node_idle(&self) {
        let mut q = self.stack.cluster.cmd("squeue");
        q.args(["-h", "-a", "-o", "%A"]);
        let queued = text(&self.stack.cluster.run(q).unwrap().stdout);
        assert_eq!(queued.trim(), "", "jobs were made: {queued}");
        self.assert_node_idle();
    }

    fn assert_node_idle(&self) {
        let state = self.stack.cluster.node_state().unwrap();
        let reason = self.stack.cluster.node_reason().unwrap();
        assert!(
            matches!(state.as_str(), "idle" | "alloc" | "mix") && reason.is_empty(),
            "node is {state} ({reason})"
        );
    }

    /// Rewrites the stack's tenancy.toml (read on every submission and every prolog).
    fn edit_config(&self, from: &str, to: &str) {
        let text = fs::read_to_string(&self.stack.config).unwrap();
        assert!(text.contains(from), "{from:?} not in the config");
        fs::write(&self.stack.config, text.replacen(from, to, 1)).unwrap();
    }

    fn job_state(&self, id: u64) -> String {
        self.stack.cluster.job_info(id).unwrap()["JobState"].clone()
    }
}

fn wait_output(path: &Path, prefix: &str, timeout: Duration) -> String {
    let t = Instant::now();
    loop {
        let s = fs::read_to_string(path).unwrap_or_default();
        if s.lines().any(|l| l.starts_with(prefix)) {
            return s;
        }
        assert!(
            t.elapsed() < timeout,
            "no {prefix:?} in {} after {timeout:?}: {s:?}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// An account slurmctld itself takes but the prolog would refuse is refused at submission, with
/// the prolog's words: no job, no drain.
fn account_is_refused_at_submit(name: &str, account: &str, reason: &str) {
    if !require_root(name) {
        return;
    }
    let _g = serial();
    let e = env();
    let user = &e.t.acme1;
    let acct = format!("--account={account}");
    let o = e.sbatch_raw(user, &["--tenant=acme", &acct, "--wrap", "true"]);
    let err = text(&o.stderr);
    assert!(
        !o.status.success(),
        "sbatch with account {account:?} was accepted: {}",
        text(&o.stdout)
    );
    assert!(err.contains(reason), "sbatch: {err}");
    assert!(err.contains("SLURM_JOB_ACCOUNT"), "sbatch: {err}");
    e.assert_no_job_and_node_idle();
    // The same user with a plain account runs (the refusal was the account's).
    let (script, out) = e.script(user, "plain", &format!("{} env\n", e.probe()));
    let id = e.sbatch(user, &["--tenant=acme", "--account=acme"], &script, &out);
    let info = e
        .stack
        .cluster
        .wait_job_done(id, Duration::from_secs(90))
        .unwrap();
    assert_eq!(info["JobState"], "COMPLETED", "{info:?}");
    e.assert_node_idle();
}

#[test]
fn bad_account_is_refused_at_submit_not_drained() {
    account_is_refused_at_submit(
        "bad_account_is_refused_at_submit_not_drained",
        "bad acct",
        "is not a plain name: 'bad acct'",
    );
}

#[test]
fn long_account_is_refused_at_submit_not_drained() {
    account_is_refused_at_submit(
        "long_account_is_refused_at_submit_not_drained",
        &"a".repeat(200),
        "bytes long (at most 128)",
    );
}

/// A user name as sssd gives it with `use_fully_qualified_names` (`name@domain`) runs: the
/// prolog takes what NSS and Slurm give.
#[test]
fn qualified_user_name_runs() {
    if !require_root("qualified_user_name_runs") {
        return;
    }
    let _g = serial();
    let e = env();
    let name = format!("jdoe{}@example.org", std::process::id() % 10000);
    // useradd refuses '@' without --badname; the user is in acme through its primary group.
    let o = Command::new("useradd")
        .args([
            "--badname",
            "-M",
            "-N",
            "-d",
            "/nonexistent",
            "-s",
            "/bin/sh",
        ])
        .args(["-g", &e.t.acme_group, &name])
        .output()
        .unwrap();
    assert!(o.status.success(), "useradd: {}", text(&o.stderr));
    struct Gone(String);
    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = Command::new("userdel").arg(&self.0).output();
        }
    }
    let _gone = Gone(name.clone());
    let u = nix::unistd::User::from_name(&name).unwrap().unwrap();
    let user = TestUser {
        name: name.clone(),
        uid: u.uid.as_raw(),
        gid: u.gid.as_raw(),
        gids: vec![u.gid.as_raw()],
    };
    let (script, out) = e.script(&user, "qualified", &format!("{} env\n", e.probe()));
    let id = e.sbatch(&user, &["--tenant=acme"], &script, &out);
    let info = e
        .stack
        .cluster
        .wait_job_done(id, Duration::from_secs(90))
        .unwrap();
    assert_eq!(info["JobState"], "COMPLETED", "{info:?}");
    let k = probe_kv(&fs::read_to_string(&out).unwrap());
    assert_eq!(k["TENANCY_TENANT"], "acme", "{k:?}");
    assert_eq!(k["uid"], user.uid.to_string());
    let start = e
        .stack
        .audit_records()
        .unwrap()
        .into_iter()
        .find(|r| r["job_id"] == id && r["event"] == "job_start")
        .expect("a job_start record");
    assert_eq!(start["user"], Value::from(name));
    e.assert_node_idle();
}

/// A job of a tier that shares no node, submitted without `--exclusive` while another
/// tenant's job runs, waits for a node of its own instead of landing beside it (where the
/// prolog would refuse it and drain the node); `--oversubscribe` is refused with the reason.
#[test]
fn share_node_false_job_is_made_exclusive() {
    if !require_root("share_node_false_job_is_made_exclusive") {
        return;
    }
    let _g = serial();
    let e = env();
    e.edit_config(
        "share_gpu = false\nshare_node = true",
        "share_gpu = false\nshare_node = false",
    );
    let probe = e.probe();
    let release = e.stack.cluster.path("jobs/release-node");
    let (a_script, a_out) = e.script(
        &e.t.acme1,
        "hold",
        &format!("{probe} envwait {}\n", release.display()),
    );
    let a = e.sbatch(&e.t.acme1, &["--tenant=acme"], &a_script, &a_out);
    wait_output(&a_out, "uid=", Duration::from_secs(60));

    let over = e.sbatch_raw(
        &e.t.globex1,
        &["--tenant=globex", "--oversubscribe", "--wrap", "true"],
    );
    assert!(!over.status.success(), "--oversubscribe was accepted");
    let err = text(&over.stderr);
    assert!(
        err.contains("share_node = false") && err.contains("--oversubscribe"),
        "{err}"
    );

    let (g_script, g_out) = e.script(&e.t.globex1, "alone", &format!("{probe} env\n"));
    let g = e.sbatch(&e.t.globex1, &["--tenant=globex"], &g_script, &g_out);
    let info = e.stack.cluster.job_info(g).unwrap();
    assert_eq!(info["OverSubscribe"], "NO", "not made exclusive: {info:?}");
    // The node has a free CPU, but the job waits for a node of its own.
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(
        e.job_state(g),
        "PENDING",
        "{:?}",
        e.stack.cluster.job_info(g)
    );
    assert_eq!(e.job_state(a), "RUNNING");
    e.assert_node_idle();

    fs::write(&release, "").unwrap();
    for id in [a, g] {
        let info = e
            .stack
            .cluster
            .wait_job_done(id, Duration::from_secs(90))
            .unwrap();
        assert_eq!(info["JobState"], "COMPLETED", "job {id}: {info:?}");
    }
    assert_eq!(
        probe_kv(&fs::read_to_string(&g_out).unwrap())["TENANCY_TENANT"],
        "globex"
    );
    assert!(e
        .stack
        .audit_events(g)
        .unwrap()
        .contains(&"job_start".to_string()));
    e.assert_node_idle();
}

/// A MIG job of a tier that shares no GPU (globex, share_gpu = false, the default
/// `gpu_placement = "node"`) never lands on a GPU another tenant holds: with one MIG GPU on the
/// node, held by an acme slice, it waits (a node of its own) instead of being refused on the
/// node, then runs on that GPU alone.
#[test]
fn share_gpu_false_job_never_lands_on_a_shared_gpu() {
    if !require_root("share_gpu_false_job_never_lands_on_a_shared_gpu") {
        return;
    }
    let _g = serial();
    let e = env();
    // The default placement for share_gpu = false (the stack packs globex beside acme).
    e.edit_config("gpu_placement = \"gpu\"\n", "");
    let o = e.stack.shim_ctl(&["mig", "1", "off"]).unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let probe = e.probe();
    let release = e.stack.cluster.path("jobs/release-gpu");
    let (a_script, a_out) = e.script(
        &e.t.acme1,
        "slice",
        &format!("{probe} envwait {}\n", release.display()),
    );
    let a = e.sbatch(
        &e.t.acme1,
        &["--tenant=acme", "--mig=1g.18gb"],
        &a_script,
        &a_out,
    );
    let a_text = wait_output(&a_out, "uid=", Duration::from_secs(60));
    assert!(probe_kv(&a_text)["CUDA_VISIBLE_DEVICES"].starts_with("MIG-"));

    let (g_script, g_out) = e.script(&e.t.globex1, "gpu-alone", &format!("{probe} env\n"));
    let g = e.sbatch(
        &e.t.globex1,
        &["--tenant=globex", "--mig=3g.71gb"],
        &g_script,
        &g_out,
    );
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(
        e.job_state(g),
        "PENDING",
        "{:?}",
        e.stack.cluster.job_info(g)
    );
    e.assert_node_idle();
    let shared_while_held: Vec<Value> = e.stack.shim_instances().unwrap();
    assert_eq!(shared_while_held.len(), 1, "{shared_while_held:?}");

    fs::write(&release, "").unwrap();
    for id in [a, g] {
        let info = e
            .stack
            .cluster
            .wait_job_done(id, Duration::from_secs(90))
            .unwrap();
        assert_eq!(info["JobState"], "COMPLETED", "job {id}: {info:?}");
    }
    let k = probe_kv(&fs::read_to_string(&g_out).unwrap());
    assert!(k["CUDA_VISIBLE_DEVICES"].starts_with("MIG-"), "{k:?}");
    let events = e.stack.audit_events(g).unwrap();
    assert_eq!(events, ["job_start", "job_end"], "{events:?}");
    e.assert_node_idle();
}

/// A FUSE mount the job's user leaves in `$TMPDIR` (bindfs through the setuid fusermount3;
/// root cannot enter it) is detached by the epilog before the wipe: the job ends cleanly, the
/// folder is gone, nothing stays mounted, and the job_end record names the mount.
#[test]
fn fuse_mount_in_scratch_is_detached_and_wiped() {
    if !require_root("fuse_mount_in_scratch_is_detached_and_wiped") {
        return;
    }
    if Command::new("bindfs").arg("--version").output().is_err() {
        if std::env::var_os("CI").is_some() {
            panic!("bindfs is missing: scripts/install-deps --tests");
        }
        eprintln!(
            "SKIP fuse_mount_in_scratch_is_detached_and_wiped: no bindfs (apt-get install bindfs)"
        );
        return;
    }
    let _g = serial();
    // Unprivileged FUSE needs /dev/fuse open to users, as udev makes it on every node.
    let fuse_mode = fs::metadata("/dev/fuse").unwrap().permissions().mode() & 0o777;
    struct Mode(u32);
    impl Drop for Mode {
        fn drop(&mut self) {
            let _ = fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(self.0));
        }
    }
    let _restore = Mode(fuse_mode);
    fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(0o666)).unwrap();
    let e = env();
    let user = &e.t.acme1;
    let (script, out) = e.script(
        user,
        "fuse",
        &format!(
            "{} env\nmkdir \"$TMPDIR/src\" \"$TMPDIR/m\" && echo x > \"$TMPDIR/src/f\" && \
             bindfs --no-allow-other \"$TMPDIR/src\" \"$TMPDIR/m\" && \
             grep -c \" $TMPDIR/m \" /proc/self/mountinfo | sed 's/^/mounted=/'\n",
            e.probe()
        ),
    );
    let id = e.sbatch(user, &["--tenant=acme"], &script, &out);
    let info = e
        .stack
        .cluster
        .wait_job_done(id, Duration::from_secs(90))
        .unwrap();
    let printed = fs::read_to_string(&out).unwrap();
    let k = probe_kv(&printed);
    assert_eq!(k.get("mounted").map(String::as_str), Some("1"), "{printed}");
    assert_eq!(info["JobState"], "COMPLETED", "{info:?}");
    let tmpdir = k["TMPDIR"].clone();
    let mountpoint = format!("{tmpdir}/m");
    // The epilog ran: no mount left on the host, the folder wiped, the node not drained.
    let t = Instant::now();
    while e.stack.journal(id).unwrap().is_some() && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(200));
    }
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mountinfo.contains(&format!(" {mountpoint} ")),
        "still mounted: {mountpoint}"
    );
    assert!(!Path::new(&tmpdir).exists(), "{tmpdir} was not wiped");
    e.assert_node_idle();
    let events = e.stack.audit_events(id).unwrap();
    assert_eq!(events, ["job_start", "job_end"], "{events:?}");
    let end = e
        .stack
        .audit_records()
        .unwrap()
        .into_iter()
        .find(|r| r["job_id"] == id && r["event"] == "job_end")
        .unwrap();
    let scratch = end["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["layer"] == "scratch")
        .expect("the scratch resource")
        .clone();
    let detached = scratch["detail"]["detached_mounts"].clone();
    assert_eq!(detached, serde_json::json!([mountpoint]), "{scratch}");
}
