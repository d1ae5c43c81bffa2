//! Encrypted scratch (`scratch_encryption = "required"`, docs/encrypted-scratch.md) with the
//! real prolog and epilog (the `crash_prolog` driver), real users writing as themselves, on an
//! ext4 file system of the test's own on a loop device (`mkfs.ext4 -O encrypt`, removed after):
//! what the job writes is not on the device in clear, the epilog's key removal is an erase,
//! a retained folder opens again with `tenancyctl scratch unlock` until it expires, a scratch
//! root that cannot encrypt fails the job closed, and a prolog killed anywhere leaves no key
//! that its journal does not name.

mod common;

use common::loopfs::Kind;
use common::{built_or_skip, requires_root, text, World};
use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use tenancy_scratch::fscrypt::{self, KeyStatus};
use tenancy_scratch::KeyId;

fn marker(what: &str) -> String {
    let mut b = [0u8; 8];
    rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty()).unwrap();
    format!(
        "{what}-{}",
        b.iter().map(|x| format!("{x:02x}")).collect::<String>()
    )
}

/// The scratch step of the job's journal: (intent, made).
fn scratch_step(w: &World, job: u64) -> (serde_json::Value, serde_json::Value) {
    let s = w
        .journal_step(job, "scratch")
        .unwrap_or_else(|| panic!("job {job}: no scratch step: {}", w.journal(job)));
    (s["intent"].clone(), s["made"].clone())
}

/// The key identifier the job's journal names for its scratch.
fn journaled_key(w: &World, job: u64) -> KeyId {
    let (intent, _) = scratch_step(w, job);
    intent["key_id"]
        .as_str()
        .unwrap_or_else(|| panic!("job {job}: no key_id in the scratch intent: {intent}"))
        .parse()
        .unwrap()
}

fn scratch_root(w: &World) -> PathBuf {
    w.root.join("scratch")
}

fn root_fd(w: &World) -> OwnedFd {
    std::fs::File::open(scratch_root(w)).unwrap().into()
}

fn status(w: &World, id: KeyId) -> KeyStatus {
    fscrypt::key_status(root_fd(w), id).unwrap()
}

/// Runs `script` with sh as tenant `t`'s user (its uid, its primary group alone), with the
/// job's TMPDIR.
fn as_user(w: &World, t: usize, tmpdir: &Path, script: &str) -> Output {
    let u = &w.users[t];
    Command::new("/usr/bin/setpriv")
        .args([
            &format!("--reuid={}", u.uid),
            &format!("--regid={}", u.gid),
            "--clear-groups",
            "/bin/sh",
            "-c",
            script,
        ])
        .env_clear()
        .env("TMPDIR", tmpdir)
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap()
}

fn prolog(w: &World, job: u64, t: usize, profile: Option<&str>) {
    let out = w.run(&["prolog"], &w.job_env(job, t, profile));
    assert!(out.status.success(), "prolog of job {job}: {}", text(&out));
}

fn epilog(w: &World, job: u64, t: usize, profile: Option<&str>) {
    let out = w.run(&["epilog"], &w.job_env(job, t, profile));
    assert!(out.status.success(), "epilog of job {job}: {}", text(&out));
}

/// The job's TMPDIR, as the task entry gives it.
fn tmpdir(w: &World, job: u64) -> PathBuf {
    let (_, made) = scratch_step(w, job);
    PathBuf::from(made["path"].as_str().unwrap())
}

