//! storage-audit's rule `unencrypted-scratch` on a scratch root of its own (ext4 made with
//! `mkfs.ext4 -O encrypt` on a loop device, removed after): of a tenant whose tier requires
//! encryption, the job folder made plain (live and retained) is reported, the encrypted one is
//! not; another tenant's plain folder is not either.
use tenancy_scratch::*;
use tenancy_storage_audit::*;
use tenancy_test_support::users::*;
use tenancy_test_support::{loopfs, requires_root};

fn spec(root: &std::path::Path, tenant: &str, g: &Group, u: &User, job: u64) -> ScratchSpec {
    ScratchSpec {
        root: root.to_path_buf(),
        tenant: tenant.into(),
        tenant_gid: g.gid,
        job_id: job,
        uid: u.uid,
        gid: u.gid,
        mode: 0o700,
        quota: None,
        tenant_groups: Vec::new(),
    }
}

#[test]
fn unencrypted_job_scratch_of_an_encrypted_tier_is_reported() {
    if !requires_root("a loop device, fscrypt") {
        return;
    }
    let (ga, gb) = (Group::new("ea"), Group::new("eb"));
    let (ua, ub) = (User::new("eua", &ga), User::new("eub", &gb));
    let dir = tempfile::tempdir().unwrap();
    let fs = loopfs::LoopFs::new(loopfs::Kind::Ext4Encrypt, &dir.path().join("scratch"), 64);
    let root = fs.mount.clone();
    let key = JobKey::generate().unwrap();
    create_encrypted(&spec(&root, "ta", &ga, &ua, 1), &key, None).unwrap();
    create(&spec(&root, "ta", &ga, &ua, 2)).unwrap();
    create(&spec(&root, "ta", &ga, &ua, 3)).unwrap();
    retain(
        &spec(&root, "ta", &ga, &ua, 3),
        std::time::SystemTime::now(),
    )
    .unwrap();
    create(&spec(&root, "tb", &gb, &ub, 4)).unwrap();
    let mut map = TenantMap::new();
    map.insert("ta", [ga.gid], [ua.uid]);
    map.insert("tb", [gb.gid], [ub.uid]);
    map.require_encrypted_scratch(&root, ["ta".to_string()]);
    let report = audit_paths(std::slice::from_ref(&root), &map, Some(1), false).unwrap();
    let found: Vec<String> = report
        .findings
        .iter()
        .filter(|f| f.rule == Rule::UnencryptedScratch)
        .map(|f| f.path.strip_prefix(&root).unwrap().display().to_string())
        .collect();
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].starts_with("ta/.retained/job_3."), "{found:?}");
    assert_eq!(found[1], "ta/job_2", "{found:?}");
    // Without the requirement, nothing of the kind.
    map.encrypted_scratch = None;
    let report = audit_paths(std::slice::from_ref(&root), &map, Some(1), false).unwrap();
    assert!(!report
        .findings
        .iter()
        .any(|f| f.rule == Rule::UnencryptedScratch));
    erase(&spec(&root, "ta", &ga, &ua, 1), key.id()).unwrap();
    trash::empty(&root, true).unwrap();
    drop(fs);
}
