//! storage-audit against planted leaks, each cross-checked with the kernel by a real user of the
//! other tenant; a clean tree gives no findings.
use std::path::{Path, PathBuf};
use tenancy_scratch::*;
use tenancy_storage_audit::*;
use tenancy_test_support::users::*;
use tenancy_test_support::{loopfs, requires_root, seccomp};

// Field order = drop order: users go before their groups.
struct Fixture {
    t: Tree,
    root: PathBuf,
    ua: User,
    ub: User,
    ga: Group,
    gb: Group,
    map: TenantMap,
}

impl Fixture {
    fn new() -> Fixture {
        let (ga, gb) = (Group::new("a"), Group::new("b"));
        let (ua, ub) = (User::new("ua", &ga), User::new("ub", &gb));
        let t = Tree::new();
        let root = t.scratch_root();
        create(&ScratchSpec {
            root: root.clone(),
            tenant: "ta".into(),
            tenant_gid: ga.gid,
            job_id: 1,
            uid: ua.uid,
            gid: ua.gid,
            mode: 0o700,
            quota: None,
            tenant_groups: Vec::new(),
        })
        .unwrap();
        create(&ScratchSpec {
            root: root.clone(),
            tenant: "tb".into(),
            tenant_gid: gb.gid,
            job_id: 2,
            uid: ub.uid,
            gid: ub.gid,
            mode: 0o700,
            quota: None,
            tenant_groups: Vec::new(),
        })
        .unwrap();
        let j1 = root.join("ta/job_1");
        for (p, mode) in [
            (j1.join("data.bin"), 0o644),
            (root.join("tb/job_2/f"), 0o644),
        ] {
            std::fs::write(&p, "secret").unwrap();
            chmod(&p, mode);
        }
        chown(&j1.join("data.bin"), ua.uid, ua.gid);
        std::fs::create_dir(j1.join("sub")).unwrap();
        chown(&j1.join("sub"), ua.uid, ua.gid);
        std::os::unix::fs::symlink("data.bin", j1.join("rel")).unwrap();
        std::os::unix::fs::symlink("../job_1/sub", j1.join("sub/up")).unwrap();
        let mut map = TenantMap::new();
        map.insert("ta", [ga.gid], [ua.uid]);
        map.insert("tb", [gb.gid], [ub.uid]);
        Fixture {
            t,
            root,
            ua,
            ub,
            ga,
            gb,
            map,
        }
    }
    fn j1(&self) -> PathBuf {
        self.root.join("ta/job_1")
    }
    fn audit(&self) -> Report {
        let r = audit_paths(std::slice::from_ref(&self.root), &self.map, Some(2), false).unwrap();
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        r
    }
    fn b_reads(&self, p: &Path) -> bool {
        self.ub.run("cat", &[p.to_str().unwrap()]).status.success()
    }
}

fn has(r: &Report, rule: Rule, path: &Path, who: &str, perms: &str) -> bool {
    r.findings
        .iter()
        .any(|f| f.rule == rule && f.path == path && f.who == who && f.perms == perms)
}

#[test]
fn clean_tree_has_no_findings() {
    if !requires_root("real users, chown") {
        return;
    }
    let f = Fixture::new();
    let r = f.audit();
    assert!(r.findings.is_empty(), "{:#?}", r.findings);
    assert!(r.scanned >= 9, "{}", r.scanned);
    assert!(
        !f.b_reads(&f.j1().join("data.bin")),
        "kernel ground truth: B cannot read"
    );
    // What `tenancyctl storage-audit` exits with (its printing: tenancyctl's tests).
    let code = audit_paths(std::slice::from_ref(&f.root), &f.map, Some(2), false)
        .unwrap()
        .exit_code();
    assert_eq!(
        format!("{code:?}"),
        format!("{:?}", std::process::ExitCode::SUCCESS)
    );
    let _ = (&f.ga, &f.gb, &f.ua, &f.t);
}

