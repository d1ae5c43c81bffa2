//! Scratch layer as root with real users: isolation proven by attacks that fail.
mod common;
use common::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use tenancy_scratch::*;

fn spec(root: &Path, tenant: &str, tgid: u32, job: u64, u: &User) -> ScratchSpec {
    ScratchSpec {
        root: root.into(),
        tenant: tenant.into(),
        tenant_gid: tgid,
        job_id: job,
        uid: u.uid,
        gid: u.gid,
        mode: DEFAULT_JOB_MODE,
        quota: None,
        tenant_groups: Vec::new(),
    }
}

/// As root (None, skipped, otherwise): a group `a`, its user `ua`, a tree and its scratch root.
fn tenant_a() -> Option<(Group, User, Tree, PathBuf)> {
    if !requires_root("chown") {
        return None;
    }
    let ga = Group::new("a");
    let ua = User::new("ua", &ga);
    let t = Tree::new();
    let root = t.scratch_root();
    Some((ga, ua, t, root))
}

fn denied(out: &std::process::Output) -> bool {
    !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("Permission denied")
}

#[test]
fn other_tenant_cannot_list_or_read_job_folder() {
    if !requires_root("real users and chown") {
        return;
    }
    let (ga, gb) = (Group::new("a"), Group::new("b"));
    let (ua, ua2, ub) = (
        User::new("ua", &ga),
        User::new("ux", &ga),
        User::new("ub", &gb),
    );
    let t = Tree::new();
    let root = t.scratch_root();
    let s = spec(&root, "ta", ga.gid, 101, &ua);
    let c = create(&s).unwrap();
    assert!(c.created_tenant_dir);
    let tm = std::fs::metadata(&c.tenant_dir).unwrap();
    assert_eq!((tm.uid(), tm.gid(), tm.mode() & 0o7777), (0, ga.gid, 0o750));
    let jm = std::fs::metadata(&c.path).unwrap();
    assert_eq!(
        (jm.uid(), jm.gid(), jm.mode() & 0o7777),
        (ua.uid, ua.gid, 0o700)
    );
    let secret = c.path.join("secret");
    std::fs::write(&secret, "weights").unwrap();
    chown(&secret, ua.uid, ua.gid);
    chmod(&secret, 0o644); // the user's umask 022: the folder mode must protect it
    let (jp, sp, tp) = (
        c.path.to_str().unwrap(),
        secret.to_str().unwrap(),
        c.tenant_dir.to_str().unwrap(),
    );

    // Positive control: the job user can list and read.
    let ok = ua.run("ls", &[jp]);
    assert!(
        ok.status.success(),
        "job user must list its folder: {}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(ua.run("cat", &[sp]).status.success());
    // Tenant B: cannot list the tenant folder, cannot list or read the job folder.
    assert!(denied(&ub.run("ls", &[tp])), "B lists A's tenant folder");
    assert!(denied(&ub.run("ls", &[jp])), "B lists A's job folder");
    assert!(denied(&ub.run("cat", &[sp])), "B reads A's file");
    // Same tenant, other user: may traverse the tenant folder, not enter someone's job folder.
    assert!(ua2.run("ls", &[tp]).status.success());
    assert!(denied(&ua2.run("ls", &[jp])));
    // Nobody but root can create in the tenant folder (no planting next to job folders).
    let plant = c.tenant_dir.join("job_102");
    assert!(denied(
        &ua.run("ln", &["-s", "/etc", plant.to_str().unwrap()])
    ));

    assert!(matches!(
        wipe(&s).unwrap(),
        Wiped::Removed { entries: 2, .. }
    ));
    assert!(!c.path.exists());
    assert!(
        matches!(wipe(&s).unwrap(), Wiped::AlreadyGone { .. }),
        "wipe is idempotent"
    );
}

#[test]
fn refuses_symlinks_and_unsafe_tenant_folders_writing_nothing() {
    if !requires_root("chown") {
        return;
    }
    let (ga, gb) = (Group::new("a"), Group::new("b"));
    let ua = User::new("ua", &ga);
    let t = Tree::new();
    let root = t.scratch_root();
    let victim = t.path().join("victim"); // stands for /etc
    std::fs::create_dir(&victim).unwrap();
    std::fs::write(victim.join("passwd"), "x").unwrap();
    chmod(&victim, 0o755);
    let before = snapshot(&victim);

    // 1. The tenant folder is a symlink to the victim.
    std::os::unix::fs::symlink(&victim, root.join("ta")).unwrap();
    let e = create(&spec(&root, "ta", ga.gid, 1, &ua)).unwrap_err();
    assert!(matches!(e, ScratchError::Unsafe { .. }), "{e}");
    assert!(e.to_string().contains("symlink"), "{e}");
    assert!(matches!(
        wipe(&spec(&root, "ta", ga.gid, 1, &ua)),
        Err(ScratchError::Unsafe { .. })
    ));
    assert_eq!(snapshot(&victim), before);
    std::fs::remove_file(root.join("ta")).unwrap();

    // 2. A symlink planted where the job folder goes.
    let good = create(&spec(&root, "ta", ga.gid, 2, &ua)).unwrap();
    std::os::unix::fs::symlink(&victim, good.tenant_dir.join("job_3")).unwrap();
    let e = create(&spec(&root, "ta", ga.gid, 3, &ua)).unwrap_err();
    assert!(
        e.to_string().contains("already exists") && e.to_string().contains("symlink"),
        "{e}"
    );
    assert_eq!(
        snapshot(&victim),
        before,
        "create touched the symlink target"
    );
    // wipe removes the link, not the target
    assert!(matches!(
        wipe(&spec(&root, "ta", ga.gid, 3, &ua)).unwrap(),
        Wiped::Removed { entries: 1, .. }
    ));
    assert_eq!(snapshot(&victim), before);
    // 3. A plain file where the job folder goes.
    std::fs::write(good.tenant_dir.join("job_4"), "").unwrap();
    assert!(create(&spec(&root, "ta", ga.gid, 4, &ua)).is_err());

    // 4. Tenant folder with wrong group / group-writable / world-accessible / wrong owner.
    let td = good.tenant_dir.clone();
    for (uid, gid, mode, why) in [
        (0, gb.gid, 0o750, "expected tenant gid"),
        (0, ga.gid, 0o770, "writable"),
        (0, ga.gid, 0o755, "others"),
        (ua.uid, ga.gid, 0o750, "expected root"),
    ] {
        chown(&td, uid, gid);
        chmod(&td, mode);
        let snap = snapshot(&td);
        let e = create(&spec(&root, "ta", ga.gid, 5, &ua)).unwrap_err();
        assert!(e.to_string().contains(why), "{e} should say {why}");
        assert_eq!(snapshot(&td), snap, "refusal wrote something");
    }
    chown(&td, 0, ga.gid);
    chmod(&td, 0o750);
    // 5. Unsafe scratch root: group-writable, or a symlink.
    chmod(&root, 0o775);
    assert!(create(&spec(&root, "ta", ga.gid, 6, &ua))
        .unwrap_err()
        .to_string()
        .contains("scratch root"));
    chmod(&root, 0o755);
    let link = t.path().join("rootlink");
    std::os::unix::fs::symlink(&root, &link).unwrap();
    assert!(create(&spec(&link, "ta", ga.gid, 6, &ua)).is_err());
    // 6. Bad specs.
    let mut bad = spec(&root, "../etc", ga.gid, 7, &ua);
    assert!(matches!(
        create(&bad),
        Err(ScratchError::InvalidSpec { .. })
    ));
    bad.tenant = "ta".into();
    bad.mode = 0o755;
    assert!(matches!(
        create(&bad),
        Err(ScratchError::InvalidSpec { .. })
    ));
    assert!(!td.join("job_7").exists());
    assert_eq!(snapshot(&victim), before);
}

#[test]
fn wipe_never_follows_symlinks_and_removes_mode_000_and_deep_trees() {
    let Some((ga, ua, t, root)) = tenant_a() else {
        return;
    };
    let victim = t.path().join("victim");
    std::fs::create_dir_all(victim.join("inner")).unwrap();
    std::fs::write(victim.join("inner/keep"), "x").unwrap();
    let before = snapshot(&victim);
    let s = spec(&root, "ta", ga.gid, 9, &ua);
    let c = create(&s).unwrap();
    let j = &c.path;
    // symlinks to the victim, at the top and deeper, to a folder and to a file
    std::os::unix::fs::symlink(&victim, j.join("etc")).unwrap();
    std::fs::create_dir_all(j.join("a/b")).unwrap();
    std::os::unix::fs::symlink(victim.join("inner"), j.join("a/b/inner")).unwrap();
    std::os::unix::fs::symlink(victim.join("inner/keep"), j.join("a/keep")).unwrap();
    // a hard link to a file outside is only unlinked
    std::fs::hard_link(victim.join("inner/keep"), j.join("hl")).unwrap();
    // mode-000 nested folders with files
    let mut d = j.join("locked");
    for i in 0..5 {
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join(format!("f{i}")), "x").unwrap();
        d = d.join("x");
    }
    let mut d = j.join("locked");
    let mut dirs = vec![];
    for _ in 0..5 {
        dirs.push(d.clone());
        d = d.join("x");
    }
    for d in dirs.iter().rev() {
        chmod(d, 0o000);
    }
    // deep chain (deeper than the flattening depth) and a wide folder
    let mut deep = j.join("deep");
    for _ in 0..200 {
        deep = deep.join("d");
    }
    std::fs::create_dir_all(&deep).unwrap();
    std::fs::write(deep.join("bottom"), "x").unwrap();
    // the names the wipe gives deep folders it moves up, taken already by the user (the
    // first holds a deep chain itself, so it is still there when the wipe flattens it)
    for n in 0..3 {
        let taken = j.join(format!(".wipe-deep-{}-{n}", std::process::id()));
        let mut d = taken.clone();
        for _ in 0..if n == 0 { 60 } else { 1 } {
            d = d.join("d");
        }
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("x"), "x").unwrap();
    }
    std::fs::create_dir(j.join("wide")).unwrap();
    for i in 0..2000 {
        std::fs::write(j.join("wide").join(i.to_string()), "").unwrap();
    }
    let w = wipe(&s).unwrap();
    let Wiped::Removed { entries, .. } = w else {
        panic!("{w:?}")
    };
    assert!(entries > 2200, "{entries}");
    assert!(!j.exists());
    assert_eq!(
        snapshot(&victim),
        before,
        "wipe changed something outside the job folder"
    );
    assert!(c.tenant_dir.exists(), "tenant folder stays");
    assert!(matches!(wipe(&s).unwrap(), Wiped::AlreadyGone { .. }));
}