/// `tenancyctl reconcile --apply` with no job running, for this world's tenants alone (the
/// host's product cgroups of other tests' tenants are not this test's to judge).
fn reconcile(w: &World) -> Option<Output> {
    let none = w.root.join("no-jobs");
    std::fs::write(&none, "").unwrap();
    let mut args = vec![
        "reconcile".to_string(),
        "--apply".into(),
        "--node".into(),
        "node1".into(),
        "--running-jobs-from".into(),
        none.display().to_string(),
    ];
    for t in &w.tenants {
        args.extend(["--tenant".into(), t.clone()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    tenancyctl(w, &args)
}

/// Waits (20 s at most) until the trash of the world's scratch root holds nothing.
fn wait_trash_empty(w: &World, what: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while tenancy_scratch::trash::has_entries(&scratch_root(w)) {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: the trash was not emptied"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// `tenancyctl ARGS` with the world's config, in its network namespace.
fn tenancyctl(w: &World, args: &[&str]) -> Option<Output> {
    let bin = built_or_skip("tenancyctl")?;
    let mut full = vec!["--config", w.config_path.to_str().unwrap()];
    full.extend_from_slice(args);
    Some(w.command_of(&bin, &full, &[]).output().unwrap())
}

/// Whether reading `path` as root fails for want of its key.
fn unreadable_for_want_of_key(path: &Path) -> bool {
    match std::fs::read(path) {
        Err(e) => e.raw_os_error() == Some(libc::ENOKEY),
        Ok(_) => false,
    }
}

/// Every regular file under `dir` (names as the file system lists them now).
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let t = e.file_type().unwrap();
            if t.is_dir() {
                todo.push(e.path());
            } else if t.is_file() {
                out.push(e.path());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn scratch_is_encrypted_at_rest() {
    if !requires_root("real users, a loop device, fscrypt") {
        return;
    }
    let Some(w) = World::encrypted(1, Kind::Ext4Encrypt) else {
        return;
    };
    prolog(&w, 10, 0, None);
    let id = journaled_key(&w, 10);
    let (_, made) = scratch_step(&w, 10);
    assert_eq!(made["encrypted"]["key_id"], id.to_string(), "{made}");
    assert_eq!(status(&w, id), KeyStatus::Present);
    let dir = tmpdir(&w, 10);
    let folder: OwnedFd = std::fs::File::open(&dir).unwrap().into();
    assert_eq!(fscrypt::policy_of(&folder).unwrap(), Some(id));
    drop(folder);
    // The job's user writes a known plaintext under a known name, and reads it back.
    let name = marker("plainname");
    let secret = marker("KNOWN-PLAINTEXT");
    let out = as_user(
        &w,
        0,
        &dir,
        &format!(
            "mkdir \"$TMPDIR/sub\" && for i in $(seq 2000); do echo {secret}; done > \
             \"$TMPDIR/sub/{name}\" && grep -c {secret} \"$TMPDIR/sub/{name}\""
        ),
    );
    assert!(
        out.status.success(),
        "the job's user writes: {}",
        text(&out)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "2000");
    // A control in clear on the same device: the scan finds what is there.
    let control = marker("CONTROL-IN-CLEAR");
    std::fs::write(scratch_root(&w).join("control"), &control).unwrap();
    let fs = w.scratch_fs.as_ref().unwrap();
    assert!(
        fs.raw_contains(control.as_bytes()),
        "the scan misses data in clear"
    );
    assert!(
        !fs.raw_contains(secret.as_bytes()),
        "the job's plaintext is on the device in clear"
    );
    assert!(
        !fs.raw_contains(name.as_bytes()),
        "the job's file name is on the device in clear"
    );
    std::fs::remove_file(scratch_root(&w).join("control")).unwrap();
    epilog(&w, 10, 0, None);
    assert_eq!(status(&w, id), KeyStatus::Absent);
    assert!(!dir.exists());
}

#[test]
fn wipe_is_crypto_erase() {
    if !requires_root("real users, a loop device, fscrypt") {
        return;
    }
    let Some(w) = World::encrypted(1, Kind::Ext4Encrypt) else {
        return;
    };
    // The trash is held by this test, as a deleter at work would hold it: the one the epilog
    // starts leaves it alone, and what the key removal left is there to look at.
    let trash = scratch_root(&w).join(".trash");
    std::fs::create_dir(&trash).unwrap();
    std::fs::set_permissions(&trash, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let held: OwnedFd = std::fs::File::open(&trash).unwrap().into();
    rustix::fs::flock(&held, rustix::fs::FlockOperation::LockExclusive).unwrap();

    prolog(&w, 20, 0, None);
    let id = journaled_key(&w, 20);
    let dir = tmpdir(&w, 20);
    let secret = marker("ERASED-PLAINTEXT");
    let out = as_user(
        &w,
        0,
        &dir,
        &format!(
            "mkdir -p \"$TMPDIR/ckpt/deep\" && echo {secret} > \"$TMPDIR/a\" && echo {secret} > \
             \"$TMPDIR/ckpt/b\" && echo {secret} > \"$TMPDIR/ckpt/deep/c\""
        ),
    );
    assert!(out.status.success(), "{}", text(&out));
    // Before: root reads them.
    assert_eq!(
        std::fs::read_to_string(dir.join("ckpt/b")).unwrap().trim(),
        secret
    );
    epilog(&w, 20, 0, None);
    assert_eq!(
        status(&w, id),
        KeyStatus::Absent,
        "the key outlived the epilog"
    );
    let entry = trash.join(format!("{}.job_20.{id}", w.tenants[0]));
    assert!(entry.is_dir(), "the erased folder is not in the trash");
    assert!(!dir.exists());
    // After: the names are ciphertext, and no file opens, for root.
    let files = files_under(&entry);
    assert_eq!(files.len(), 3, "{files:?}");
    for f in &files {
        let n = f.file_name().unwrap().to_string_lossy();
        assert!(
            !["a", "b", "c"].contains(&n.as_ref()),
            "a name in clear: {n}"
        );
        assert!(unreadable_for_want_of_key(f), "root reads {}", f.display());
    }
    // The job's end record says what became of the key and the tree.
    let end = w
        .records()
        .into_iter()
        .find(|r| r.job_id == Some(20) && r.event == tenancy_audit_log::Event::JobEnd)
        .expect("job_end");
    let res = end.resources.iter().find(|r| r.layer == "scratch").unwrap();
    assert_eq!(res.detail["key_removal"], "removed", "{res:?}");
    assert_eq!(res.detail["key_id"], id.to_string());
    assert_eq!(res.detail["moved_to"], entry.display().to_string());
    // The trash let go, the deleter (the epilog's own program, as the epilog starts it)
    // deletes the folder.
    drop(held);
    let root = scratch_root(&w);
    let env: Vec<(OsString, OsString)> = vec![("TENANCY_EMPTY_TRASH".into(), root.into())];
    let out = w.run(&["epilog"], &env);
    assert!(out.status.success(), "{}", text(&out));
    // (A deleter the epilog started may have taken the trash first, as soon as it was let go:
    // then this one left it to that one.)
    wait_trash_empty(&w, "the deleter");
    assert!(!entry.exists(), "the deleter left the erased folder");

    // A file still open at the key removal (a process outside the job holds it): the key's
    // secret goes (nothing else of the folder opens), the open file keeps its own key until
    // it is closed, and the deleter completes the removal then.
    let held: OwnedFd = std::fs::File::open(&trash).unwrap().into();
    rustix::fs::flock(&held, rustix::fs::FlockOperation::LockExclusive).unwrap();
    prolog(&w, 22, 0, None);
    let id = journaled_key(&w, 22);
    let out = as_user(
        &w,
        0,
        &tmpdir(&w, 22),
        &format!("echo {secret} > \"$TMPDIR/held\" && echo {secret} > \"$TMPDIR/other\""),
    );
    assert!(out.status.success(), "{}", text(&out));
    let mut open_file = std::fs::File::open(tmpdir(&w, 22).join("held")).unwrap();
    epilog(&w, 22, 0, None);
    assert_eq!(status(&w, id), KeyStatus::IncompletelyRemoved);
    let end = w
        .records()
        .into_iter()
        .find(|r| r.job_id == Some(22) && r.event == tenancy_audit_log::Event::JobEnd)
        .expect("job_end");
    let res = end.resources.iter().find(|r| r.layer == "scratch").unwrap();
    assert_eq!(res.detail["key_removal"], "files_busy", "{res:?}");
    let entry = trash.join(format!("{}.job_22.{id}", w.tenants[0]));
    let others: Vec<PathBuf> = files_under(&entry);
    assert_eq!(others.len(), 2);
    assert!(
        others.iter().any(|f| unreadable_for_want_of_key(f)),
        "a file nobody held still opens: {others:?}"
    );
    let mut was = String::new();
    std::io::Read::read_to_string(&mut open_file, &mut was).unwrap();
    assert_eq!(was.trim(), secret, "the file held open lost its key");
    drop(open_file);
    drop(held);
    let out = w.run(&["epilog"], &env);
    assert!(out.status.success(), "{}", text(&out));
    wait_trash_empty(&w, "the deleter after the busy file");
    assert!(!entry.exists());
    assert_eq!(
        status(&w, id),
        KeyStatus::Absent,
        "the removal was not completed"
    );

    // Without a holder, the deleter the epilog starts empties the trash by itself.
    prolog(&w, 21, 0, None);
    let out = as_user(&w, 0, &tmpdir(&w, 21), "seq 100000 > \"$TMPDIR/f\"");
    assert!(out.status.success(), "{}", text(&out));
    epilog(&w, 21, 0, None);
    wait_trash_empty(&w, "the detached deleter");
    w.assert_nothing_left("after two erased jobs");
}

#[test]
fn retained_scratch_unlocks_until_expiry() {
    if !requires_root("real users, a loop device, fscrypt") {
        return;
    }
    let Some(w) = World::encrypted(1, Kind::Ext4Encrypt) else {
        return;
    };
    if built_or_skip("tenancyctl").is_none() {
        return;
    }
    // Tenant 1's tier keeps its scratch a day.
    prolog(&w, 30, 1, None);
    let id = journaled_key(&w, 30);
    let store = tenancy_scratch::KeyStore::new(&w.root.join("state"));
    let wrapped = store.path_of(id);
    let meta = |p: &Path| {
        let m = std::fs::metadata(p).unwrap();
        (
            std::os::unix::fs::MetadataExt::uid(&m),
            std::os::unix::fs::MetadataExt::mode(&m) & 0o777,
        )
    };
    assert_eq!(
        meta(&wrapped),
        (0, 0o400),
        "the wrapped key is not root's alone"
    );
    assert_eq!(meta(&store.node_key_path()), (0, 0o400));
    let secret = marker("RETAINED-RESULT");
    let dir = tmpdir(&w, 30);
    let out = as_user(&w, 1, &dir, &format!("echo {secret} > \"$TMPDIR/result\""));
    assert!(out.status.success(), "{}", text(&out));
    epilog(&w, 30, 1, None);
    assert_eq!(status(&w, id), KeyStatus::Absent, "retained unlocked");
    let retained = tenancy_scratch::find_retained(&scratch_root(&w), 30, None).unwrap();
    assert_eq!(retained.len(), 1, "{retained:?}");
    let folder = retained[0].path.clone();
    assert_eq!(retained[0].key_id, Some(id));
    let files = files_under(&folder);
    assert_eq!(files.len(), 1);
    assert!(
        unreadable_for_want_of_key(&files[0]),
        "a locked retained file reads"
    );

    // Unlocked by the admin: readable again, to root and to the job's user, and recorded.
    let out = tenancyctl(&w, &["scratch", "unlock", "30", "--node", "node1"]).unwrap();
    assert!(out.status.success(), "unlock: {}", text(&out));
    assert_eq!(status(&w, id), KeyStatus::Present);
    assert_eq!(
        std::fs::read_to_string(folder.join("result"))
            .unwrap()
            .trim(),
        secret
    );
    let out = as_user(&w, 1, &folder, "cat \"$TMPDIR/result\"");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        secret,
        "{}",
        text(&out)
    );
    // Locked again (as a restart would), and unlocked again: the wrapped key is what lasts.
    let out = tenancyctl(&w, &["scratch", "lock", "30", "--node", "node1"]).unwrap();
    assert!(out.status.success(), "lock: {}", text(&out));
    assert!(unreadable_for_want_of_key(&folder.join("result")) || !folder.join("result").exists());
    let out = tenancyctl(&w, &["scratch", "unlock", "30", "--node", "node1"]).unwrap();
    assert!(out.status.success(), "unlock again: {}", text(&out));
    assert_eq!(
        std::fs::read_to_string(folder.join("result"))
            .unwrap()
            .trim(),
        secret
    );
    let events: Vec<String> = w
        .records()
        .iter()
        .filter(|r| r.job_id == Some(30))
        .map(|r| r.event.to_string())
        .collect();
    assert_eq!(
        events,
        [
            "job_start",
            "job_end",
            "scratch_unlocked",
            "scratch_locked",
            "scratch_unlocked"
        ],
        "{events:?}"
    );

    // Past retention: reconcile destroys the wrapped key, then the tree, two records.
    let name = folder.file_name().unwrap().to_string_lossy().into_owned();
    let (job, ts) = name.rsplit_once('.').unwrap();
    let old = folder.with_file_name(format!("{job}.{}", ts.parse::<u64>().unwrap() - 2 * 86_400));
    std::fs::rename(&folder, &old).unwrap();
    let out = reconcile(&w).unwrap();
    assert!(out.status.success(), "reconcile: {}", text(&out));
    assert!(!old.exists(), "the expired folder is still there");
    assert!(!wrapped.exists(), "the wrapped key outlived retention");
    assert_eq!(status(&w, id), KeyStatus::Absent);
    let kinds: Vec<String> = w
        .records()
        .iter()
        .filter(|r| r.job_id == Some(30) && r.event == tenancy_audit_log::Event::Reconcile)
        .map(|r| r.resources[0].layer.clone())
        .collect();
    assert_eq!(kinds, ["retained-key", "retained"], "{kinds:?}");
    let out = tenancyctl(&w, &["scratch", "unlock", "30", "--node", "node1"]).unwrap();
    assert!(
        !out.status.success(),
        "an expired scratch unlocked: {}",
        text(&out)
    );
    assert!(w.chain_is_valid());
}

#[test]
fn required_encryption_on_unsupported_fs_fails_closed() {
    if !requires_root("real users, a loop device, tmpfs") {
        return;
    }
    for (kind, fs_named, remedy) in [
        (Kind::Tmpfs, "tmpfs", "mkfs.ext4 -O encrypt"),
        (
            Kind::Ext4,
            "without the encrypt feature",
            "tune2fs -O encrypt",
        ),
    ] {
        let Some(w) = World::encrypted(1, kind) else {
            return;
        };
        let out = w.run(&["prolog"], &w.job_env(40, 0, None));
        assert!(
            !out.status.success(),
            "{kind:?}: the job ran: {}",
            text(&out)
        );
        let err = String::from_utf8_lossy(&out.stderr);
        for want in [
            "job 40",
            "layer scratch",
            "scratch_encryption is required",
            fs_named,
            remedy,
            "scratch_encryption = \"off\"",
        ] {
            assert!(err.contains(want), "{kind:?}: no {want:?} in: {err}");
        }
        // Nothing made is left, and the refusal is recorded.
        w.assert_nothing_left(&format!("{kind:?}: a refused job"));
        assert!(
            std::fs::read_dir(scratch_root(&w).join(&w.tenants[0]))
                .map(|rd| rd.count() == 0)
                .unwrap_or(true),
            "{kind:?}: a job folder was made"
        );
        let rec = w
            .records()
            .into_iter()
            .find(|r| r.job_id == Some(40))
            .expect("a record");
        assert_eq!(rec.event, tenancy_audit_log::Event::Rollback, "{kind:?}");
        assert!(
            rec.reason.as_deref().unwrap_or("").contains(fs_named),
            "{kind:?}: {rec:?}"
        );
        // doctor says so for the tier, before any job.
        if let Some(out) = tenancyctl(&w, &["doctor", "--format", "json"]) {
            let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout)
                .unwrap_or_else(|e| panic!("doctor: {e}: {}", text(&out)));
            let row = rows
                .iter()
                .find(|r| r["check"] == "scratch.encryption.internal")
                .expect("a row for the tier");
            assert_eq!(row["severity"], "error", "{row}");
            assert!(row["message"].as_str().unwrap().contains(fs_named), "{row}");
        }
    }
}

#[test]
fn killed_prolog_leaves_no_unfound_key() {
    if !requires_root("real users, product cgroups, BPF device programs, a loop device") {
        return;
    }
    let Some(w) = World::encrypted(2, Kind::Ext4Encrypt) else {
        return;
    };
    // The boundaries of a whole prolog (as the crash tests number them).
    let seen = w.prolog_boundaries(100);
    epilog(&w, 100, 0, Some("1g.18gb"));
    let made_at = seen.iter().position(|s| s == "made scratch").unwrap();
    assert!(seen.iter().position(|s| s == "intended scratch").unwrap() + 1 == made_at);
    for (t, tenant_tier) in [(0usize, "wipe"), (1, "retain")] {
        for (i, want) in seen.iter().enumerate() {
            let n = i + 1;
            for (k, then) in ["epilog", "reconcile"].iter().enumerate() {
                let job = 1000 + 100 * t as u64 + 10 * n as u64 + k as u64;
                let env = w.job_env(job, t, Some("1g.18gb"));
                let out = w.run(&["prolog", "--crash-at", &n.to_string()], &env);
                assert_eq!(out.status.signal(), Some(9), "not killed: {}", text(&out));
                // The journal names the key from the first boundary on: the intents are all
                // journaled before any layer acts.
                let id = journaled_key(&w, job);
                let on_disk: Vec<_> = w
                    .intent_records()
                    .into_iter()
                    .filter(|r| r.0 == job)
                    .collect();
                assert_eq!(on_disk.len(), 1, "{tenant_tier} {want}: intent log");
                let logged = serde_json::to_value(&on_disk[0].1).unwrap();
                assert!(
                    logged.to_string().contains(&id.to_string()),
                    "{tenant_tier} {want}: the intent log does not name the key"
                );
                // The key exists once the scratch layer made it, never before.
                let want_status = if i >= made_at {
                    KeyStatus::Present
                } else {
                    KeyStatus::Absent
                };
                assert_eq!(
                    status(&w, id),
                    want_status,
                    "{tenant_tier}: killed at {want}"
                );
                if i >= made_at {
                    let folder: OwnedFd =
                        std::fs::File::open(w.scratch_dir(t, job)).unwrap().into();
                    assert_eq!(fscrypt::policy_of(&folder).unwrap(), Some(id));
                }
                match *then {
                    "epilog" => epilog(&w, job, t, Some("1g.18gb")),
                    _ => {
                        let out = reconcile(&w).expect("tenancyctl");
                        assert!(
                            out.status.success(),
                            "{tenant_tier}: reconcile after a kill at {want}: {}",
                            text(&out)
                        );
                    }
                }
                assert_eq!(
                    status(&w, id),
                    KeyStatus::Absent,
                    "{tenant_tier}: the key outlived the {then} after a kill at {want}"
                );
                assert!(
                    !w.scratch_dir(t, job).exists(),
                    "{tenant_tier} {want} {then}"
                );
            }
        }
    }
    // What is left: retained folders (locked, their wrapped keys kept) and erased ones.
    let store = tenancy_scratch::KeyStore::new(&w.root.join("state"));
    for f in tenancy_scratch::list_retained(&scratch_root(&w), None).unwrap() {
        if let Some(id) = f.key_id {
            assert_eq!(status(&w, id), KeyStatus::Absent, "{f:?}");
            assert!(store.path_of(id).exists(), "{f:?}: its wrapped key is gone");
        }
    }
    w.assert_nothing_left("after every kill");
    assert!(w.chain_is_valid());
}