#[test]
fn finds_world_readable_file_that_others_can_reach() {
    if !requires_root("real users, chown") {
        return;
    }
    let f = Fixture::new();
    let file = f.j1().join("data.bin");
    // Opening only the job folder is not a leak: the tenant folder still blocks.
    chmod(&f.j1(), 0o755);
    assert!(f.audit().findings.is_empty(), "{:#?}", f.audit().findings);
    assert!(!f.b_reads(&file));
    // Traverse-only on the tenant folder: now the file is readable by anyone knowing its name.
    chmod(&f.root.join("ta"), 0o751);
    let r = f.audit();
    assert!(f.b_reads(&file), "kernel ground truth: B reads it");
    assert!(
        has(&r, Rule::Exposed, &file, "others", "r--"),
        "{:#?}",
        r.findings
    );
    assert!(
        has(&r, Rule::Exposed, &f.root.join("ta"), "others", "--x"),
        "{:#?}",
        r.findings
    );
    // What `tenancyctl storage-audit` exits with (its printing: tenancyctl's tests).
    let code = audit_paths(std::slice::from_ref(&f.root), &f.map, None, false)
        .unwrap()
        .exit_code();
    assert_eq!(
        format!("{code:?}"),
        format!("{:?}", std::process::ExitCode::from(1))
    );
}

#[test]
fn finds_acl_granting_another_tenants_group() {
    if !requires_root("real users, setfacl") {
        return;
    }
    let f = Fixture::new();
    let file = f.j1().join("data.bin");
    let g = format!("g:{}:x", f.gb.name);
    setfacl(&["-m", &g, f.root.join("ta").to_str().unwrap()]);
    setfacl(&["-m", &g, f.j1().to_str().unwrap()]);
    setfacl(&["-m", &format!("g:{}:r", f.gb.name), file.to_str().unwrap()]);
    setfacl(&[
        "-d",
        "-m",
        &format!("g:{}:rx", f.gb.name),
        f.j1().join("sub").to_str().unwrap(),
    ]);
    assert!(f.b_reads(&file), "kernel ground truth: the ACL lets B read");
    let r = f.audit();
    assert!(
        has(&r, Rule::Exposed, &file, "tenant tb", "r--"),
        "{:#?}",
        r.findings
    );
    assert!(
        has(&r, Rule::Exposed, &f.j1(), "tenant tb", "--x"),
        "{:#?}",
        r.findings
    );
    assert!(
        has(
            &r,
            Rule::DefaultAclGrant,
            &f.j1().join("sub"),
            "tenant tb",
            "r-x"
        ),
        "{:#?}",
        r.findings
    );
    assert!(
        !r.findings.iter().any(|x| x.who == "others"),
        "{:#?}",
        r.findings
    );
    // An empty mask does not shut B out on Linux: the kernel skips the ACL when the group-class
    // bits are 0 and B falls to the "other" bits (r--). The audit models that.
    setfacl(&["-m", "m::-", file.to_str().unwrap()]);
    assert!(f.b_reads(&file), "kernel: empty mask, other r-- applies");
    assert!(has(&f.audit(), Rule::Exposed, &file, "tenant tb", "r--"));
    // A mask of --- and no other bits: B is out, and so is the finding.
    chmod(&file, 0o600);
    setfacl(&[
        "-m",
        &format!("g:{}:r", f.gb.name),
        "-m",
        "m::-",
        file.to_str().unwrap(),
    ]);
    assert!(!f.b_reads(&file), "kernel: denied");
    assert!(
        !f.audit().findings.iter().any(|x| x.path == file),
        "{:#?}",
        f.audit().findings
    );
    // The mask caps a named entry when it is not empty: mask r-- with g:B:rw gives B only r--.
    setfacl(&[
        "-m",
        &format!("g:{}:rw", f.gb.name),
        "-m",
        "m::r",
        file.to_str().unwrap(),
    ]);
    assert!(f.b_reads(&file));
    assert!(has(&f.audit(), Rule::Exposed, &file, "tenant tb", "r--"));
}

