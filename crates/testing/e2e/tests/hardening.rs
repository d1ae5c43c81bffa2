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
use std::process::Command;
use std::time::{Duration, Instant};
use tenancy_e2e::{probe_kv, scenario, text, wait_output, Env, Options, TestUser};

/// An account slurmctld itself takes but the prolog would refuse is refused at submission, with
/// the prolog's words: no job, no drain.
fn account_is_refused_at_submit(e: &Env, account: &str, reason: &str) {
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
    let job = e.probe_job(user, "plain", &["env"]);
    let args = ["--tenant=acme", "--account=acme"];
    e.completes(user, &args, &job, Duration::from_secs(90));
    e.assert_node_idle();
}

scenario!(
    bad_account_is_refused_at_submit_not_drained,
    Options::default(),
    |e: &mut Env| account_is_refused_at_submit(e, "bad acct", "is not a plain name: 'bad acct'")
);

scenario!(
    long_account_is_refused_at_submit_not_drained,
    Options::default(),
    |e: &mut Env| account_is_refused_at_submit(e, &"a".repeat(200), "bytes long (at most 128)")
);

// A user name as sssd gives it with `use_fully_qualified_names` (`name@domain`) runs: the
// prolog takes what NSS and Slurm give.
scenario!(
    qualified_user_name_runs,
    Options::default(),
    |e: &mut Env| {
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
        let job = e.probe_job(&user, "qualified", &["env"]);
        let out = job.out.clone();
        let id = e.completes(&user, &["--tenant=acme"], &job, Duration::from_secs(90));
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
);

/// An acme job (with `args`) that reports and holds until its release file exists, running;
/// returns its id, what it reported and the release file.
fn acme_holds(e: &Env, name: &str, args: &[&str]) -> (u64, String, PathBuf) {
    let release = e.stack.cluster.path(&format!("jobs/release-{name}"));
    let job = e.probe_job(
        &e.t.acme1,
        name,
        &[&format!("envwait {}", release.display())],
    );
    let a = e.sbatch(&e.t.acme1, args, &job);
    let text = wait_output(&job.out, "uid=", Duration::from_secs(60));
    (a, text, release)
}

/// Job `g` still waits (for a node of its own), the node taking jobs.
fn still_pending(e: &Env, g: u64) {
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(
        e.job_state(g),
        "PENDING",
        "{:?}",
        e.stack.cluster.job_info(g)
    );
}

// A job of a tier that shares no node, submitted without `--exclusive` while another
// tenant's job runs, waits for a node of its own instead of landing beside it (where the
// prolog would refuse it and drain the node); `--oversubscribe` is refused with the reason.
scenario!(
    share_node_false_job_is_made_exclusive,
    Options::default(),
    |e: &mut Env| {
        e.edit_config(
            "share_gpu = false\nshare_node = true",
            "share_gpu = false\nshare_node = false",
        );
        let (a, _, release) = acme_holds(e, "node", &["--tenant=acme"]);

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

        let g_job = e.probe_job(&e.t.globex1, "alone", &["env"]);
        let g_out = g_job.out.clone();
        let g = e.sbatch(&e.t.globex1, &["--tenant=globex"], &g_job);
        let info = e.stack.cluster.job_info(g).unwrap();
        assert_eq!(info["OverSubscribe"], "NO", "not made exclusive: {info:?}");
        // The node has a free CPU, but the job waits for a node of its own.
        still_pending(e, g);
        assert_eq!(e.job_state(a), "RUNNING");
        e.assert_node_idle();
        e.end_jobs(&release, &[a, g], Duration::from_secs(90));
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
);

// A MIG job of a tier that shares no GPU (globex, share_gpu = false, the default
// `gpu_placement = "node"`) never lands on a GPU another tenant holds: with one MIG GPU on the
// node, held by an acme slice, it waits (a node of its own) instead of being refused on the
// node, then runs on that GPU alone.
scenario!(
    share_gpu_false_job_never_lands_on_a_shared_gpu,
    Options::default(),
    |e: &mut Env| {
        // The default placement for share_gpu = false (the stack packs globex beside acme).
        e.edit_config("gpu_placement = \"gpu\"\n", "");
        let o = e.stack.shim_ctl(&["mig", "1", "off"]).unwrap();
        assert!(o.status.success(), "{}", text(&o.stderr));
        let (a, a_text, release) = acme_holds(e, "gpu", &["--tenant=acme", "--mig=1g.18gb"]);
        assert!(probe_kv(&a_text)["CUDA_VISIBLE_DEVICES"].starts_with("MIG-"));

        let g_job = e.probe_job(&e.t.globex1, "gpu-alone", &["env"]);
        let g_out = g_job.out.clone();
        let g = e.sbatch(&e.t.globex1, &["--tenant=globex", "--mig=3g.71gb"], &g_job);
        still_pending(e, g);
        e.assert_node_idle();
        let shared_while_held: Vec<Value> = e.stack.shim_instances().unwrap();
        assert_eq!(shared_while_held.len(), 1, "{shared_while_held:?}");
        e.end_jobs(&release, &[a, g], Duration::from_secs(90));
        let k = probe_kv(&fs::read_to_string(&g_out).unwrap());
        assert!(k["CUDA_VISIBLE_DEVICES"].starts_with("MIG-"), "{k:?}");
        let events = e.stack.audit_events(g).unwrap();
        assert_eq!(events, ["job_start", "job_end"], "{events:?}");
        e.assert_node_idle();
    }
);

/// A FUSE mount the job's user leaves in `$TMPDIR` (bindfs through the setuid fusermount3;
/// root cannot enter it) is detached by the epilog before the wipe: the job ends cleanly, the
/// folder is gone, nothing stays mounted, and the job_end record names the mount.
#[test]
fn fuse_mount_in_scratch_is_detached_and_wiped() {
    if Command::new("bindfs").arg("--version").output().is_err() {
        tenancy_e2e::skip(
            "needs bindfs",
            "fuse_mount_in_scratch_is_detached_and_wiped: apt-get install bindfs \
             (scripts/install-deps --tests)",
        );
        return;
    }
    scenario(
        "fuse_mount_in_scratch_is_detached_and_wiped",
        Options::default(),
        |e: &mut Env| fuse_mount_is_detached(e),
    );
}

fn fuse_mount_is_detached(e: &Env) {
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
    let user = &e.t.acme1;
    let probe = e.probe();
    let job = e.job(
        user,
        "fuse",
        include_str!("../scripts/jobs/fuse-in-scratch.sh"),
        &[&probe],
    );
    let out = job.out.clone();
    let id = e.sbatch(user, &["--tenant=acme"], &job);
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