#[test]
fn retain_then_purge_after_retention() {
    let Some((ga, ua, t, root)) = tenant_a() else {
        return;
    };
    let s = spec(&root, "ta", ga.gid, 42, &ua);
    let c = create(&s).unwrap();
    std::fs::write(c.path.join("result"), "x").unwrap();
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let Retained::Moved {
        to, retained_at, ..
    } = retain(&s, now).unwrap()
    else {
        panic!()
    };
    assert_eq!(retained_at, 1_700_000_000);
    assert_eq!(to, c.tenant_dir.join(".retained/job_42.1700000000"));
    assert!(!c.path.exists() && to.join("result").exists());
    let rm = std::fs::metadata(c.tenant_dir.join(".retained")).unwrap();
    assert_eq!((rm.uid(), rm.gid(), rm.mode() & 0o7777), (0, ga.gid, 0o750));
    assert!(matches!(
        retain(&s, now).unwrap(),
        Retained::AlreadyGone { .. }
    ));
    // the same job id may run again after its folder was retained
    create(&s).unwrap();
    assert!(
        purge_retained(&root, 7, now + Duration::from_secs(3 * 86_400), false)
            .unwrap()
            .is_empty()
    );
    let later = now + Duration::from_secs(8 * 86_400);
    let dry = purge_retained(&root, 7, later, true).unwrap();
    assert!(
        matches!(
            &dry[..],
            [Action::Remove {
                job_id: 42,
                age_days: 8,
                dry_run: true,
                ..
            }]
        ),
        "{dry:?}"
    );
    assert!(to.exists());
    let done = purge_retained(&root, 7, later, false).unwrap();
    assert!(
        matches!(
            &done[..],
            [Action::Remove {
                job_id: 42,
                dry_run: false,
                entries: 2,
                ..
            }]
        ),
        "{done:?}"
    );
    assert!(!to.exists());
    assert!(c.path.exists(), "purge leaves live job folders alone");
    // a symlink planted in .retained is removed as a link only
    let victim = t.path().join("victim");
    std::fs::create_dir(&victim).unwrap();
    std::fs::write(victim.join("keep"), "x").unwrap();
    std::os::unix::fs::symlink(&victim, c.tenant_dir.join(".retained/job_1.1")).unwrap();
    let acts = purge_retained(&root, 0, later, false).unwrap();
    assert_eq!(acts.len(), 1);
    assert!(victim.join("keep").exists());
}