#[test]
fn finds_wrong_group_symlink_out_setid_and_world_writable() {
    if !requires_root("real users, chown") {
        return;
    }
    let f = Fixture::new();
    let victim = f.t.path().join("victim");
    std::fs::create_dir(&victim).unwrap();
    let sub = f.j1().join("sub");
    chown(&sub, f.ua.uid, f.gb.gid);
    std::os::unix::fs::symlink(&victim, f.j1().join("escape")).unwrap();
    std::os::unix::fs::symlink("../../../tb/job_2", sub.join("sideways")).unwrap();
    let tool = f.j1().join("tool");
    std::fs::write(&tool, "").unwrap();
    chmod(&tool, 0o4755);
    let r = f.audit();
    assert!(
        r.findings
            .iter()
            .any(|x| x.rule == Rule::ForeignGroup && x.path == sub),
        "{:#?}",
        r.findings
    );
    assert!(r
        .findings
        .iter()
        .any(|x| x.rule == Rule::SymlinkOutOfTree && x.path == f.j1().join("escape")));
    assert!(r
        .findings
        .iter()
        .any(|x| x.rule == Rule::SymlinkOutOfTree && x.path == sub.join("sideways")));
    assert!(r
        .findings
        .iter()
        .any(|x| x.rule == Rule::SetId && x.path == tool));
    assert_eq!(r.findings.len(), 4, "{:#?}", r.findings);
    // a world-writable scratch root without sticky bit
    chmod(&f.root, 0o777);
    let r = f.audit();
    assert!(
        has(&r, Rule::WorldWritableNoSticky, &f.root, "others", "rwx"),
        "{:#?}",
        r.findings
    );
    chmod(&f.root, 0o1777);
    assert!(!f
        .audit()
        .findings
        .iter()
        .any(|x| x.rule == Rule::WorldWritableNoSticky));
    // victim untouched, symlinks not followed
    assert_eq!(std::fs::read_dir(&victim).unwrap().count(), 0);
}

/// Where the kernel has no `openat2` (here a seccomp filter answers ENOSYS, as a kernel before
/// 5.6 or a container's profile does), the walk opens each path component with
/// `openat(O_NOFOLLOW)` and audits the same tree: every folder opened, the same findings.
#[test]
fn without_openat2_the_audit_opens_every_folder_and_finds_the_same() {
    if !requires_root("real users, chown, seccomp") {
        return;
    }
    let f = Fixture::new();
    // Folders several levels down, so that the walk opens paths of several components.
    let deep = f.j1().join("sub/deeper/deepest");
    std::fs::create_dir_all(&deep).unwrap();
    for d in [f.j1().join("sub/deeper"), deep.clone()] {
        chown(&d, f.ua.uid, f.ua.gid);
    }
    std::fs::write(deep.join("data"), "secret").unwrap();
    chown(&deep.join("data"), f.ua.uid, f.ua.gid);
    // The tenant's and the job's folders open to others: the deep file is exposed.
    chmod(&f.root.join("ta"), 0o751);
    chmod(&f.j1(), 0o755);
    chmod(&deep.join("data"), 0o644);
    let with = f.audit();
    assert!(
        has(&with, Rule::Exposed, &deep.join("data"), "others", "r--"),
        "{:#?}",
        with.findings
    );
    let (root, map) = (f.root.clone(), f.map.clone());
    let without = seccomp::without_openat2(move || {
        audit_paths(std::slice::from_ref(&root), &map, Some(2), false).unwrap()
    });
    assert!(without.errors.is_empty(), "{:?}", without.errors);
    assert_eq!(without.scanned, with.scanned);
    assert_eq!(without.findings, with.findings);
}

/// A name that is not UTF-8 (any job user can make one) still serializes in the JSON report,
/// reversibly, so it cannot hide the report's findings from JSON-based monitoring; another
/// file system mounted inside the tree is reported, not passed over.
#[test]
fn odd_names_serialize_and_a_mount_inside_the_tree_is_reported() {
    if !requires_root("real users, chown, mount") {
        return;
    }
    use std::os::unix::ffi::OsStrExt;
    let f = Fixture::new();
    let odd = f.j1().join(std::ffi::OsStr::from_bytes(b"x\xff\\y"));
    std::fs::write(&odd, "s").unwrap();
    chmod(&odd, 0o4755);
    let r = f.audit();
    let found = r
        .findings
        .iter()
        .find(|x| x.path == odd)
        .expect("set-id file found");
    let json = serde_json::to_string(found).unwrap();
    assert!(json.contains(r"x\\xff\\x5cy"), "{json}");
    let back: Finding = serde_json::from_str(&json).unwrap();
    assert_eq!(back.path, odd);

    let mnt = f.j1().join("m");
    let mut mounted = loopfs::LoopFs::new(loopfs::Kind::Tmpfs, &mnt, 1);
    std::fs::write(mnt.join("open"), "s").unwrap();
    chmod(&mnt.join("open"), 0o4777);
    let r = audit_paths(std::slice::from_ref(&f.root), &f.map, Some(2), false).unwrap();
    mounted.remove();
    assert!(
        r.errors
            .iter()
            .any(|e| e.contains(mnt.to_str().unwrap()) && e.contains("another file system")),
        "{:?}",
        r.errors
    );
}