#[test]
fn purge_goes_on_past_a_folder_it_cannot_remove() {
    if !requires_root("chown, chattr") {
        return;
    }
    let ga = Group::new("a");
    let ua = User::new("ua", &ga);
    let t = Tree::new();
    let root = t.scratch_root();
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let mut retained = Vec::new();
    for job in 1..=3 {
        let s = spec(&root, "ta", ga.gid, job, &ua);
        let c = create(&s).unwrap();
        std::fs::write(c.path.join("result"), "x").unwrap();
        let Retained::Moved { to, .. } = retain(&s, now).unwrap() else {
            panic!()
        };
        retained.push(to);
    }
    // Job 2's folder, sorted between the others, holds a file not even root can remove.
    let Some(_pin) = Immutable::set(&retained[1].join("result")) else {
        return;
    };
    let acts = purge_retained(&root, 7, now + Duration::from_secs(8 * 86_400), false).unwrap();
    let [Action::Remove {
        job_id: 1,
        dry_run: false,
        ..
    }, Action::Failed {
        path,
        job_id: 2,
        age_days: 8,
        error,
        ..
    }, Action::Remove {
        job_id: 3,
        dry_run: false,
        ..
    }] = &acts[..]
    else {
        panic!("{acts:?}")
    };
    assert_eq!(path, &retained[1]);
    assert!(
        error.contains("unlinkat") && error.contains("Operation not permitted"),
        "{error}"
    );
    assert!(!retained[0].exists() && !retained[2].exists());
    assert!(retained[1].join("result").exists());
}

#[test]
fn project_quota_reports_unsupported_plainly() {
    let Some((ga, ua, _t, root)) = tenant_a() else {
        return;
    };
    let mut s = spec(&root, "ta", ga.gid, 5, &ua);
    s.quota = Some(QuotaSpec {
        project_id: 7000 + std::process::id() % 1000,
        block_hard_kib: 1 << 20,
        inode_hard: 10_000,
        required: false,
    });
    let c = create(&s).unwrap();
    match &c.quota {
        QuotaStatus::Unsupported { reason } => {
            eprintln!("quota: {reason}");
            assert!(!reason.is_empty());
        }
        QuotaStatus::Applied { .. } => {
            eprintln!("quota applied (this kernel supports project quotas)")
        }
        other => panic!("unexpected quota status {other:?}"),
    }
    if let QuotaStatus::Unsupported { .. } = c.quota {
        // required: fail closed and write nothing
        let mut s2 = spec(&root, "tq", ga.gid, 6, &ua);
        s2.quota = Some(QuotaSpec {
            required: true,
            ..s.quota.clone().unwrap()
        });
        let e = create(&s2).unwrap_err();
        assert!(matches!(e, ScratchError::Quota { job: 6, .. }), "{e}");
        assert!(!root.join("tq").exists());
    }
    let j = serde_json::to_string(&c).unwrap();
    let back: Created = serde_json::from_str(&j).unwrap();
    assert_eq!(back, c);
    assert!(std::fs::metadata(&c.path).unwrap().permissions().mode() & 0o777 == 0o700);
}

/// A tenant with two groups: its folder belongs to the first, and a member through the second
/// reaches their own job folder through the folder's ACL; another tenant still cannot.
#[test]
fn a_member_through_a_tenants_second_group_reaches_their_folder() {
    if !requires_root("real users and chown") {
        return;
    }
    let (g1, g2, gc) = (Group::new("m1"), Group::new("m2"), Group::new("mc"));
    let (u2, uc) = (User::new("m2u", &g2), User::new("mcu", &gc));
    let t = Tree::new();
    let root = t.scratch_root();
    let s = ScratchSpec {
        tenant_groups: vec![g1.gid, g2.gid],
        ..spec(&root, "tm", g1.gid, 301, &u2)
    };
    let c = create(&s).unwrap();
    let tm = std::fs::metadata(&c.tenant_dir).unwrap();
    assert_eq!((tm.uid(), tm.gid(), tm.mode() & 0o7777), (0, g1.gid, 0o750));
    let jp = c.path.to_str().unwrap();
    let made = u2.run("touch", &[&format!("{jp}/ckpt")]);
    assert!(
        made.status.success(),
        "a member through the second group cannot use its scratch: {}",
        String::from_utf8_lossy(&made.stderr)
    );
    assert!(denied(&uc.run("ls", &[c.tenant_dir.to_str().unwrap()])));
    assert!(denied(&uc.run("ls", &[jp])));
    // A second job finds the ACL in place and the folder as it was.
    let c2 = create(&ScratchSpec {
        job_id: 302,
        ..s.clone()
    })
    .unwrap();
    assert!(!c2.created_tenant_dir);
    wipe(&s).unwrap();
    wipe(&ScratchSpec {
        job_id: 302,
        ..s.clone()
    })
    .unwrap();
    // The tenant is cut to its first group: the next job takes the other group's entry away.
    let one = ScratchSpec {
        job_id: 303,
        tenant_groups: Vec::new(),
        ..s
    };
    create(&one).unwrap();
    assert!(
        denied(&u2.run("ls", &[c.tenant_dir.to_str().unwrap()])),
        "a group the tenant no longer has still enters its folder"
    );
    wipe(&one).unwrap();
}

/// A tenant folder left half-made by an older build killed between its chown and chmod
/// (root, the tenant's group, 0700) is refused: its members could not reach their folders.
#[test]
fn a_tenant_folder_that_keeps_its_group_out_is_refused() {
    if !requires_root("real users and chown") {
        return;
    }
    let g = Group::new("k1");
    let u = User::new("k1u", &g);
    let t = Tree::new();
    let root = t.scratch_root();
    let tdir = root.join("tk");
    std::fs::create_dir(&tdir).unwrap();
    chown(&tdir, 0, g.gid);
    chmod(&tdir, 0o700);
    let e = create(&spec(&root, "tk", g.gid, 401, &u)).unwrap_err();
    assert!(
        e.to_string().contains("keeps the tenant's group out"),
        "{e}"
    );
    assert!(!tdir.join("job_401").exists());
}
